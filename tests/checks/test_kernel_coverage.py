"""Bundles for the GPU targets use only operators with a kernel there, by the targets' real tables
(ONNX Runtime GPU's CUDA registry, TensorRT's ONNX parser list), and the check finds what has none."""
import pytest

from specdeploy.checks import kernel_coverage as kc
from specdeploy.quantization.compute import ComputeOptions
from specdeploy.quantization.options import QuantizeOptions
from specdeploy.quantization.quantize import quantize

CUDA = kc.table("onnxruntime-gpu-1.31.1-cuda.json")
TENSORRT = kc.table("tensorrt-10.16-onnx-parser.json")


def node(op, version, types=(), domain="ai.onnx", expandable=False):
    return kc.Node("g", domain, op, version, tuple(types), (), expandable)


def test_tables_name_their_source_and_version():
    for name in ("onnxruntime-gpu-1.31.1-cuda.json", "tensorrt-10.16-onnx-parser.json", "tensorrt-10.1-onnx-parser.json"):
        t = kc.table(name)
        assert t["source"] and t["version"]
    assert CUDA["provider"] == "CUDAExecutionProvider" and CUDA["version"] == "1.31.1"


def test_an_open_ended_kernel_matches_only_its_own_version_as_onnx_runtime_does():
    table = {"version": "x", "provider": "P", "kernels": [
        {"domain": "ai.onnx", "op": "Foo", "since": [13, None], "types": {"T": ["tensor(float)"]}},
        {"domain": "ai.onnx", "op": "Foo", "since": [7, 12], "types": {"T": ["tensor(float)"]}}]}
    assert kc.missing_onnxruntime([node("Foo", 13, [("T", "tensor(float)")])], table) == []
    assert kc.missing_onnxruntime([node("Foo", 9, [("T", "tensor(float)")])], table) == []
    (later,) = kc.missing_onnxruntime([node("Foo", 14, [("T", "tensor(float)")])], table)
    assert "13+, 7-12 only" in later.reason
    (wrong,) = kc.missing_onnxruntime([node("Foo", 13, [("T", "tensor(bool)")])], table)
    assert "types" in wrong.reason


def test_real_gaps_in_the_real_tables():
    gqa = node("GroupQueryAttention", 1, [("T", "tensor(float)"), ("M", "tensor(int32)")], "com.microsoft")
    assert kc.missing_onnxruntime([gqa], CUDA)  # float16 and bfloat16 only on CUDA
    tile = node("Tile", 13, [("T", "tensor(bool)"), ("T1", "tensor(int64)")])
    assert kc.missing_onnxruntime([tile], CUDA)
    assert kc.missing_tensorrt([node("MatMulNBits", 1, [("T1", "tensor(float)")], "com.microsoft")], TENSORRT)
    assert kc.missing_tensorrt([node("TensorScatter", 24, [("T", "tensor(float)")])],
                               kc.table("tensorrt-10.1-onnx-parser.json"))
    assert not kc.missing_onnxruntime([node("CastLike", 24, expandable=True), node("Constant", 24)], CUDA)


def quantized(bundle, tmp_path, name, **options):
    compute = ComputeOptions(**{k: options.pop(k) for k in ("int4_kernel", "fused_attention") if k in options})
    return quantize(bundle, tmp_path / name, QuantizeOptions("int4", compute=compute, report=False, **options),
                    echo=lambda s: None)


@pytest.mark.integration  # quantizes: not the fast tier
def test_the_gpu_forms_have_every_kernel(tiny_bundle, tmp_path):
    assert kc.check(tiny_bundle, "cuda") == []                                          # fp32
    cuda = quantized(tiny_bundle, tmp_path, "cuda", int4_kernel="matmulnbits", fused_attention=False)
    assert kc.summary(kc.check(cuda, "cuda")) == []
    tensorrt = quantized(tiny_bundle, tmp_path, "trt", int4_kernel="matmulnbits", tensorrt=True)
    assert kc.summary(kc.check(tensorrt, "tensorrt")) == []


@pytest.mark.integration  # quantizes: not the fast tier
def test_the_cpu_form_is_named_for_what_cuda_lacks(tiny_bundle, tmp_path):
    cpu = quantized(tiny_bundle, tmp_path, "cpu")  # specdeploy's operators, fused float32 attention
    lines = kc.summary(kc.check(cpu, "cuda"))
    assert any("GroupQueryAttention" in line for line in lines)
    assert any(line.startswith("specdeploy") or "specdeploy" in line for line in lines)
