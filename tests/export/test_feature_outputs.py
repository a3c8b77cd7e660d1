"""Feature outputs for a feature head: the draft and verify graphs also output the residual stream
entering chosen layers, validated with the rest, equal to Hugging Face's hidden states, and
without changing what the bundle decodes."""
import numpy as np
import pytest
import torch

from conftest import export_tiny
from distribution import CHI2_999_10DOF, histogram, homogeneity_chi2
from specdeploy.bundle import io_names
from specdeploy.bundle import manifest as manifest_io
from specdeploy.config import GenerationConfig
from specdeploy.errors import ConfigError
from specdeploy.export import ExportConfig
from specdeploy.runtime.engine import Engine
from specdeploy.runtime.stats import GenerationStats

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def feature_bundle(tmp_path_factory):
    return export_tiny("llama", tmp_path_factory.mktemp("features"), feature_layers=(4, 0, 1, 3, 2))


def test_each_graph_outputs_the_layers_whose_input_it_computes(feature_bundle):
    m = manifest_io.read(feature_bundle)
    assert m.feature_layers == (0, 1, 2, 3, 4)
    assert [o for o in m.graphs["draft"].outputs if o.startswith("feature.")] == ["feature.0", "feature.1"]
    assert [o for o in m.graphs["verify"].outputs if o.startswith("feature.")] == ["feature.3"]
    assert io_names.feature_output(2, 2, 4) == ("draft", "hidden_out")
    assert io_names.feature_output(4, 2, 4) == ("verify", "hidden_out")
    assert any(name.startswith("prefill.feature.") for name in m.extra["validation_max_abs_diff"])


def test_features_are_the_models_hidden_states(feature_bundle, tiny_model_dir):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = [3, 17, 42, 8, 9, 60]
    with torch.no_grad():
        want = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    with Engine(feature_bundle) as engine:
        split = engine.model
        split.verify_pass(split.draft_pass(ids, 0).copy(), 0)
        got = split.features()                                   # [S, 5, H]
    for slot, layer in enumerate(range(5)):
        expected = want[layer][0].numpy() if layer < 4 else None
        if expected is not None:
            np.testing.assert_allclose(got[:, slot], expected, rtol=1e-4, atol=1e-4)
    final = model.model.norm  # the last feature is the pre-norm final hidden state
    with torch.no_grad():
        np.testing.assert_allclose(final(torch.from_numpy(got[:, 4])).numpy(), want[4][0].numpy(),
                                   rtol=1e-4, atol=1e-4)


def test_decoding_is_unchanged(feature_bundle, tiny_bundle):
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    with Engine(feature_bundle) as with_features, Engine(tiny_bundle) as without:
        ids = [5, 6, 7, 5, 6, 7, 5]
        assert with_features.generate_ids(ids, config) == without.generate_ids(ids, config)
        plain = GenerationConfig(max_new_tokens=24, ignore_eos=True, speculative=False)
        assert with_features.generate_ids(ids, plain) == with_features.generate_ids(ids, config)


def test_a_layer_the_model_lacks_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"feature layers \[9\].*pick 0..4"):
        export_tiny("llama", tmp_path, feature_layers=(2, 9))
    assert ExportConfig(source=tmp_path, exit_layer=2, feature_layers=(3, 1, 3)).feature_layers == (1, 3)


def test_a_feature_head_joins_the_bundle_validated(head_bundle):
    bundle, _ = head_bundle
    m = manifest_io.read(bundle)
    assert m.feature_layers == (1, 2, 3)
    assert {"feature_fc", "feature_head"} <= set(m.graphs)
    assert m.graphs["feature_head"].kv_layers == (4, 5)
    diffs = m.extra["validation_max_abs_diff"]
    assert {"feature_head.logits", "feature_head.chained_logits", "feature_fc.hidden"} <= set(diffs)
    assert max(diffs.values()) < 1e-3


