"""`specdeploy inspect`: the quality report and the calibration record read as words, not dicts."""
import shutil

from specdeploy.bundle import manifest as manifest_io
from specdeploy.bundle.describe import describe


def test_quality_and_calibration_lines_read_as_words(tiny_bundle, tmp_path):
    bundle = tmp_path / "b.plan"
    shutil.copytree(tiny_bundle, bundle)
    m = manifest_io.read(bundle)
    quality = {"acceptance_rate": 0.2571, "greedy_identical": True, "perplexity": 26.64, "perplexity_fp32": 26.526,
               "plain_tokens_per_second": 43.98, "speculative_tokens_per_second": 45.32, "top1_agreement": 0.9711,
               "newer_measure": 3}
    calibration = {"chosen": {"exit_layer": 8, "num_draft_tokens": 4, "threshold": 0.4, "predicted_speedup": 1.123},
                   "measured_speedup": {"hybrid/4": 1.104, "early_exit/4": 0.982}}
    manifest_io.write(bundle, m.replace(quality=quality, calibration=calibration))
    lines = {line[:12].strip(): line[12:] for line in describe(bundle).splitlines()}
    assert lines["quality"] == ("top-1 agreement with fp32 97.1%, perplexity 26.64 (fp32 26.53), greedy speculative "
                                "== plain, acceptance 25.7%, plain 44.0 tok/s, speculative 45.3 tok/s, newer_measure=3")
    assert lines["calibration"] == ("chose exit layer 8, 4 draft tokens, threshold 0.4, predicted 1.12× plain; "
                                    "measured hybrid/4 1.10×, early_exit/4 0.98×")
    manifest_io.write(bundle, m.replace(quality={**quality, "greedy_identical": False}, calibration={"costs": {}}))
    lines = {line[:12].strip(): line[12:] for line in describe(bundle).splitlines()}
    assert "greedy speculative DIFFERS from plain" in lines["quality"]
    assert lines["calibration"] == "recorded (no choice)"
