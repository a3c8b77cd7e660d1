"""Small helpers every ONNX graph rewrite shares: node attributes, replacing the node list, the
contrib-op domain."""
from __future__ import annotations

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