def test_the_head_graph_is_the_heads_forward(head_bundle):
    from specdeploy.feature_head import eagle3
    from specdeploy.feature_head.model import FeatureHead

    bundle, head_dir = head_bundle
    config, tensors = eagle3.read(head_dir)
    head = FeatureHead(config)
    head.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
    ids = [3, 17, 42, 8, 9]
    with Engine(bundle) as engine:
        split = engine.model
        split.verify_pass(split.draft_pass(ids, 0).copy(), 0)
        projected = split.project_features(split.features()).copy()
        logits, hidden = split.feature_head_pass(projected[:-1], ids[1:], 0)
        import transformers

        target = transformers.AutoModelForCausalLM.from_pretrained(bundle.parent / "llama-model").eval()
        embed = target.model.embed_tokens  # the target's table: the graph reads the same bytes
        with torch.no_grad():
            want_logits, want_hidden, _ = head(torch.from_numpy(projected[None, :-1]), embed(torch.tensor([ids[1:]])),
                                               torch.arange(4)[None])
        np.testing.assert_allclose(logits, want_logits[0].numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(hidden, want_hidden[0].numpy(), rtol=1e-4, atol=1e-4)
        speculative = GenerationConfig(max_new_tokens=16, ignore_eos=True)
        plain = GenerationConfig(max_new_tokens=16, ignore_eos=True, speculative=False)
        assert engine.generate_ids(ids, speculative) == engine.generate_ids(ids, plain)


def test_a_head_for_another_model_is_refused(tmp_path, head_config, head_tensors):
    from specdeploy.errors import ModelSourceError
    from specdeploy.feature_head import eagle3

    eagle3.write(tmp_path / "head", head_config, head_tensors)
    with pytest.raises(ModelSourceError, match="was not made for this model: .*hidden_size 32 .the model's: 64."):
        export_tiny("llama", tmp_path, feature_head=tmp_path / "head")


def test_feature_head_options_fail_in_one_line(tmp_path, tiny_model_dir, head_bundle):
    from click.testing import CliRunner

    from specdeploy.cli import main

    result = CliRunner().invoke(main, ["export", "--exit-layer", "2", str(tiny_model_dir), "--feature-head",
                                       str(tmp_path / "nothing"), "-o", str(tmp_path / "b")])
    assert result.exit_code != 0 and "not an EAGLE-3 head's directory" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("precision, method, tensorrt", [("int4", "gptq", False), ("int8", "rtn", True),
                                                         ("fp16", "rtn", False)])
def test_a_quantized_bundle_carries_its_head_in_its_precision(head_bundle, tmp_path, precision, method, tensorrt):
    """The head's graphs follow the draft graph's precision (GPTQ rounds them to nearest), with
    TensorRT's DequantizeLinear form beside them where asked; an integer head reads the embedding's
    quantized blocks, so no fp32 table is left; drafts and greedy identity hold as in fp32."""
    import onnx

    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    options = QuantizeOptions(precision, method=method, report=False, tensorrt=tensorrt)
    out = quantize(head_bundle[0], tmp_path / precision, options, echo=lambda line: None)
    graphs = manifest_io.read(out).graphs
    assert {graphs[n].precision for n in io_names.FEATURE_GRAPHS} == {precision}
    if tensorrt:
        forms = [onnx.load(str(out / graphs[n].tensorrt_file)) for n in io_names.FEATURE_GRAPHS]
        assert all(n.domain != "com.microsoft" for form in forms for n in form.graph.node)
    ops = {n.op_type for n in onnx.load(str(out / graphs[io_names.FEATURE_HEAD].file), load_external_data=False).graph.node}
    if precision != "fp16":
        assert {"MatMulNBits", "GatherBlockQuantized"} <= ops and "Gather" not in ops
        fp32 = sum(t.dims[0] * t.dims[1] * 4 for g in graphs.values() for t in onnx.load(
            str(out / g.file), load_external_data=False).graph.initializer if list(t.dims) == [96, 64]
            and t.data_type == onnx.TensorProto.FLOAT)
        assert fp32 == 0  # no graph reads the fp32 embedding table any more
    ids = [3, 17, 42, 8, 9, 60, 7]
    with Engine(out) as engine:
        engine.decoder.drafters["feature"].row_prices = lambda n: np.zeros(n)  # a random head: worth any row
        plain = engine.generate_ids(ids, GenerationConfig(max_new_tokens=12, ignore_eos=True, speculative=False))
        stats = GenerationStats()
        config = GenerationConfig(max_new_tokens=12, ignore_eos=True, draft_source="feature", num_draft_tokens=3)
        spec = [t for step in engine.decoder.generate(ids, config, stats) for t in step.tokens]
        assert spec == plain
        assert stats.by_source["feature"][1] > 0  # the quantized head drafted


def _torch_drafts(head_dir, model_dir, ids: list[int], pending: int, n: int) -> list[int]:
    """The head's greedy chain computed in PyTorch from the model's own hidden states."""
    import transformers

    from specdeploy.feature_head import eagle3
    from specdeploy.feature_head.model import FeatureHead

    config, tensors = eagle3.read(head_dir)
    head = FeatureHead(config)
    head.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
    target = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    vocab = tensors["d2t"] + np.arange(config.draft_vocab_size)
    with torch.no_grad():
        states = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
        feats = torch.cat([states[j] for j in config.feature_layers], -1)          # [1, P, 3H]
        embed = target.model.embed_tokens
        logits, hidden, past = head(head.fc(feats), embed(torch.tensor([ids[1:] + [pending]])),
                                    torch.arange(len(ids))[None])
        drafts = [int(vocab[logits[0, -1].argmax()])]
        for i in range(n - 1):
            logits, hidden, past = head(hidden[:, -1:], embed(torch.tensor([[drafts[-1]]])),
                                        torch.tensor([[len(ids) + i]]), past)
            drafts.append(int(vocab[logits[0, -1].argmax()]))
    return drafts


@pytest.mark.parametrize("chunk", [64, 3])
def test_feature_drafts_are_the_heads_and_greedy_output_is_plain(head_bundle, tiny_model_dir, chunk):
    bundle, head_dir = head_bundle
    ids = [3, 17, 42, 8, 9, 60, 7]
    with Engine(bundle, prefill_chunk=chunk) as engine:
        drafter = engine.decoder.drafters["feature"]
        drafter.row_prices = lambda n: np.zeros(n)  # every draft worth its row: the whole chain is drafted
        seen = []
        original = drafter.draft

        def spy(*args):
            out = original(*args)
            seen.append(list(out.tokens) if out else None)
            return out

        drafter.draft = spy
        plain = engine.generate_ids(ids, GenerationConfig(max_new_tokens=12, ignore_eos=True, speculative=False))
        spec = engine.generate_ids(ids, GenerationConfig(max_new_tokens=12, ignore_eos=True, draft_source="feature",
                                                         num_draft_tokens=3))
        assert spec == plain
        assert seen[0] == _torch_drafts(head_dir, tiny_model_dir, ids, plain[0], 3)
        assert all(s is not None for s in seen)  # the head stayed in step every round
        sampled = GenerationConfig(max_new_tokens=12, ignore_eos=True, draft_source="feature", temperature=1.0, seed=3)
        assert len(engine.generate_ids(ids, sampled)) == 12


def test_drafts_are_as_long_as_the_heads_confidence_pays_for(head_bundle):
    """At greedy the chain stops where the product of the head's confidences falls below the price
    of a row; output is plain's whatever the lengths."""
    ids, config = [3, 17, 42, 8, 9], GenerationConfig(max_new_tokens=16, ignore_eos=True, draft_source="feature",
                                                      num_draft_tokens=4)
    with Engine(head_bundle[0]) as engine:
        drafter = engine.decoder.drafters["feature"]
        plain = engine.generate_ids(ids, GenerationConfig(max_new_tokens=16, ignore_eos=True, speculative=False))
        lengths = {}
        for price in (0.0, 0.02, 1.01):  # a random head's top probability is ~0.05: products fall fast
            drafter.row_prices = lambda n, price=price: np.full(n, price)
            stats = GenerationStats()
            assert [t for s in engine.decoder.generate(ids, config, stats) for t in s.tokens] == plain
            rounds, drafted, _ = stats.by_source.get("feature", [0, 0, 0])
            lengths[price] = drafted / max(rounds, 1)
    assert lengths[0.0] > lengths[0.02] > 0 == lengths[1.01]  # nothing is surer than 1.01


def test_confidence_is_calibrated_and_rows_priced_by_timed_rounds():
    from specdeploy.runtime.copy_length import RowCosts
    from specdeploy.runtime.drafting import Draft
    from specdeploy.runtime.feature_drafting import UNPRICED_ROW, Calibration, FeatureDrafter

    calibration = Calibration(decay=1.0)
    for _ in range(99):
        calibration.add(np.array([0.8, 0.4]), accepted=1)  # the first borne out more often than predicted
    assert calibration.scale()[0] == pytest.approx(100 / 80.2) and calibration.scale()[1] == pytest.approx(1 / 40.6)
    drafter = FeatureDrafter.__new__(FeatureDrafter)  # its pricing only: no model behind it
    drafter.costs, drafter.calibration, drafter.chain = RowCosts(decay=1.0), calibration, np.zeros(8)
    assert list(drafter.row_prices(2)) == [UNPRICED_ROW] * 2
    for _ in range(4):
        drafter.observe(Draft([], None, None, "plain"), 0, 1.0)
        drafter.observe(Draft([5, 6], None, None, "feature"), 1, 1.5)
    assert drafter.row_prices(2) == pytest.approx([0.25, 0.25])  # three rows: 1.5 plain steps


def test_a_bundle_without_a_head_names_the_fix(tiny_engine):
    with pytest.raises(ConfigError, match="needs a feature head.*--feature-head"):
        tiny_engine.generate_ids([3, 4, 5], GenerationConfig(max_new_tokens=4, draft_source="feature"))


def test_feature_drafts_keep_the_sampling_distribution(head_bundle):
    """Drafts sampled from the head's q, accepted or corrected by rejection sampling: the tokens
    are distributed as plain sampling's."""
    with Engine(head_bundle[0]) as engine:
        plain = histogram(engine, [20, 21, 22], 500, temperature=1.0, speculative=False)
        spec = histogram(engine, [20, 21, 22], 500, temperature=1.0, draft_source="feature", num_draft_tokens=2)
        stats = GenerationStats()
        list(engine.decoder.generate([20, 21, 22], GenerationConfig(max_new_tokens=24, temperature=1.0, seed=1,
                                                                    draft_source="feature", ignore_eos=True), stats))
    assert homogeneity_chi2(plain, spec) < CHI2_999_10DOF
    assert 0 < stats.accepted < stats.drafted  # both acceptances and rejections were exercised


def test_the_hybrid_drafts_with_the_head_where_no_lookup_matches(head_bundle):
    with Engine(head_bundle[0]) as engine:
        engine.decoder.drafters["feature"].row_prices = lambda n: np.zeros(n)  # a random head: worth any row
        stats = GenerationStats()
        config = GenerationConfig(max_new_tokens=24, ignore_eos=True, draft_source="hybrid")
        spec = [t for step in engine.decoder.generate([3, 17, 42, 8], config, stats) for t in step.tokens]
        plain = engine.generate_ids([3, 17, 42, 8], GenerationConfig(max_new_tokens=24, ignore_eos=True,
                                                                     speculative=False))
    assert spec == plain
    assert stats.by_source.get("feature", [0])[0] >= 1  # probed: the head's rounds are measured


@pytest.mark.parametrize("head_gain, source", [(10.0, "feature"), (-10.0, "lookup")])
def test_the_hybrid_drafts_the_better_of_a_weak_copy_and_the_heads_chain(head_bundle, monkeypatch, head_gain, source):
    from specdeploy.runtime.drafting import HybridDrafter
    from specdeploy.runtime.feature_drafting import FeatureDrafter

    monkeypatch.setattr(HybridDrafter, "STRONG_COPY", 2.0)  # every copy counts as weak: the head is asked
    monkeypatch.setattr(FeatureDrafter, "row_prices", lambda self, n: np.zeros(n))
    monkeypatch.setattr(FeatureDrafter, "expected_gain", lambda self, drafted, prices: head_gain)
    chosen, rival = [], HybridDrafter._rival_chain

    def spy(self, *args):
        chain = rival(self, *args)
        chosen.append("feature" if chain else "lookup")
        return chain

    monkeypatch.setattr(HybridDrafter, "_rival_chain", spy)
    ids = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]  # copies on offer
    with Engine(head_bundle[0]) as engine:
        config = GenerationConfig(max_new_tokens=16, ignore_eos=True, draft_source="hybrid")
        spec = engine.generate_ids(ids, config)
        plain = engine.generate_ids(ids, GenerationConfig(max_new_tokens=16, ignore_eos=True, speculative=False))
    assert spec == plain
    assert chosen and set(chosen) == {source}  # every round with a copy on offer drafted the better one


