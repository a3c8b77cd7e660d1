"""Fewer, larger kernels for the int4 / int8 graphs ONNX Runtime runs.

A one-token step of the example model was ~1400 kernel launches, half of its time outside the
quantized matmuls. Four rewrites, each keeping every row's arithmetic independent of how many rows
a call carries (the bundle's row check still decides):

* rotary embedding: HF's `x * cos + rotate_half(x) * sin` (two Slices, Neg, Concat, two Muls,
  Add) as one ONNX `RotaryEmbedding` (opset 23), only where the cos / sin tables are provably
  `concat(f, f)` of one frequency tensor (so their first half is the op's cache);
* residual + norm: `Add` feeding `RMSNormalization` as ONNX Runtime's
  `SkipSimplifiedLayerNormalization`, which also returns the sum the residual stream reads;
* sibling matmuls: MatMuls reading the same activation (q/k/v, gate/up) as one over the weights
  concatenated along N and a `Split`, before quantizing: one `MatMulNBits` quantizes the
  activation once;
* head split: that q/k/v Split's three Reshape → Transpose chains into heads as one Reshape →
  Transpose → Split on the head axis (the same values moved by three kernels instead of seven),
  after any per-part bias Adds (Qwen2) become one Add before the Split.

`tensorrt_form.unfuse` undoes the first two for TensorRT, which runs neither contrib op.
"""
from __future__ import annotations

import collections

import numpy as np

from .graph import MS_DOMAIN, array, attrs as _attrs, deferred, set_nodes, use_ms_domain

PASS_THROUGH = {"Cast", "Cos", "Sin", "Identity"}  # elementwise: equal halves stay equal


class _Graph:
    """Producers, consumers, constants and static shapes of one ONNX graph, by tensor name."""

    def __init__(self, model):

        self.model = model
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.consumers = collections.defaultdict(list)
        for node in model.graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.inits = {t.name: array(t) for t in model.graph.initializer
                      if np.prod(t.dims) <= 64}
        self.init_dims = {t.name: list(t.dims) for t in model.graph.initializer}
        self.shapes = {v.name: [d.dim_value or None for d in v.type.tensor_type.shape.dim]
                       for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]}
        self._values = {}

    def op(self, name: str, op_type: str):
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def value(self, name: str):
        """The tensor's value if it is computed from constants alone (small tensors), else None."""
        if name in self.inits:
            return self.inits[name]
        if name not in self._values:
            self._values[name] = self._evaluate(name)
        return self._values[name]

    def _evaluate(self, name: str):
        from onnx.reference import ReferenceEvaluator

        node = self.producer.get(name)
        if node is None:
            return None
        inputs = [self.value(i) if i else None for i in node.input]
        if any(v is None for v, i in zip(inputs, node.input) if i) or node.domain:
            return None
        feeds = {i: v for i, v in zip(node.input, inputs) if i}
        return ReferenceEvaluator(node).run(None, feeds)[list(node.output).index(name)]


def fuse_float(model) -> dict[str, int]:
    """The rewrites that do not touch weights (rotary, residual + norm), in place; how many of each."""
    counts = {"rotary": fuse_rotary(model), "skip_norm": fuse_skip_norms(model)}
    use_ms_domain(model, any(n.domain == MS_DOMAIN for n in model.graph.node))
    return counts


def fuse_all(model, kind=None) -> dict[str, int]:
    """Every rewrite here, in the order quantize makes them (before quantizing); how many of each.
    `kind`: see fuse_sibling_matmuls."""
    counts = fuse_float(model)
    counts["siblings"] = fuse_sibling_matmuls(model, kind)
    counts["split_biases"] = fuse_split_biases(model)
    counts["head_split"] = fuse_head_split(model)
    return counts


def _drop_dead(model, nodes) -> None:
    """Set the graph's nodes to `nodes` less those whose outputs nothing reads."""
    outputs = {o.name for o in model.graph.output}
    nodes = list(nodes)
    while True:
        read = {i for n in nodes for i in n.input} | outputs
        live = [n for n in nodes if any(o in read for o in n.output if o)]
        if len(live) == len(nodes):
            break
        nodes = live
    set_nodes(model, nodes)


# ---- rotary embedding ------------------------------------------------------------------------

