"""Small helpers every ONNX graph rewrite shares: node attributes, replacing the node list, the
contrib-op domain."""
from __future__ import annotations

import contextlib
import contextvars
from pathlib import Path
from typing import Callable

import numpy as np

MS_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib ops (MatMulNBits, GatherBlockQuantized)


def attrs(node) -> dict:
    """A node's attributes by name, as Python values."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def set_nodes(model, nodes) -> None:
    """The graph's nodes become `nodes`; initializers no node reads any more are dropped."""
    nodes = list(nodes)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {i for n in model.graph.node for i in n.input}
    for t in [t for t in model.graph.initializer if t.name not in used]:
        model.graph.initializer.remove(t)


def use_ms_domain(model, used: bool = True) -> None:
    """Declare (or, with used=False, drop) the com.microsoft opset the contrib ops need."""
    from onnx import helper

    kept = [o for o in model.opset_import if o.domain != MS_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept + ([helper.make_opsetid(MS_DOMAIN, 1)] if used else []))


# A graph's weights read only when a rewrite asks for them (quantization/compute.py): the graph is
# loaded without its external data, an external initializer is read memory-mapped from its file,
# and a rewritten weight (a transpose folded, siblings concatenated) is a placeholder computed when
# read. A large model's fp32 graph is then never in memory at once: each weight is read, rounded to
# its blocks and dropped. Outside `lazy_weights`, `array` and `deferred` are plain reads and writes.
_LAZY = contextvars.ContextVar("lazy_weights", default=None)


@contextlib.contextmanager
def lazy_weights(base: Path):
    """Inside: initializers of graphs loaded from `base` without external data are read when asked."""
    token = _LAZY.set((Path(base), {}))
    try:
        yield
    finally:
        _LAZY.reset(token)


def array(tensor) -> np.ndarray:
    """An initializer's values (read-only where memory-mapped)."""
    from onnx import TensorProto, helper, numpy_helper

    lazy = _LAZY.get()
    if lazy is not None and not tensor.HasField("raw_data"):
        base, placeholders = lazy
        if tensor.name in placeholders:
            return placeholders[tensor.name]()
        if tensor.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
            return np.memmap(base / info["location"], dtype=dtype, mode="r", offset=int(info.get("offset", 0)),
                             shape=tuple(tensor.dims))
    return numpy_helper.to_array(tensor)


def deferred(name: str, dims, dtype, values: Callable[[], np.ndarray]):
    """An initializer computed when read (inside `lazy_weights`; outside, at once)."""
    from onnx import TensorProto, helper, numpy_helper

    lazy = _LAZY.get()
    if lazy is None:
        return numpy_helper.from_array(np.ascontiguousarray(values()), name)
    lazy[1][name] = values
    return TensorProto(name=name, dims=list(dims), data_type=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def materialize(model) -> None:
    """Every initializer of `model` still a placeholder or in the file it was loaded from, read into
    the graph (before it is saved elsewhere: what is left is small, norms and biases, or what a
    rewrite that needs it whole, ONNX Runtime's own quantizer, will read)."""
    from onnx import TensorProto, numpy_helper

    lazy = _LAZY.get()
    if lazy is None:
        return
    for i, tensor in enumerate(model.graph.initializer):
        if not tensor.HasField("raw_data") and (tensor.name in lazy[1] or tensor.data_location == TensorProto.EXTERNAL):
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array(tensor)),
                                                                        tensor.name))
