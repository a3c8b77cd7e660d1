"""The real GPU paths; skipped cleanly where no GPU / TensorRT / onnxruntime-gpu exists."""
import shutil

import numpy as np
import pytest

from specdeploy.config import GenerationConfig
from specdeploy.quantization.quality import teacher_forced_logits
from specdeploy.runtime.engine import Engine


def _compare(bundle, **backend):
    prompt = [int(t) for t in np.random.default_rng(0).integers(2, 96, 10)]
    cfg = dict(max_new_tokens=24, ignore_eos=True)
    with Engine(bundle) as cpu, Engine(bundle, **backend) as gpu:
        diff = np.abs(teacher_forced_logits(cpu, prompt) - teacher_forced_logits(gpu, prompt)).max()
        plain = gpu.generate_ids(prompt, GenerationConfig(speculative=False, **cfg))
        spec = gpu.generate_ids(prompt, GenerationConfig(num_draft_tokens=4, **cfg))
    return diff, plain, spec


@pytest.mark.gpu
@pytest.mark.tensorrt
def test_native_tensorrt_matches_onnxruntime_cpu(tiny_bundle, tmp_path):
    from specdeploy.backends.tensorrt.build import BuildConfig, build_engines

    bundle = tmp_path / "trt"
    shutil.copytree(tiny_bundle, bundle)
    build_engines(bundle, BuildConfig(max_draft_tokens=6, max_prompt=64), echo=print)
    diff, plain, spec = _compare(bundle, backend="tensorrt")
    assert diff < 1e-2 and spec == plain


@pytest.mark.gpu
def test_onnxruntime_cuda_provider_matches_cpu(tiny_bundle):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed")
    diff, plain, spec = _compare(tiny_bundle, provider="cuda")
    assert diff < 1e-3 and spec == plain