def _slice_range(g: _Graph, node, rank: int):
    """(start, end) of a one-axis, step-1 Slice over the last axis, else None."""
    values = [g.value(i) if i else None for i in node.input[1:5]]
    starts, ends = values[0], values[1]
    axes = values[2] if len(values) > 2 and values[2] is not None else np.array([rank - 1])
    steps = values[3] if len(values) > 3 and values[3] is not None else np.array([1])
    if starts is None or ends is None or np.size(starts) != 1 or np.size(axes) != 1 or int(np.ravel(steps)[0]) != 1:
        return None
    if int(np.ravel(axes)[0]) % rank != rank - 1:
        return None
    return int(np.ravel(starts)[0]), int(np.ravel(ends)[0])


def _duplicated_table(g: _Graph, name: str):
    """`name` if its values are `concat(f, f)` on the last axis through elementwise ops, else None."""
    current = name
    while True:
        node = g.producer.get(current)
        if node is None:
            return None
        if node.op_type in PASS_THROUGH:
            current = node.input[0]
        elif node.op_type == "Mul" and any(np.size(g.value(i)) == 1 for i in node.input if g.value(i) is not None):
            current = next(i for i in node.input if g.value(i) is None)
        elif node.op_type == "Concat" and len(node.input) == 2 and node.input[0] == node.input[1]:
            rank = len(g.shapes[current]) if current in g.shapes else None
            return name if _attrs(node)["axis"] in (-1, rank and rank - 1) else None
        else:
            return None


def _table(g: _Graph, name: str):
    """The [B, S, D] table behind a [B, 1, S, D] broadcast cos / sin, if it is duplicated halves."""
    node = g.op(name, "Unsqueeze")
    axes = g.value(node.input[1]) if node is not None and len(node.input) == 2 else None
    if axes is None or np.ravel(axes).tolist() != [1]:
        return None
    return _duplicated_table(g, node.input[0])


def _rotation(g: _Graph, rot: str, x: str, dim: int) -> bool:
    """`rot` is rotate_half(x): concat(-x[..., d/2:], x[..., :d/2]) on the last axis."""
    concat = g.op(rot, "Concat")
    if concat is None or len(concat.input) != 2 or _attrs(concat)["axis"] not in (-1, 3):
        return False
    neg, first = g.op(concat.input[0], "Neg"), g.op(concat.input[1], "Slice")
    second = g.op(neg.input[0], "Slice") if neg is not None else None
    if first is None or second is None or first.input[0] != x or second.input[0] != x:
        return False
    half = dim // 2
    low, high = _slice_range(g, first, 4), _slice_range(g, second, 4)
    return low == (0, half) and high is not None and high[0] == half and high[1] >= dim


def _rotary_match(g: _Graph, add):
    """(x, cos table, sin table) if `add` is x * cos + rotate_half(x) * sin over [B, N, S, D]."""
    muls = [g.op(i, "Mul") for i in add.input]
    if len(muls) != 2 or None in muls:
        return None
    for plain, rotated in (muls, muls[::-1]):
        for x, cos in (plain.input, plain.input[::-1]):
            shape = g.shapes.get(x)
            if not shape or len(shape) != 4 or not shape[-1] or shape[-1] % 2:
                continue
            for rot, sin in (rotated.input, rotated.input[::-1]):
                if _rotation(g, rot, x, shape[-1]):
                    tables = _table(g, cos), _table(g, sin)
                    return (x, *tables) if None not in tables else None
    return None


def fuse_rotary(model) -> int:
    """Every HF rotate-half rotary embedding as ONNX RotaryEmbedding (opset 23) over half tables."""
    from onnx import helper, numpy_helper

    g = _Graph(model)
    halves, nodes, count = {}, [], 0
    for node in model.graph.node:
        match = _rotary_match(g, node) if node.op_type == "Add" else None
        if match is None:
            nodes.append(node)
            continue
        x, cos, sin = match
        half = g.shapes[x][-1] // 2
        for table in (cos, sin):
            if table not in halves:
                halves[table] = f"{table}.half"
                bounds = [f"{table}.half.{k}" for k in ("starts", "ends", "axes")]
                for bound, v in zip(bounds, (0, half, -1)):
                    model.graph.initializer.append(numpy_helper.from_array(np.array([v], np.int64), bound))
                nodes.append(helper.make_node("Slice", [table, *bounds], [halves[table]], name=f"{table}.half"))
        nodes.append(helper.make_node("RotaryEmbedding", [x, halves[cos], halves[sin]], list(node.output),
                                      name=node.name + ".rotary"))
        count += 1
    _drop_dead(model, nodes)
    return count


# ---- residual add + RMS norm -----------------------------------------------------------------

