"""The int4 / int8 graph fusions: each computes what it replaces, and only where it provably does."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specdeploy.optimize import fusion
from specdeploy.quantization import tensorrt_form

RNG = np.random.default_rng(0)
HEADS, ROWS, DIM = 2, 3, 8


def _int64(model, name, values):
    model.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
    return name


def _rotary_graph(duplicated: bool = True):
    """x * cos + rotate_half(x) * sin as the exporter writes it; cos / sin from concat(f, f) or not."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, HEADS, ROWS, DIM])
    f = helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, ROWS, DIM // 2 if duplicated else DIM])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, HEADS, ROWS, DIM])
    graph = helper.make_graph([], "rotary", [x, f], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    table = ["emb"] if duplicated else ["f"]
    nodes = [helper.make_node("Concat", ["f", "f"], ["emb"], axis=-1)] if duplicated else []
    one, half, big, last = (_int64(model, n, v) for n, v in
                            (("one", [1]), ("half", [DIM // 2]), ("big", [2 ** 62]), ("last", [-1])))
    zero = _int64(model, "zero", [0])
    nodes += [
        helper.make_node("Cos", table, ["cos"]), helper.make_node("Sin", table, ["sin"]),
        helper.make_node("Unsqueeze", ["cos", one], ["cos4"]), helper.make_node("Unsqueeze", ["sin", one], ["sin4"]),
        helper.make_node("Slice", ["x", zero, half, last], ["x1"]),
        helper.make_node("Slice", ["x", half, big, last], ["x2"]),
        helper.make_node("Neg", ["x2"], ["neg"]), helper.make_node("Concat", ["neg", "x1"], ["rot"], axis=-1),
        helper.make_node("Mul", ["x", "cos4"], ["a"]), helper.make_node("Mul", ["rot", "sin4"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    model.graph.node.extend(nodes)
    return model


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _rotary_feeds(duplicated=True):
    width = DIM // 2 if duplicated else DIM
    return {"x": RNG.standard_normal((1, HEADS, ROWS, DIM), dtype=np.float32),
            "f": RNG.standard_normal((1, ROWS, width), dtype=np.float32)}


def test_rotary_becomes_one_op_computing_the_same_and_unfuses_back():
    model, feeds = _rotary_graph(), _rotary_feeds()
    expected = _run(model, feeds)[0]
    fused = onnx.ModelProto.FromString(model.SerializeToString())
    assert fusion.fuse_rotary(fused) == 1
    assert {n.op_type for n in fused.graph.node} == {"Concat", "Cos", "Sin", "Slice", "RotaryEmbedding"}
    np.testing.assert_allclose(_run(fused, feeds)[0], expected, atol=1e-6)
    assert tensorrt_form.unfuse(fused) == 1 and "RotaryEmbedding" not in {n.op_type for n in fused.graph.node}
    np.testing.assert_allclose(_run(fused, feeds)[0], expected, atol=1e-6)


def test_rotary_over_tables_not_known_to_repeat_their_halves_is_left_alone():
    model = _rotary_graph(duplicated=False)
    assert fusion.fuse_rotary(model) == 0
    assert "RotaryEmbedding" not in {n.op_type for n in model.graph.node}


def test_residual_add_and_norm_fuse_and_unfuse():
    shape = [1, ROWS, DIM]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("a", "b")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("y", "s")]
    weight = numpy_helper.from_array(RNG.standard_normal(DIM).astype(np.float32), "w")
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("RMSNormalization", ["s", "w"], ["y"], axis=-1, epsilon=1e-5)]
    model = helper.make_model(helper.make_graph(nodes, "norm", ins, outs, [weight]),
                              opset_imports=[helper.make_opsetid("", 24)])
    feeds = {n: RNG.standard_normal(shape, dtype=np.float32) for n in ("a", "b")}
    expected = _run(model, feeds)
    fused = onnx.ModelProto.FromString(model.SerializeToString())
    assert fusion.fuse_float(fused) == {"rotary": 0, "skip_norm": 1}
    assert [n.op_type for n in fused.graph.node] == ["SkipSimplifiedLayerNormalization"]
    for got, want in zip(_run(fused, feeds), expected):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert tensorrt_form.unfuse(fused) == 1
    assert [n.op_type for n in fused.graph.node] == ["Add", "RMSNormalization"]


@pytest.mark.parametrize("bits, block", [(4, 16), (4, 32), (8, 32)])
def test_sibling_matmuls_become_one_whose_columns_are_bitwise_the_same(bits, block):
    """Fused before quantizing, q/k/v-like siblings become one MatMulNBits and a Split whose outputs
    are bitwise those of the siblings quantized one by one."""
    from specdeploy.quantization import compute

    k, widths = 64, (48, 16, 16)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS, k])
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(len(widths))]
    model = helper.make_model(helper.make_graph([], "siblings", [x], outs),
                              opset_imports=[helper.make_opsetid("", 24), helper.make_opsetid("com.microsoft", 1)])
    for i, n in enumerate(widths):
        model.graph.initializer.append(numpy_helper.from_array(RNG.standard_normal((k, n)).astype(np.float32), f"w{i}"))
        model.graph.node.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"m{i}"))
    form = compute.ComputeForm(bits=bits, block_size=block)
    separate = onnx.ModelProto.FromString(model.SerializeToString())
    compute._own_blocks(separate, form, "absmax")
    assert fusion.fuse_sibling_matmuls(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Split"]
    compute._own_blocks(model, form, "absmax")
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits", "Split"]
    feeds = {"x": RNG.standard_normal((1, ROWS, k), dtype=np.float32)}
    for got, want in zip(_run(model, feeds), _run(separate, feeds)):
        np.testing.assert_array_equal(got, want)


def test_siblings_of_different_kinds_stay_apart():
    """q and k of one kind beside v of another (a GGUF's Q6_K beside Q4_K): all three keep their own
    MatMul (each the file's blocks; q, k, v apart as attention fusion knows them); gate / up of one
    kind still fuse."""
    k = 64
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS, k])
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(3)]
    model = helper.make_model(helper.make_graph([], "siblings", [x], outs), opset_imports=[helper.make_opsetid("", 24)])
    for i, n in enumerate((32, 16, 16)):
        model.graph.initializer.append(numpy_helper.from_array(np.full((k, n), float(i == 2), np.float32), f"w{i}"))
        model.graph.node.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"m{i}"))
    assert fusion.fuse_sibling_matmuls(model, kind=lambda w: float(w[0, 0])) == 0
    assert [n.input[1] for n in model.graph.node] == ["w0", "w1", "w2"]
    assert fusion.fuse_sibling_matmuls(model, kind=lambda w: 0.0) == 1
    assert sorted(n.op_type for n in model.graph.node) == ["MatMul", "Split"]