def test_inspect_shows_the_head(head_bundle):
    from click.testing import CliRunner

    from specdeploy.cli import main

    result = CliRunner().invoke(main, ["inspect", str(head_bundle[0])])
    assert result.exit_code == 0, result.output
    assert "feature head reads layers 1, 2, 3" in result.output and "(40 draft tokens)" in result.output
    assert "feature_head" in result.output
    assert "held-out acceptance by draft position 0.50 0.25, tau 1.62 at gamma 2" in result.output


def test_a_streamed_export_keeps_the_heads_weights_in_the_shared_file(head_bundle, tmp_path):
    """From a safetensors source (read a tensor at a time), every large weight of every graph,
    the head's projection included, lives in the one weights file."""
    import onnx

    from specdeploy.export import export

    _, head_dir = head_bundle
    model_dir = head_bundle[0].parent / "llama-model"
    bundle = export(ExportConfig(source=model_dir, exit_layer=2, max_context=128, output=tmp_path / "b",
                                 feature_head=head_dir), echo=lambda line: None)
    for name in ("feature_fc", "feature_head", "draft", "verify"):
        graph = onnx.load(str(bundle / f"{name}.onnx"), load_external_data=False)
        inline = [t.name for t in graph.graph.initializer if len(t.raw_data) >= 1024]
        assert inline == [], (name, inline)


def test_bench_reports_the_heads_acceptance_by_position_and_its_share_of_a_step(head_bundle, tmp_path, monkeypatch):
    import json

    from specdeploy.bench.runner import BenchConfig, bench
    from specdeploy.runtime.feature_drafting import FeatureDrafter

    monkeypatch.setattr(FeatureDrafter, "row_prices", lambda self, n: np.zeros(n))  # a random head drafts

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"category": "chat", "prompt": "w3 w17 w42 w8"}))
    config = BenchConfig.quick(bundle=head_bundle[0], prompts_file=prompts, output_dir=tmp_path / "out",
                               temperatures=(0.0,), plots=False)
    results, _ = bench(config)
    assert "feature" in results["overall"]["0.0"]
    head = results["feature_head_ms"]
    assert 0 < head["head_call"] and 0 < head["projection"] and 0 < head["step"]
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "## acceptance by draft position" in markdown and "| feature | feature |" in markdown
    assert "Feature head: one call" in markdown
