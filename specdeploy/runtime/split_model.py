"""The split model as the decoding loop sees it: draft passes, verify passes, and logits.

It owns the positional feeds (positions, write index, attention mask) as preallocated arrays, so a
decode step builds its inputs from views and allocates nothing. It never knows the backend.
"""
from __future__ import annotations

import numpy as np

from ..bundle import io_names
from ..errors import ContextLengthError
from ..bundle.manifest import Manifest


class SplitModel:
    def __init__(self, manifest: Manifest, stages: dict):
        self.manifest, self.stages = manifest, stages
        self.max_context = manifest.max_context
        self.draft_stage = stages[io_names.DRAFT]
        self.verify_stage = stages[io_names.VERIFY]
        self.head_stage = stages[io_names.HEAD]
        self.draft_head_stage = stages.get(io_names.DRAFT_HEAD, self.head_stage)
        # rows one pass may carry: the context, or less where a backend was built for fewer
        # (TensorRT profiles); checked before a generation starts
        limits = [getattr(stage, "max_rows", None) for stage in stages.values()]
        self.max_rows = min([n for n in limits if n] or [self.max_context])
        self._positions = np.arange(self.max_context, dtype=np.int64)[None, :]  # [1, N]
        self._ones = np.ones((1, self.max_context), dtype=np.int64)            # [1, N]
        self._write_index = np.zeros(1, dtype=np.int64)                        # [1]
        self._ids = np.zeros((1, self.max_context), dtype=np.int64)            # [1, N]
        self.kept = 0  # KV rows [0, kept) hold the decoder's history: no pass has written there since
        self.fixed_rows: int | None = None  # every pass carries this many rows (GPU kernels: set_fixed_rows)
        self.outputs: dict[str, dict] = {}  # each decoder graph's last outputs (views until its next pass)
        self.after_verify = None  # called with (start, rows) after each verify pass (a feature head's drafter)
        width = (self.max_rows, len(manifest.feature_layers), manifest.model.hidden_size)
        self._features = np.zeros(width, np.float32) if manifest.feature_layers else None  # [R, 3, H]

    def _positional(self, start: int, rows: int) -> dict[str, np.ndarray]:
        if start + rows > self.max_context:
            raise ContextLengthError(
                f"sequence of {start + rows} tokens exceeds the bundle's max context "
                f"{self.max_context}; shorten the prompt or max_tokens, or re-export with a larger --max-context"
            )
        self._write_index[0] = start
        self.kept = min(self.kept, start)  # this pass writes rows [start, start + rows)
        return {
            io_names.POSITION_IDS: self._positions[:, start : start + rows],
            io_names.WRITE_INDEX: self._write_index,
            io_names.ATTENTION_MASK: self._ones[:, : start + rows],
        }

    def set_fixed_rows(self, rows: int) -> None:
        """Carry exactly `rows` rows in every pass from now on, the rows past a pass's own padded
        (the last token repeated, zero hidden rows) and their outputs dropped.

        The identity rule for GPU kernels: cuBLAS and TensorRT may pick another reduction order for
        another row count, so a verify row is bitwise the one-row step only if both carry the same
        rows. Padded rows sit after the pass's own, where causal attention keeps them from the real
        rows, and their KV rows lie past the valid length, invisible and overwritten like rejected
        drafts. Within the last `rows` positions of the context a pass carries what is left."""
        self.fixed_rows = rows

    def _carried(self, rows: int, start: int) -> int:
        if self.fixed_rows is None or rows >= self.fixed_rows:
            return rows
        return max(rows, min(self.fixed_rows, self.max_context - start))

    def _ids_for(self, tokens, carried: int) -> np.ndarray:
        ids = self._ids[:, :carried]                                            # [1, R]
        ids[0, : len(tokens)] = tokens
        ids[0, len(tokens):] = tokens[-1]
        return ids

    @staticmethod
    def _padded(hidden: np.ndarray, carried: int) -> np.ndarray:
        if carried == hidden.shape[0]:
            return hidden[None]
        out = np.zeros((1, carried, hidden.shape[1]), hidden.dtype)           # [1, R, H]
        out[0, : hidden.shape[0]] = hidden
        return out

    @staticmethod
    def _own(outputs: dict, rows: int, carried: int) -> dict:
        """A pass's outputs for its own rows (views; the outputs as they are where nothing was padded)."""
        if carried == rows:
            return outputs
        return {name: value[:, :rows] if value.ndim >= 2 else value for name, value in outputs.items()}

    def draft_pass(self, tokens, start: int) -> np.ndarray:
        """Draft graph over `tokens` written at rows [start, start+S): returns h_k [S, H]."""
        rows = len(tokens)
        carried = self._carried(rows, start)
        feeds = {io_names.INPUT_IDS: self._ids_for(tokens, carried), **self._positional(start, carried)}
        self.outputs[io_names.DRAFT] = self._own(self.draft_stage.run(feeds), rows, carried)
        return self.outputs[io_names.DRAFT][io_names.HIDDEN_OUT][0]

    def verify_pass(self, hidden: np.ndarray, start: int) -> np.ndarray:
        """Verify graph over h_k rows [S, H] at rows [start, start+S): final hidden [S, H]."""
        rows = hidden.shape[0]
        carried = self._carried(rows, start)
        feeds = {io_names.HIDDEN_IN: self._padded(hidden, carried), **self._positional(start, carried)}
        self.outputs[io_names.VERIFY] = self._own(self.verify_stage.run(feeds), rows, carried)
        if self.after_verify is not None:
            self.after_verify(start, rows)
        return self.outputs[io_names.VERIFY][io_names.HIDDEN_OUT][0]

    def features(self) -> np.ndarray:
        """[S, 3, H] the feature layers' inputs for the rows of the last draft and verify passes
        (which must have carried the same rows), in the manifest's order."""
        m = self.manifest
        rows = [self.outputs[graph][name][0] for graph, name in
                (io_names.feature_output(j, m.exit_layer, m.model.num_layers) for j in m.feature_layers)]
        return np.stack(rows, 1, out=self._features[: rows[0].shape[0]])  # written in place: no per-pass allocation

    def project_features(self, features: np.ndarray) -> np.ndarray:
        """A feature head's input [S, H] from features [S, 3, T] (the feature_fc graph)."""
        rows = features.shape[0]
        flat = self._padded(features.reshape(rows, -1), self._carried(rows, 0))
        return self.stages[io_names.FEATURE_FC].run({io_names.FEATURES: flat})[io_names.HIDDEN_OUT][0, :rows]

    def feature_head_pass(self, hidden: np.ndarray, tokens, start: int) -> tuple[np.ndarray, np.ndarray]:
        """The feature head over rows [start, start+S): each row's hidden [S, H] (projected features
        or its own output) with the token after it. Returns (draft logits [S, V'], hidden out [S, H])."""
        rows = len(tokens)
        carried = self._carried(rows, start)
        feeds = {io_names.HIDDEN_IN: self._padded(hidden, carried), io_names.INPUT_IDS: self._ids_for(tokens, carried),
                 **self._positional(start, carried)}
        out = self.stages[io_names.FEATURE_HEAD].run(feeds)
        return out[io_names.LOGITS][0, :rows], out[io_names.HIDDEN_OUT][0, :rows]

    def prefill(self, tokens, chunk: int, start: int = 0) -> np.ndarray:
        """Both graphs over the prompt's rows [start, len) in passes of at most `chunk` rows (the rows
        before `start` are in the KV buffers already): the last row's final hidden [1, H].

        A pass's activations grow with its rows times the context (attention scores, the MLP's
        intermediate), so one pass over a long prompt sets the process's peak memory; chunks bound
        it. Each chunk attends to the KV rows the chunks before it wrote, as a verify pass does to
        the committed context, and a backend built for fewer rows (TensorRT profiles) still takes a
        prompt longer than its largest profile.
        """
        for first in range(start, len(tokens), chunk):
            rows = tokens[first : first + chunk]
            hidden = self.verify_pass(self.draft_pass(rows, first), first)  # [C, H]
        return hidden[-1:]

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """Full-vocabulary logits [N, V] of final hidden rows [N, H]."""
        rows = hidden.shape[0]
        feeds = {io_names.HIDDEN_IN: self._padded(hidden, self._carried(rows, 0))}
        return self.head_stage.run(feeds)[io_names.LOGITS][0, :rows]

    def draft_logits(self, hidden: np.ndarray) -> np.ndarray:
        """Draft logits [N, V'] of h_k rows [N, H] (exit adapter and draft vocabulary applied)."""
        rows = hidden.shape[0]
        feeds = {io_names.HIDDEN_IN: self._padded(hidden, self._carried(rows, 0))}
        return self.draft_head_stage.run(feeds)[io_names.LOGITS][0, :rows]

    def close(self) -> None:
        for stage in self.stages.values():
            stage.close()


