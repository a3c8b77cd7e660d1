"""One shared external-data file for all graphs, deduplicated by content.

Exporters give folded weights anonymous names that differ between graphs, so identity is the
tensor's bytes, never its name. A tied LM head and embedding, or the LM head used by both head
graphs, is therefore stored once.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

ALIGNMENT = 64 * 1024  # lets ONNX Runtime memory-map tensors straight from the file
INLINE_LIMIT = 1024    # tensors smaller than this stay inside the graph file


def _external_tensors(model):
    import onnx

    yield from model.graph.initializer
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t


def share(graphs: dict[str, Path], out_dir: Path, weights_file: str) -> dict[str, int]:
    """Rewrite each graph in `graphs` into `out_dir` pointing into one deduplicated weights file.

    Returns byte counts {"written": ..., "referenced": ...} so callers can report the saving.
    Needs `onnx` (the export extra): only exporting and quantizing write weights.
    """
    import onnx
    from onnx import external_data_helper, numpy_helper

    offsets: dict[str, tuple[int, int]] = {}
    written = referenced = 0
    with open(out_dir / weights_file, "wb") as blob:
        for name, src in graphs.items():
            model = onnx.load(str(src), load_external_data=True)
            for tensor in _external_tensors(model):
                data = numpy_helper.to_array(tensor).tobytes()
                if len(data) < INLINE_LIMIT:
                    continue
                referenced += len(data)
                digest = hashlib.sha256(data).hexdigest() + str(tensor.data_type)
                if digest not in offsets:
                    pad = (-blob.tell()) % ALIGNMENT
                    blob.write(b"\0" * pad)
                    offsets[digest] = (blob.tell(), len(data))
                    blob.write(data)
                    written += len(data)
                offset, length = offsets[digest]
                for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                              "external_data"):
                    tensor.ClearField(field)
                tensor.raw_data = data  # set_external_data requires the raw_data field
                external_data_helper.set_external_data(tensor, weights_file, offset, length)
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
            onnx.save(model, str(out_dir / f"{name}.onnx"))
    return {"written": written, "referenced": referenced}
