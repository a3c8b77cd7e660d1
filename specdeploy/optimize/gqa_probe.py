"""Whether this machine's `GroupQueryAttention` keeps the fused attention's rows independent, and
whether a bundle being quantized gets the fused form at all.

The fused form (attention.py) hands the kernel m rows plus a padded zero row; its contract is that
each of those m rows is bitwise what a call of that one row plus the padded one computes. ONNX
Runtime 1.32's CPU kernel keeps it on the machine measured (AVX-512; its one-row path, which
differs, is never taken), but kernels are chosen per CPU, so a probe on random inputs decides
before a bundle is built with it; the bundle's row check then covers the whole graphs, here and
at load elsewhere.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .attention import OP, kernel_attributes
from .attention_match import KernelForm
from .graph import MS_DOMAIN


def _probe_session(form: KernelForm, rows: int):
    import onnxruntime as ort
    from onnx import TensorProto as T, helper

    widths = [(form.q_heads + 2 * form.kv_heads) * form.head_dim] if form.packed else \
        [form.q_heads * form.head_dim] + [form.kv_heads * form.head_dim] * 2
    names = ["qkv"] if form.packed else ["q", "k", "v"]
    tables = ["cos", "sin"] if form.rotary else []
    node = helper.make_node(OP, [*names, *[""] * (3 - len(names)), "past_key", "past_value", "seqlens_k", "total",
                                 *tables], ["out", "present_key", "present_value"], domain=MS_DOMAIN,
                            **kernel_attributes(form))
    kv = [1, form.kv_heads, rows, form.head_dim]
    graph = helper.make_graph([node], "probe", [
        *(helper.make_tensor_value_info(n, T.FLOAT, [1, "S", w]) for n, w in zip(names, widths)),
        helper.make_tensor_value_info("past_key", T.FLOAT, kv), helper.make_tensor_value_info("past_value", T.FLOAT, kv),
        helper.make_tensor_value_info("seqlens_k", T.INT32, [1]), helper.make_tensor_value_info("total", T.INT32, []),
        *(helper.make_tensor_value_info(n, T.FLOAT, [rows, form.head_dim // 2]) for n in tables)], [
        helper.make_tensor_value_info("out", T.FLOAT, [1, "S", form.q_heads * form.head_dim]),
        helper.make_tensor_value_info("present_key", T.FLOAT, kv),
        helper.make_tensor_value_info("present_value", T.FLOAT, kv)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    session_options = ort.SessionOptions()
    session_options.log_severity_level = 3  # a refused configuration is an answer here, not an error to print
    return ort.InferenceSession(model.SerializeToString(), session_options, providers=["CPUExecutionProvider"]), widths


def form_row_independent(form: KernelForm) -> bool:
    """`kernel_row_independent` for one layer's form (what attention.fuse_attention asks)."""
    return kernel_row_independent(**dataclasses.asdict(form))


@functools.lru_cache(maxsize=None)
def kernel_row_independent(q_heads: int, kv_heads: int, head_dim: int, packed: bool = True, softcap: float = 0.0,
                           window: int = 0, rotary: bool = True, seed: int = 0) -> bool:
    """Whether this machine's GroupQueryAttention gives, for m rows plus the padded one, bitwise the
    rows that m calls of one row plus the padded one give (random inputs, three key lengths, past a
    window where there is one) — the fused form's contract, checked before a bundle is built with
    it (the bundle's row check then checks the whole graphs)."""
    import onnxruntime as ort

    form = KernelForm(q_heads, kv_heads, head_dim, packed, softcap, window, rotary)
    rows, rng = 128, np.random.default_rng(seed)
    session, widths = _probe_session(form, rows)
    names = [i.name for i in session.get_inputs()][:len(widths)]
    angles = np.arange(rows)[:, None] * 10000.0 ** (-np.arange(0, head_dim, 2) / head_dim)[None]
    tables = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)} if rotary else {}

    def call(kv, xs, start):  # xs: per input [1, S, width] -> [1, S, Hq D], with the zero row padded after
        binding = session.io_binding()
        binding.bind_output("out")
        for name, value in zip(("key", "value"), kv):
            binding.bind_ortvalue_input("past_" + name, value)
            binding.bind_ortvalue_output("present_" + name, value)
        padded = [np.concatenate([x, np.zeros((1, 1, x.shape[2]), np.float32)], axis=1) for x in xs]
        end = start + padded[0].shape[1]
        feeds = {**dict(zip(names, padded)), "seqlens_k": np.array([end - 1], np.int32),
                 "total": np.array(end, np.int32), **tables}
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        session.run_with_iobinding(binding)  # raises for shapes the kernel refuses (head_dim % 16)
        return binding.copy_outputs_to_cpu()[0][:, :-1]

    def compare(length: int, m: int) -> bool:
        prefix, xs = ([rng.standard_normal((1, n, w)).astype(np.float32) for w in widths] for n in (length, m))
        results = []
        for split in (False, True):
            kv = [ort.OrtValue.ortvalue_from_numpy(np.zeros((1, kv_heads, rows, head_dim), np.float32)) for _ in range(2)]
            call(kv, prefix, 0)
            results.append(np.concatenate([call(kv, [x[:, i:i + 1] for x in xs], length + i) for i in range(m)], axis=1)
                           if split else call(kv, xs, length))
        return np.array_equal(*results)

    try:
        return all(compare(length, m) for length, m in ((5, 2), (40, 3), (90, 5)))
    except Exception:  # ONNX Runtime's own types: a configuration its kernel refuses
        return False


def window_probe_model():
    """The one-node model backends/attention_window.py runs to learn how this ONNX Runtime counts a
    window (shipped as backends/gqa_window_probe.onnx; a test checks the file is this model)."""
    from onnx import TensorProto as T, helper

    from ..backends.attention_window import PROBE_ROWS, PROBE_WINDOW

    rows = [1, PROBE_ROWS, 16]
    node = helper.make_node(OP, ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total"],
                            ["out", "present_key", "present_value"], domain=MS_DOMAIN, num_heads=1,
                            kv_num_heads=1, local_window_size=PROBE_WINDOW)
    cache = [1, 1, PROBE_ROWS, 16]
    graph = helper.make_graph([node], "window_probe", [
        *(helper.make_tensor_value_info(n, T.FLOAT, rows) for n in "qkv"),
        helper.make_tensor_value_info("past_key", T.FLOAT, cache), helper.make_tensor_value_info("past_value", T.FLOAT, cache),
        helper.make_tensor_value_info("seqlens_k", T.INT32, [1]), helper.make_tensor_value_info("total", T.INT32, [])], [
        helper.make_tensor_value_info("out", T.FLOAT, rows),
        helper.make_tensor_value_info("present_key", T.FLOAT, cache),
        helper.make_tensor_value_info("present_value", T.FLOAT, cache)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 10  # ONNX Runtime 1.23 (Python 3.10) reads IR 11 at most
    return model


def unfused_reason(manifest, plan: dict, compute_forms, options, tensorrt: bool) -> str | None:
    """Why the bundle's attention stays op by op (None: it is fused where a layer's form allows).
    `plan`: precision per graph; `options`: compute.ComputeOptions."""
    if not options.fuse:
        return "unfused graphs, as asked (--no-fuse)"
    if not options.fused_attention:
        return "as asked (--attention ops)"
    if tensorrt:
        return "the TensorRT form is made from these graphs, and TensorRT has no GroupQueryAttention"
    if any(g.kv_layers and plan[name] not in compute_forms for name, g in manifest.graphs.items()):
        return "a graph with KV buffers stays in float, and every such graph must take the same buffers"
    return None
