"""What the fp32 bundle computes on the calibration text, for the calibrators that need it.

FP8 calibration feeds every graph real inputs (prompt tokens to the draft graph, the exit hidden
states the draft graph produces to the verify graph, the hidden states that reach the heads): the
quantizer needs them to trace the graphs, and they validate that each graph runs. The same feeds
find int4 / int8's activation outlier channels (outliers.py) and GPTQ's Gram matrices (gptq.py).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import numpy as np

from .. import prompts
from ..bundle import io_names
from ..errors import ConfigError
from . import gptq, outliers
from .compute import FORMS as COMPUTE_FORMS, ComputeOptions


class Reader:
    """ONNX Runtime calibration data reader over a list of feed dicts, built lazily."""

    def __init__(self, feeds: list[Callable[[], dict]]):
        self.feeds = iter(feeds)

    def get_next(self):
        make = next(self.feeds, None)
        return None if make is None else make()


def calibration_windows(bundle: Path, manifest, texts: list[str], window: int = 32) -> list[list[int]]:
    """The calibration texts' tokens in fixed-size windows: equal shapes let every calibrator
    (histograms too) merge its statistics across samples."""
    from ..runtime.tokenizer import Tokenizer, encode_plain

    tokenizer = Tokenizer(bundle / manifest.tokenizer, None, manifest.model.bos_token_id)
    stream = [t for text in texts for t in encode_plain(tokenizer, manifest.model, text)]
    return [stream[start : start + window] for start in range(0, len(stream) - window + 1, window)]


def calibration_feeds(bundle: Path, manifest, texts: list[str],
                      window: int = 32) -> dict[str, list[Callable[[], dict]]]:
    """Per graph, feeds from running the fp32 bundle on the calibration windows, one graph at a time
    (runtime.split_model.graph_at_a_time: a large model's fp32 graphs are never resident together)."""
    from ..runtime.split_model import SplitModel, graph_at_a_time

    windows = calibration_windows(bundle, manifest, texts, window)
    model = SplitModel(manifest, graph_at_a_time(bundle, manifest))
    try:
        hidden = [model.draft_pass(ids, 0).copy() for ids in windows]                  # [S, H] each
        model.draft_stage.close()
        final = [model.verify_pass(h, 0).copy() for h in hidden]                      # [S, H] each
    finally:
        model.close()
    hidden_by = {io_names.DRAFT: hidden, io_names.VERIFY: final}
    return {name: fed_by(manifest, name, windows, hidden_by) if name in FED_BY else [] for name in manifest.graphs}


FED_BY = {io_names.DRAFT: None, io_names.VERIFY: io_names.DRAFT, io_names.DRAFT_HEAD: io_names.DRAFT,
          io_names.HEAD: io_names.VERIFY}  # the graph whose hidden states [S, H] a graph is fed


def feeding_order(names) -> list[str]:
    """`names` with each graph after the one whose hidden states it is fed (draft, verify, head):
    GPTQ rounds them in this order, so each spilling pass finds its feeds made by the one before."""
    def depth(name):
        return 0 if FED_BY.get(name) is None else 1 + depth(FED_BY[name])
    return sorted(names, key=depth)


def fed_by(manifest, name: str, windows: list[list[int]], hidden: dict[str, list[np.ndarray]]
           ) -> list[Callable[[], dict]]:
    """A graph's feeds: the windows' tokens (the draft graph) or, per window, the hidden states the
    graph before it (FED_BY) returned."""
    source = FED_BY[name]
    if source is None:
        return [decoder_feed(manifest, name, io_names.INPUT_IDS, np.array([ids], np.int64)) for ids in windows]
    rows = [h.reshape(-1, h.shape[-1]) for h in hidden[source]]                          # [S, H] each
    if name == io_names.VERIFY:
        return [decoder_feed(manifest, name, io_names.HIDDEN_IN, h[None]) for h in rows]
    return [lambda h=h: {io_names.HIDDEN_IN: h[None]} for h in rows]


def decoder_feed(manifest, graph: str, first: str, value: np.ndarray) -> Callable[[], dict]:
    def make():
        rows = value.shape[1]
        feed = {first: value, io_names.POSITION_IDS: np.arange(rows, dtype=np.int64)[None],
                io_names.WRITE_INDEX: np.zeros(1, np.int64),
                io_names.ATTENTION_MASK: np.ones((1, rows), np.int64)}
        for name in io_names.kv_inputs(manifest.graph(graph).layers):
            feed[name] = np.zeros(manifest.kv_shape, np.float32)
        return feed
    return make


def calibration_texts(prompts_file: Path | None, every: bool = False) -> list[str]:
    """The built-in calibration prompts (a sixth of them, or `every` one: GPTQ's Gram matrices
    want more rows than the K channels they correlate) and the user's."""
    conversations = prompts.calibration_conversations(held_out=False)
    texts = [c[-1]["content"] for c in conversations[:: 1 if every else 6]]
    if prompts_file:
        texts += [c[-1]["content"] for c in prompts.load_calibration_prompts(prompts_file)]
    return texts


class Calibration:
    """What quantizing needs from the fp32 bundle: feeds per graph (fp8's calibrator), activation
    outlier channels per int graph (outliers.py), and which graphs GPTQ rounds (gptq.py). The feeds
    run the fp32 bundle over the calibration text; they are made when first asked for, so GPTQ over a
    GGUF whose blocks all carry costs nothing.

    GPTQ needs no separate feeding pass: each graph's spilling pass (gptq.SpilledGrams) also returns
    its hidden states, which feed the graph after it (FED_BY). Where those are missing (a graph not
    rounded, or feeds already made for outliers) the graph takes `feeds`."""

    def __init__(self, make_feeds: Callable[[], dict], outliers: dict, gptq_graphs: dict,
                 make_windows: Callable[[], list] | None = None, manifest=None):
        self._make_feeds, self.outliers, self.gptq_graphs = make_feeds, outliers, gptq_graphs
        self.unrounded: dict[str, str] = {}  # graphs GPTQ cannot run at fp32 here -> why (rounded to nearest)
        self._make_windows, self._manifest = make_windows, manifest
        self._spilled: list = []
        self._hidden: dict[str, list[np.ndarray]] = {}  # the hidden states each spilled graph returned
        self.rows = 0  # calibration tokens GPTQ's graphs were fed (the rows of their H), once it ran

    @functools.cached_property
    def feeds(self) -> dict:
        return self._make_feeds()

    def grams(self, name: str) -> Callable[[], gptq.SpilledGrams | None]:
        """The graph's input Gram matrices (each made when its weight is rounded: gptq.SpilledGrams),
        their activations spilled when first asked for. Graphs are rounded one after another, so the
        previous graph's are removed then (its spilled rows, 4.4 GB for a 1.5B draft graph here, and
        the last H and factor it kept, 0.6 GB)."""
        file = self.gptq_graphs.get(name)

        @functools.cache
        def spilled():
            if file is None:
                return None
            self.close()
            self.rows = sum(map(len, self.windows)) if self._make_windows else 0
            returns = (io_names.HIDDEN_OUT,) if name in FED_BY.values() else ()
            self._spilled.append(gptq.SpilledGrams(file, self._feeds_for(name), returns))
            if returns:
                self._hidden[name] = self._spilled[-1].outputs[io_names.HIDDEN_OUT]
            return self._spilled[-1]
        return spilled

    def _feeds_for(self, name: str) -> list[Callable[[], dict]]:
        source = FED_BY.get(name, name)
        if "feeds" in self.__dict__ or self._make_windows is None or (source and source not in self._hidden):
            return self.feeds[name]
        return fed_by(self._manifest, name, self.windows if source is None else [], self._hidden)

    @functools.cached_property
    def windows(self) -> list[list[int]]:
        """The calibration text's token windows (calibration_windows), tokenized once."""
        return self._make_windows()

    def close(self) -> None:
        """Remove the spilled activations."""
        for spilled in self._spilled:
            spilled.close()
        self._spilled.clear()


def calibrate(bundle: Path, manifest, plan: dict, method: str, options: ComputeOptions,
              texts: list[str]) -> Calibration:
    if options.float_outliers and (method == "ort" or not set(plan.values()) & set(COMPUTE_FORMS)):
        raise ConfigError("--float-outliers applies to int4 / int8 graphs made by --method rtn, mse, minmax "
                          "or gptq (ONNX Runtime's own quantizer, ort, writes its graphs whole); drop it")
    ints = {n for n, p in plan.items() if p in COMPUTE_FORMS and method != "ort" and n not in io_names.FEATURE_GRAPHS}
    wants = {n for n in ints if options.outliers_for(plan[n])}
    rounds = ints if method == "gptq" else set()
    unrounded = _too_large_to_run(bundle, manifest, rounds)
    rounds -= set(unrounded)
    calibration = Calibration(lambda: calibration_feeds(bundle, manifest, texts), {}, {},
                              lambda: calibration_windows(bundle, manifest, texts), manifest)
    file = lambda n: bundle / manifest.graph(n).file  # noqa: E731
    found = {n: outliers.outlier_channels(outliers.channel_maxima(file(n), calibration.feeds[n])) for n in wants}
    calibration.outliers, calibration.gptq_graphs = found, {n: file(n) for n in rounds}
    calibration.unrounded = unrounded
    return calibration


def _too_large_to_run(bundle: Path, manifest, rounds: set[str]) -> dict[str, str]:
    """Graphs GPTQ would round but whose fp32 pass ONNX Runtime could not hold here (an 8B model's
    verify graph: ~21 GB), and those fed by them (FED_BY), each with the reason: they are rounded to
    nearest instead, as a graph too large to validate is named and not run."""
    from ..runtime.split_model import too_large

    large = too_large(bundle, manifest) if rounds else {}
    found = {}
    for name in feeding_order(rounds):
        source = FED_BY.get(name)
        if name in large:
            found[name] = f"its fp32 pass would not fit here: {large[name]}"
        elif source in found:
            found[name] = f"it is fed the {source} graph's fp32 pass, which would not fit here"
    return found
