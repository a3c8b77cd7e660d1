"""RMSNormalization as standard operators (for TensorRT before 10.14) computes what the fused node does."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specdeploy.optimize.decompose import rms_norms

pytestmark = pytest.mark.unit


def rms_model(dtype=TensorProto.FLOAT):
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, 16).astype(np.float32 if dtype == TensorProto.FLOAT
                                                                     else np.float16), "scale")
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], epsilon=1e-6, axis=-1, name="norm")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, [2, 3, 16])],
                              [helper.make_tensor_value_info("y", dtype, [2, 3, 16])], [scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("dtype, np_type, tol", [(TensorProto.FLOAT, np.float32, 1e-6),
                                                 (TensorProto.FLOAT16, np.float16, 2e-3)])
def test_the_standard_operators_compute_the_fused_node(dtype, np_type, tol):
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np_type)
    fused = rms_model(dtype)
    expected = run(fused, x)
    model = rms_model(dtype)
    assert rms_norms(model) == 1
    assert "RMSNormalization" not in {n.op_type for n in model.graph.node}
    onnx.checker.check_model(model)
    assert np.allclose(run(model, x).astype(np.float32), expected.astype(np.float32), rtol=tol, atol=tol)


def test_a_chunked_sequence_becomes_one_split():
    from specdeploy.optimize.decompose import sequence_splits

    nodes = [helper.make_node("SplitToSequence", ["x", "size"], ["seq"], axis=-1),
             helper.make_node("SequenceAt", ["seq", "one"], ["b"]),
             helper.make_node("SequenceAt", ["seq", "zero"], ["a"]),
             helper.make_node("Sub", ["a", "b"], ["y"])]
    inits = [numpy_helper.from_array(np.array(8, np.int64), "size"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    expected = run(model, x)
    assert sequence_splits(model) == 1
    assert {n.op_type for n in model.graph.node} == {"Split", "Sub"}
    assert np.array_equal(run(model, x), expected)


def test_a_slice_read_twice_is_left_as_a_sequence():
    from specdeploy.optimize.decompose import sequence_splits

    nodes = [helper.make_node("SplitToSequence", ["x", "size"], ["seq"], axis=-1),
             helper.make_node("SequenceAt", ["seq", "zero"], ["a"]),
             helper.make_node("SequenceAt", ["seq", "zero"], ["b"]),
             helper.make_node("Sub", ["a", "b"], ["y"])]
    inits = [numpy_helper.from_array(np.array(8, np.int64), "size"), numpy_helper.from_array(np.array(0, np.int64), "zero")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    assert sequence_splits(model) == 0 and len(model.graph.node) == 4
