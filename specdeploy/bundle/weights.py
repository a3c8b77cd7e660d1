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
    Each graph is loaded without its external data and each tensor's bytes read memory-mapped from
    its file when copied, so a large graph is never in memory whole. Needs `onnx` (the export
    extra): only exporting and quantizing write weights.
    """
    import onnx

    with SharedFile(out_dir / weights_file) as blob:
        for name, src in graphs.items():
            model = onnx.load(str(src), load_external_data=False)
            for tensor in _external_tensors(model):
                data = _bytes(tensor, Path(src).parent)
                if len(data) < INLINE_LIMIT:
                    if tensor.data_location == onnx.TensorProto.EXTERNAL:  # a small one kept inside
                        _inline(tensor, data)
                    continue
                point(tensor, weights_file, *blob.add(data, tensor.data_type))
                del data
            onnx.save(model, str(out_dir / f"{name}.onnx"))
    return blob.sizes()


class SharedFile:
    """The shared weights file being written: each distinct tensor's bytes once (by content and
    type), at an ALIGNMENT boundary; `add` returns where a tensor's bytes are."""

    def __init__(self, path: Path):
        self._file = open(path, "wb")
        self._offsets: dict[str, tuple[int, int]] = {}
        self.written = self.referenced = 0

    def add(self, data, data_type: int) -> tuple[int, int]:
        """(offset, length) of `data` (a buffer of raw bytes) in the file, written if not yet there."""
        self.referenced += len(data)
        digest = hashlib.sha256(data).hexdigest() + str(data_type)
        if digest not in self._offsets:
            self._file.write(b"\0" * ((-self._file.tell()) % ALIGNMENT))
            self._offsets[digest] = (self._file.tell(), len(data))
            self._file.write(data)
            self.written += len(data)
        return self._offsets[digest]

    def sizes(self) -> dict[str, int]:
        return {"written": self.written, "referenced": self.referenced}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


def _bytes(tensor, base: Path) -> memoryview:
    """A tensor's raw little-endian bytes: from its external file (memory-mapped), else its fields."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        offset, length = int(info.get("offset", 0)), info.get("length")
        mapped = np.memmap(base / info["location"], dtype=np.uint8, mode="r", offset=offset,
                           shape=(int(length),) if length else None)
        return memoryview(mapped)
    if tensor.HasField("raw_data"):
        return memoryview(tensor.raw_data)
    return memoryview(numpy_helper.to_array(tensor).tobytes())


def _inline(tensor, data) -> None:
    import onnx

    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = bytes(data)


def point(tensor, weights_file: str, offset: int, length: int) -> None:
    """`tensor`'s data becomes bytes [offset, offset + length) of `weights_file`."""
    import onnx

    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "raw_data"):
        tensor.ClearField(field)
    del tensor.external_data[:]
    for key, value in (("location", weights_file), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))
    tensor.data_location = onnx.TensorProto.EXTERNAL


def graph_bytes(graph: Path) -> int:
    """Bytes of the weights `graph` reads from external files (the graph file itself not counted)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    return sum(int({e.key: e.value for e in t.external_data}.get("length", 0))
               for t in _external_tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL)
