"""Every supported family's CUDA and TensorRT forms have a kernel for every operator, on the real tables."""
import pytest

from specdeploy.checks import kernel_coverage as kc
from specdeploy.quantization.options import QuantizeOptions, for_target
from specdeploy.quantization.quantize import quantize

pytestmark = pytest.mark.integration  # an export a family: not the fast tier


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3_text", "phi3"])
def test_gpu_forms_of_each_family_have_every_kernel(arch, tmp_path, export_tiny_for):
    fp32 = export_tiny_for(arch, tmp_path)
    assert kc.summary(kc.check(fp32, "cuda")) == []
    for target in ("cuda", "tensorrt"):  # jetson-orin needs an opset-23 export: tests/export/test_targets.py
        options = for_target(QuantizeOptions("int4", method="rtn", report=False), target)
        out = quantize(fp32, tmp_path / target, options, echo=lambda s: None)
        assert kc.summary(kc.check(out, target)) == [], (arch, target)