def fuse_skip_norms(model) -> int:
    """Add(a, b) -> RMSNormalization over the last axis as one SkipSimplifiedLayerNormalization."""
    from onnx import helper

    g = _Graph(model)
    by_add, norms = {}, set()  # Add output -> the fused node that replaces it; the norms it absorbs
    for norm in model.graph.node:
        add = g.op(norm.input[0], "Add") if norm.op_type == "RMSNormalization" else None
        attrs = _attrs(norm)
        if add is None or add.output[0] in by_add or attrs.get("axis", -1) != -1 or len(norm.input) != 2:
            continue
        shapes = [g.shapes.get(i) for i in add.input]
        if None in shapes or shapes[0] != shapes[1] or any(g.value(i) is not None for i in add.input):
            continue
        by_add[add.output[0]] = helper.make_node(
            "SkipSimplifiedLayerNormalization", [*add.input, norm.input[1]], [norm.output[0], "", "", add.output[0]],
            name=norm.name + ".skip", domain=MS_DOMAIN, epsilon=attrs.get("epsilon", 1e-5))
        norms.add(id(norm))
    set_nodes(model, [by_add.get(n.output[0], n) if n.op_type == "Add" else n for n in model.graph.node
                      if id(n) not in norms])
    return len(norms)


# ---- sibling matmuls ---------------------------------------------------------------------------

def fuse_sibling_matmuls(model, kind=None) -> int:
    """Float MatMuls reading one activation with initializer weights [K, N] as one MatMul over the
    weights concatenated along N and a Split; run before quantizing, so the quantizer (and a GGUF's
    blocks, matched per column) makes one MatMulNBits whose columns are the separate ones'.
    `kind(W [K, N])`: siblings of different kinds all stay apart (a GGUF's Q4_K q / k beside a Q6_K
    v: fused, no kernel would carry the file's blocks of both; apart, not q / k fused beside v, the
    attention fusion still finds q, k and v)."""
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    readers = collections.defaultdict(list)
    for node in model.graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is not None and len(weight.dims) == 2:
            readers[node.input[0], weight.dims[0]].append(node)
    groups = {key: nodes for key, nodes in readers.items()
              if len(nodes) > 1 and not (kind and len({kind(array(inits[n.input[1]])) for n in nodes}) > 1)}
    replaced = {}
    for (x, _), siblings in groups.items():
        name = siblings[0].name + ".fused"
        weights = [inits[n.input[1]] for n in siblings]                                   # [K, N_i]
        joined = lambda ws=weights: np.concatenate([array(w) for w in ws], axis=1)  # noqa: E731  # [K, sum N_i]
        model.graph.initializer.extend([
            deferred(name + ".weight", [weights[0].dims[0], sum(w.dims[1] for w in weights)],
                     helper.tensor_dtype_to_np_dtype(weights[0].data_type), joined),
            numpy_helper.from_array(np.array([w.dims[1] for w in weights], np.int64), name + ".split")])
        matmul = helper.make_node("MatMul", [x, name + ".weight"], [name + ".out"], name=name)
        split = helper.make_node("Split", [name + ".out", name + ".split"], [n.output[0] for n in siblings],
                                 name=name + ".split", axis=-1)
        replaced[id(siblings[0])] = [matmul, split]
        replaced.update({id(n): [] for n in siblings[1:]})
    set_nodes(model, [m for n in model.graph.node for m in replaced.get(id(n), [n])])
    return len(groups)


def fuse_split_biases(model) -> int:
    """A Split on the last axis whose every part is read only by an Add of a constant 1-D bias of
    that part's width (Qwen2's q / k / v after fuse_sibling_matmuls) as one Add of the biases
    concatenated, before the Split: the same sums element by element, and the parts then go
    straight into heads (fuse_head_split). Returns how many Splits were rewritten."""
    from onnx import helper, numpy_helper

    g, inits = _Graph(model), {t.name: t for t in model.graph.initializer}
    placed, gone = {}, set()
    for split in [n for n in model.graph.node if n.op_type == "Split" and len(n.input) == 2]:
        adds = [bias_add(g, inits, name) for name in split.output]
        sizes = g.value(split.input[1])
        if not all(adds) or sizes is None or _attrs(split).get("axis") not in (-1, 2) or \
                [a[1].size for a in adds] != [int(v) for v in sizes]:
            continue
        name = split.name + ".bias"
        model.graph.initializer.append(numpy_helper.from_array(np.concatenate([a[1] for a in adds]), name))
        added = helper.make_node("Add", [split.input[0], name], [name + ".sum"], name=name)
        parts = helper.make_node("Split", [name + ".sum", split.input[1]], [a[0].output[0] for a in adds],
                                 name=split.name, axis=-1)
        placed[id(split)] = [added, parts]
        gone |= {id(a[0]) for a in adds}
    nodes = [m for n in model.graph.node if id(n) not in gone for m in placed.get(id(n), [n])]
    _drop_dead(model, _topological(model, nodes))
    return len(placed)