def _heads_graph(perm=(0, 2, 1, 3)):
    """A fused q/k/v output [1, S, (4 + 2 + 2) * 8] split and reshaped into heads as the exporter
    writes it: per part a Reshape to [B, S, H, D] (B and S read off the input) and a Transpose."""
    heads, dim = (4, 2, 2), 8
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, sum(heads) * dim])
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(3)]
    model = helper.make_model(helper.make_graph([], "heads", [x], outs), opset_imports=[helper.make_opsetid("", 24)])
    sizes, d = _int64(model, "sizes", [h * dim for h in heads]), _int64(model, "d", [dim])
    nodes = [helper.make_node("Split", ["x", sizes], ["p0", "p1", "p2"], axis=-1, name="qkv.split"),
             helper.make_node("Shape", ["x"], ["batch"], start=0, end=1),
             helper.make_node("Shape", ["x"], ["rows"], start=1, end=2)]
    for i, h in enumerate(heads):
        nodes += [helper.make_node("Concat", ["batch", "rows", _int64(model, f"h{i}", [h]), d], [f"s{i}"], axis=0),
                  helper.make_node("Reshape", [f"p{i}", f"s{i}"], [f"r{i}"]),
                  helper.make_node("Transpose", [f"r{i}"], [f"y{i}"], perm=list(perm) if i == 2 else [0, 2, 1, 3])]
    model.graph.node.extend(nodes)
    model.graph.value_info.extend(helper.make_tensor_value_info(f"p{i}", TensorProto.FLOAT, [1, None, h * dim])
                                  for i, h in enumerate(heads))  # as the exporter records the q/k/v outputs
    return model


def test_head_split_moves_the_same_values_in_three_kernels_instead_of_seven():
    model = _heads_graph()
    x = RNG.normal(size=(1, 5, 64)).astype(np.float32)
    want = _run(model, {"x": x})
    assert fusion.fuse_head_split(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert sorted(ops) == ["Reshape", "Split", "Transpose"]
    for got, expected in zip(_run(model, {"x": x}), want):
        np.testing.assert_array_equal(got, expected)


def test_head_split_leaves_a_chain_it_cannot_prove_alone():
    model = _heads_graph(perm=(0, 2, 3, 1))  # one part transposed otherwise
    assert fusion.fuse_head_split(model) == 0 and len(model.graph.node) == 12
    unknown = _heads_graph()
    del unknown.graph.value_info[:]  # the parts' rank unknown: [0, 0, -1, D] might not read [B, S, N]
    assert fusion.fuse_head_split(unknown) == 0


def _biased_split_graph(constant_biases: bool = True):
    """x @ W split in three parts, each plus its own bias (Qwen2's q / k / v after the sibling fusion)."""
    widths = [8, 4, 4]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS, 6])
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, ROWS, w]) for i, w in enumerate(widths)]
    inputs = [x] + ([] if constant_biases else [helper.make_tensor_value_info("b2", TensorProto.FLOAT, [4])])
    graph = helper.make_graph([], "biased", inputs, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    model.graph.initializer.append(numpy_helper.from_array(RNG.standard_normal((6, 16), dtype=np.float32), "w"))
    for i, w in enumerate(widths[: 3 if constant_biases else 2]):
        model.graph.initializer.append(numpy_helper.from_array(RNG.standard_normal(w, dtype=np.float32), f"b{i}"))
    sizes = _int64(model, "sizes", widths)
    model.graph.node.extend([helper.make_node("MatMul", ["x", "w"], ["xw"]),
                             helper.make_node("Split", ["xw", sizes], ["p0", "p1", "p2"], axis=-1, name="split")]
                            + [helper.make_node("Add", [f"p{i}", f"b{i}"], [f"y{i}"]) for i in range(3)])
    return model


def test_per_part_biases_become_one_add_before_the_split_bitwise():
    model = _biased_split_graph()
    feeds = {"x": RNG.standard_normal((1, ROWS, 6), dtype=np.float32)}
    expected = _run(model, feeds)
    assert fusion.fuse_split_biases(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add", "Split"]
    for got, want in zip(_run(model, feeds), expected):
        np.testing.assert_array_equal(got, want)
    unfused = _biased_split_graph(constant_biases=False)  # one bias is an input: left alone
    assert fusion.fuse_split_biases(unfused) == 0 and len(unfused.graph.node) == 5
