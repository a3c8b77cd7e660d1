"""What each weight matmul of a graph multiplies, over calibration feeds.

The calibrators that look at activations (outlier channels, GPTQ's Gram matrices) run the fp32
graph once per feed with every weight matmul's input exposed as an output.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import numpy as np


def matmul_inputs(model) -> set[str]:
    """Activations that a MatMul multiplies by an initializer (or by an initializer's Transpose)."""
    weights = {t.name for t in model.graph.initializer}
    weights |= {n.output[0] for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in weights}
    return {n.input[0] for n in model.graph.node
            if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in weights}


def matmul_activations(graph_file: Path, feeds: list[Callable[[], dict]]) -> Iterator[dict[str, np.ndarray]]:
    """Per feed, every weight matmul's input by name, as rows [rows, K]."""
    return (inputs for inputs, _ in graph_activations(graph_file, feeds))


def graph_activations(graph_file: Path, feeds: list[Callable[[], dict]], outputs: tuple[str, ...] = ()
                      ) -> Iterator[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Per feed, (every weight matmul's input as rows [rows, K], the graph's `outputs` as it returns
    them): the pass that exposes a graph's inputs also makes what the next graph is fed."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(graph_file), load_external_data=False)
    inputs = sorted(matmul_inputs(model))
    declared = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                              for name in inputs if name not in declared)
    wanted = inputs + [name for name in outputs if name not in inputs]
    probe = graph_file.with_name(f".activations-{graph_file.name}")  # beside it: its external data resolves
    onnx.save(model, str(probe))
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(probe), options, providers=["CPUExecutionProvider"])
        for make in feeds:
            values = dict(zip(wanted, session.run(wanted, make())))
            yield ({name: values[name].reshape(-1, values[name].shape[-1]) for name in inputs},
                   {name: values[name] for name in outputs})
    finally:
        probe.unlink()