def bias_add(g: _Graph, inits: dict, name: str):
    """(Add, bias [N]) when `name` is read only by an Add of a constant 1-D float initializer (also
    quantization/operators.fuse_biases)."""

    readers = g.consumers.get(name, [])
    add = readers[0] if len(readers) == 1 and readers[0].op_type == "Add" else None
    other = add and [i for i in add.input if i != name]
    if not other or len(other) != 1 or other[0] not in inits or len(inits[other[0]].dims) != 1:
        return None
    bias = array(inits[other[0]])
    return (add, bias) if bias.dtype == np.float32 else None


def fuse_head_split(model) -> int:
    """A fused q/k/v matmul's Split into three Reshape [B, S, H_i, D] → Transpose [B, H_i, S, D]
    chains (seven kernels) as one Reshape [B, S, ΣH_i, D] → Transpose → Split on the head axis
    (three), where the three reshapes provably make heads of one size D from the split sizes: the
    same values moved, in fewer kernels a layer. Returns how many Splits were rewritten."""
    from onnx import helper, numpy_helper

    g, placed, gone = _Graph(model), {}, set()
    for split in [n for n in model.graph.node if n.op_type == "Split" and len(n.input) == 2]:
        chains = [_head_chain(g, name) for name in split.output]
        sizes, dims = g.value(split.input[1]), {c[2] for c in chains if c}
        ranks = {len(g.shapes.get(name) or []) for name in split.output}  # [B, S, N_i], as [0, 0, -1, D] reads
        axis = _attrs(split).get("axis")
        if not all(chains) or sizes is None or len(dims) != 1 or ranks != {3} or axis not in (-1, 2):
            continue
        dim, widths = dims.pop(), [int(v) for v in sizes]
        if any(width % dim or c[3] not in (-1, width // dim) for c, width in zip(chains, widths)):
            continue
        name = split.name + ".heads"
        model.graph.initializer.extend([
            numpy_helper.from_array(np.array([0, 0, -1, dim], np.int64), name + ".shape"),
            numpy_helper.from_array(np.array(widths, np.int64) // dim, name + ".sizes")])
        placed[id(chains[-1][1])] = [
            helper.make_node("Reshape", [split.input[0], name + ".shape"], [name + ".rows"], name=name + ".rows"),
            helper.make_node("Transpose", [name + ".rows"], [name + ".t"], perm=[0, 2, 1, 3], name=name + ".t"),
            helper.make_node("Split", [name + ".t", name + ".sizes"], [c[1].output[0] for c in chains], axis=1,
                             name=name)]
        gone |= {id(split), *(id(c[0]) for c in chains), *(id(c[1]) for c in chains[:-1])}
    nodes = [m for n in model.graph.node if id(n) not in gone for m in placed.get(id(n), [n])]
    _drop_dead(model, _topological(model, nodes))  # the three shape computations go too
    return len(placed)


def _head_chain(g: _Graph, name: str):
    """(Reshape, Transpose, D, H) when `name` is read only by a Reshape to [B, S, H, D] (D and H
    constants, H maybe -1) read only by a Transpose [0, 2, 1, 3]; else None."""
    readers = g.consumers.get(name, [])
    reshape = readers[0] if len(readers) == 1 and readers[0].op_type == "Reshape" else None
    shape = reshape and g.op(reshape.input[1], "Concat")
    if shape is None or len(shape.input) != 4:
        return None
    heads, dim = (g.value(i) for i in shape.input[2:])
    after = g.consumers.get(reshape.output[0], [])
    if heads is None or dim is None or heads.size != 1 or dim.size != 1 or len(after) != 1:
        return None
    transpose = after[0]
    if transpose.op_type != "Transpose" or list(_attrs(transpose).get("perm", [])) != [0, 2, 1, 3]:
        return None
    return reshape, transpose, int(dim.item()), int(heads.item())


def _topological(model, nodes: list) -> list:
    """`nodes` ordered so that every input is made before it is read."""
    ready = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer} | {""}
    order, pending = [], list(nodes)
    while pending:
        waiting = []
        for node in pending:
            if all(i in ready for i in node.input):
                order.append(node)
                ready.update(node.output)
            else:
                waiting.append(node)
        if len(waiting) == len(pending):
            raise ValueError(f"graph has a cycle or an unmade input at {waiting[0].name}")
        pending = waiting
    return order
