"""int4 matmuls in blocks of 32 never handed one row alone: bitwise rows on CPUs whose one-row kernel differs."""
from pathlib import Path

import numpy as np
import onnx
import pytest
from exactness import assert_early_exit_equals_plain

from specdeploy.bundle import manifest as manifest_io
from specdeploy.quantization import nbits, two_rows
from specdeploy.quantization.compute import ComputeOptions
from specdeploy.quantization.options import QuantizeOptions
from specdeploy.quantization.quantize import quantize
from specdeploy.runtime.engine import Engine

K, N = 256, 96


def _cpu_flags() -> set:
    info = Path("/proc/cpuinfo")
    return set(info.read_text().split()) if info.is_file() else set()


def _nbits_model(readers: int = 1, bits: int = 4):
    """`readers` MatMulNBits (blocks of 32) over one input x [1, S, K], outputs y0, y1, ..."""
    from onnx import TensorProto, helper, numpy_helper

    rng, nodes, inits, outputs = np.random.default_rng(3), [], [], []
    for i in range(readers):
        blocks = nbits.quantize(rng.normal(size=(K, N)).astype(np.float32), bits, 32, "absmax")
        b, scales = nbits.pack(blocks)
        inits += [numpy_helper.from_array(b, f"b{i}"), numpy_helper.from_array(scales, f"s{i}")]
        nodes.append(helper.make_node("MatMulNBits", ["x", f"b{i}", f"s{i}"], [f"y{i}"], name=f"m{i}",
                                      domain="com.microsoft", K=K, N=N, bits=bits, block_size=32, accuracy_level=4))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, None, N]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, K])],
                              outputs, inits)
    opsets = [helper.make_opsetid("", 24), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _run(model, x):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_the_probe_finds_what_each_form_needs_on_this_cpu():
    """8 bits, and 4 in blocks of 16, are row-independent as they are everywhere measured; 4 in
    blocks of 32 with AVX-512 VNNI too, and on AVX2 alone from two rows."""
    assert two_rows.kernel_rows(8, 32) == 1 and two_rows.kernel_rows(4, 16) == 1
    flags = _cpu_flags()
    if "avx512_vnni" in flags:
        assert two_rows.kernel_rows(4, 32) == 1
    elif "avx2" in flags and "avx512f" not in flags:
        assert two_rows.kernel_rows(4, 32) == 2 and two_rows.kernel_rows(4, 32, zero_points=True) == 2
    assert two_rows.kernel_rows(4, 32) in (1, 2)


def test_padded_rows_are_bitwise_the_same_whatever_a_call_carries():
    """Padded, each row of a call is bitwise the row computed alone, and the unpadded kernel's row
    from calls of two rows or more; one Pad serves every node reading the input."""
    x = np.random.default_rng(4).normal(size=(1, 5, K)).astype(np.float32)          # [1, S, K]
    plain, padded = _nbits_model(readers=2), _nbits_model(readers=2)
    assert two_rows.pad_rows(padded, needs=lambda node: 2) == 2
    ops = [n.op_type for n in padded.graph.node]
    assert ops.count("Pad") == 1 and ops.count("Slice") == 2
    many = _run(padded, x)
    alone = [np.concatenate(parts, axis=1) for parts in zip(*(_run(padded, x[:, i:i + 1]) for i in range(5)))]
    for y_many, y_alone, y_plain in zip(many, alone, _run(plain, x)):
        assert y_many.shape == (1, 5, N)
        np.testing.assert_array_equal(y_many, y_alone)
        np.testing.assert_array_equal(y_many, y_plain)  # calls of 6 rows and of 5: the same kernel


def test_nodes_the_kernel_keeps_independent_are_left_alone_and_padding_undoes():
    model = _nbits_model(bits=8)
    assert two_rows.pad_rows(model) == 0 and [n.op_type for n in model.graph.node] == ["MatMulNBits"]
    assert two_rows.pad_rows(_nbits_model(), two_rows.policy(False)) == 0
    model = _nbits_model(readers=2)
    assert two_rows.pad_rows(model, two_rows.policy(True)) == 2
    assert two_rows.unpad(model) == 2
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits"] * 2
    assert [tuple(n.input) for n in model.graph.node] == [("x", "b0", "s0"), ("x", "b1", "s1")]
    assert [tuple(n.output) for n in model.graph.node] == [("y0",), ("y1",)]


@pytest.mark.parametrize("asked", [None, True])
def test_an_int4_bundle_in_blocks_of_32_passes_the_row_check_and_decodes_exactly(tiny_bundle, tmp_path, asked):
    """Left to the probe (None) the bundle is in blocks of 32 on any CPU measured, padded where the
    one-row kernel differs; asked for always (a bundle for AVX2 devices made anywhere), padded here
    too. Either way every graph passes the row check and greedy speculative output is plain's."""
    lines = []
    out = quantize(tiny_bundle, tmp_path / "int4", QuantizeOptions(
        "int4", method="rtn", report=False, compute=ComputeOptions(two_rows=asked, int4_kernel="matmulnbits")),
        echo=lines.append)
    m = manifest_io.read(out)
    assert m.extra["int4_block_size"] == 32 and m.row_check["passed"]
    padded = m.extra.get("two_row_matmuls", {})
    if asked or two_rows.kernel_rows(4, 32) == 2:
        assert padded["draft"] > 0 and padded["verify"] > 0 and not padded.get("head")  # the head is 8-bit
        assert any("matmuls handed a padded second row" in line for line in lines)
        from specdeploy.bundle.describe import describe

        assert "two rows    " in describe(out) and "read a padded second row" in describe(out)
    else:
        assert not padded
    with Engine(out) as engine:
        assert_early_exit_equals_plain(engine)


def test_never_padding_falls_back_to_blocks_of_16_where_the_kernel_needs_it(tiny_bundle, tmp_path):
    if two_rows.kernel_rows(4, 32) != 2:
        pytest.skip("this CPU's one-row int4 kernel in blocks of 32 is the multi-row one's")
    out = quantize(tiny_bundle, tmp_path / "int4", QuantizeOptions(
        "int4", method="rtn", report=False, compute=ComputeOptions(two_rows=False, int4_kernel="matmulnbits")), echo=lambda line: None)
    m = manifest_io.read(out)
    assert m.extra["int4_block_size"] == 16 and "two_row_matmuls" not in m.extra


def test_the_tensorrt_form_of_a_padded_bundle_takes_its_own_rows(tiny_bundle, tmp_path):
    """TensorRT's kernels are not ONNX Runtime's: its form of a padded graph (folded offsets too) has
    no Pad, no MatMulNBits, and reads each matmul's own input."""
    compute = ComputeOptions(two_rows=True, fused_attention=False, int4_kernel="matmulnbits")
    out = quantize(tiny_bundle, tmp_path / "int4", QuantizeOptions("int4", method="minmax", report=False,
                                                                   tensorrt=True, compute=compute),
                   echo=lambda line: None)
    m = manifest_io.read(out)
    trt = onnx.load(str(out / m.graph("verify").tensorrt_file), load_external_data=False)
    ops = {n.op_type for n in trt.graph.node}
    assert "MatMulNBits" not in ops and "Pad" not in ops and "DequantizeLinear" in ops
    assert not any(name.endswith(".two_rows") for n in trt.graph.node for name in n.input)