class _LoadedWhenRun:
    """One graph's ONNX Runtime stage, loaded at its first call and unloaded by `close`."""

    def __init__(self, bundle, manifest: Manifest, name: str):
        self.bundle, self.manifest, self.name, self.stage = bundle, manifest, name, None

    def run(self, feeds: dict) -> dict:
        if self.stage is None:
            from ..backends import load_stages

            only = self.manifest.replace(graphs={self.name: self.manifest.graphs[self.name]})
            self.stage = load_stages(self.bundle, only)[self.name]
        return self.stage.run(feeds)

    def close(self) -> None:
        if self.stage is not None:
            self.stage.close()
            self.stage = None


def graph_at_a_time(bundle, manifest: Manifest) -> dict:
    """Stages for a SplitModel whose caller runs each graph's calls together and closes its stage
    (`model.draft_stage.close()`) before the next graph's: checks of a large fp32 bundle (validation,
    the quality report's reference) then never hold two graphs' weights. A stage closed and run
    again starts with empty KV buffers."""
    return {name: _LoadedWhenRun(bundle, manifest, name) for name in manifest.graphs}


MEMORY_SHARE = 0.7  # of the memory available now that one graph's session may take


def too_large(bundle, manifest: Manifest) -> dict[str, str]:
    """Graphs whose weights ONNX Runtime could not hold here (it copies a graph's initializers into
    its session: an 8B model's fp32 verify graph is ~21 GB), each with the reason; {} where the
    available memory cannot be read (not Linux)."""
    from pathlib import Path

    from ..bundle.weights import graph_bytes
    from .memory_log import available_bytes

    available = available_bytes()
    if available is None:
        return {}
    found = {}
    for name, graph in manifest.graphs.items():
        size = graph_bytes(Path(bundle) / graph.file)
        if size > MEMORY_SHARE * available:
            found[name] = (f"its weights ({size / 2**30:.1f} GiB) exceed {MEMORY_SHARE:.0%} of the memory "
                           f"available here ({available / 2**30:.1f} GiB)")
    return found
