"""Writing one bundle directory from a loaded model: graphs, shared weights, tokenizer, manifest.

The pipeline (export/pipeline.py) decides what to write and where; this module only writes, into
a directory it is given (a staging directory that is installed once whole).
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..bundle import io_names
from ..bundle import manifest as manifest_io
from ..bundle.manifest import GraphInfo, Manifest
from ..runtime.memory_log import mark
from ..runtime.seal import seal


def decoder_graphs(k: int, num_layers: int, feature_layers: tuple[int, ...] = ()) -> dict[str, GraphInfo]:
    graphs = {}
    for name, first, layers in ((io_names.DRAFT, io_names.INPUT_IDS, (0, k)),
                                (io_names.VERIFY, io_names.HIDDEN_IN, (k, num_layers))):
        features = io_names.graph_features(feature_layers, *layers)
        inputs, outputs = io_names.decoder_io(first, range(*layers), features)
        graphs[name] = GraphInfo(f"{name}.onnx", tuple(inputs), tuple(outputs), layers)
    inputs, outputs = io_names.head_io()
    graphs[io_names.HEAD] = GraphInfo("head.onnx", tuple(inputs), tuple(outputs))
    return graphs


def write_graphs(model, manifest: Manifest, out: Path, adapter=None, vocab_ids=None, streamed=None,
                 feature_head=None) -> dict:
    """Export every graph of `manifest` into `out` with one shared weights file; `streamed` (a
    streamed.StreamedWeights) when `model` is a skeleton whose weights are read a tensor at a time;
    `feature_head` (a feature_head.model.FeatureHead) when the manifest has its graphs."""
    from ..bundle import weights
    from . import onnx_export

    raw = out / "raw"
    raw.mkdir()
    k, ctx, opset, num_layers = manifest.exit_layer, manifest.max_context, manifest.opset, manifest.model.num_layers
    features = {name: io_names.graph_features(manifest.feature_layers, *span)
                for name, span in ((io_names.DRAFT, (0, k)), (io_names.VERIFY, (k, num_layers)))}
    traced = {io_names.DRAFT: onnx_export.export_draft(model, k, ctx, raw / "draft.onnx", opset,
                                                       features[io_names.DRAFT]),
              io_names.VERIFY: onnx_export.export_verify(model, k, ctx, raw / "verify.onnx", opset,
                                                         features[io_names.VERIFY]),
              io_names.HEAD: onnx_export.export_head(model, raw / "head.onnx", opset=opset)}
    if io_names.DRAFT_HEAD in manifest.graphs:
        traced[io_names.DRAFT_HEAD] = onnx_export.export_head(model, raw / "draft_head.onnx", adapter, vocab_ids,
                                                              opset)
    if feature_head is not None:
        from .feature_graphs import export_graphs

        traced.update(export_graphs(feature_head, model, raw, ctx, opset))
    files = {name: raw / f"{name}.onnx" for name in manifest.graphs}
    if streamed is None:
        sizes = weights.share(files, out, manifest.weights)
    else:
        from .streamed import write_weights

        graphs = {name: (files[name], traced[name].initializers) for name in manifest.graphs}
        values = {name: streamed.initializers(traced[name].module) for name in manifest.graphs}
        sizes = write_weights(graphs, values, out, manifest.weights)
    shutil.rmtree(raw)
    return sizes


def save_tokenizer(tokenizer, out: Path) -> tuple[str, str | None]:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        shutil.copy(Path(tmp) / "tokenizer.json", out / "tokenizer.json")
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        (out / "chat_template.jinja").write_text(template)
        return "tokenizer.json", "chat_template.jinja"
    return "tokenizer.json", None


@dataclass(frozen=True)
class DraftHead:
    """Calibration results baked into the draft head graph (see specdeploy.calibration)."""

    adapter: object = None              # torch module applied to h_k before the final norm
    vocab_ids: object = None            # int64 array: the draft vocabulary, or None for all tokens
    threshold: float | None = None      # adaptive drafting: stop below this draft top probability

    @property
    def needs_graph(self) -> bool:
        return self.adapter is not None or self.vocab_ids is not None


def build_manifest(model, tokenizer, config, name: str) -> Manifest:
    from ..feature_head.config import default_feature_layers
    from .arch import adds_bos, eos_ids, model_info
    from .sampling_defaults import recorded

    info = model_info(model, name, eos_ids(model, tokenizer), adds_bos(tokenizer))
    config.check_layers(info.num_layers)
    layers = config.feature_layers or (tuple(sorted(set(default_feature_layers(info.num_layers))))
                                       if config.head_features else ())
    return Manifest(
        model=info, exit_layer=config.exit_layer, num_draft_tokens=config.num_draft_tokens,
        max_context=config.max_context,
        graphs=decoder_graphs(config.exit_layer, info.num_layers, layers),
        draft_source=config.draft_source, lookup_ngram=config.lookup_ngram, opset=config.opset,
        feature_layers=layers, sampling_defaults=recorded(config.source, config.sampling), target=config.target,
    )


def _with_draft_head(manifest: Manifest, draft: DraftHead | None, staging: Path) -> Manifest:
    if draft is None or not draft.needs_graph:
        return manifest.replace(confidence_threshold=draft.threshold if draft else None)
    import numpy as np

    inputs, outputs = io_names.head_io()
    graphs = {**manifest.graphs,
              io_names.DRAFT_HEAD: GraphInfo("draft_head.onnx", tuple(inputs), tuple(outputs))}
    vocab_file = None
    if draft.vocab_ids is not None:
        vocab_file = "draft_vocab.npy"
        np.save(staging / vocab_file, np.asarray(draft.vocab_ids, dtype=np.int64))
    return manifest.replace(graphs=graphs, draft_vocab=vocab_file, confidence_threshold=draft.threshold)


def _with_feature_head(manifest: Manifest, head, staging: Path) -> Manifest:
    """The manifest with a feature head's graphs and vocabulary, and the features it reads output by
    the others."""
    if head is None:
        return manifest
    import numpy as np

    from .feature_graphs import graph_infos

    layers, k, num_layers = head.config.feature_layers, manifest.exit_layer, manifest.model.num_layers
    graphs = {**manifest.graphs, **decoder_graphs(k, num_layers, layers), **graph_infos(num_layers)}
    np.save(staging / "feature_vocab.npy", head.d2t.numpy() + np.arange(len(head.d2t)))
    return manifest.replace(graphs=graphs, feature_layers=layers, feature_vocab="feature_vocab.npy")


def _validate(model, staging: Path, manifest: Manifest, adapter, vocab_ids, streamed, echo,
              feature_head=None) -> None:
    """Validate the graphs (recorded in `manifest.extra`); a verify graph too large to load here is
    named and left to the row check of the graphs that ship."""
    from ..runtime.split_model import too_large
    from .validate import validate_bundle

    skipped = too_large(staging, manifest)
    if set(skipped) - {io_names.VERIFY}:
        manifest.extra["validation_skipped"] = skipped
        echo(f"not validated: {'; '.join(f'the {n} graph: {r}' for n, r in skipped.items())}")
        return
    diffs = validate_bundle(model, staging, manifest, adapter, vocab_ids, streamed, frozenset(skipped),
                            feature_head)
    manifest.extra["validation_max_abs_diff"] = diffs
    logits = [v for k, v in diffs.items() if "logits" in k]
    echo(f"validated against the PyTorch reference: max |logit difference| {max(logits):.2g}"
         + (f" (hidden states and features: {max(v for k, v in diffs.items() if 'logits' not in k):.2g})"
            if len(logits) < len(diffs) else ""))
    if skipped:
        manifest.extra["validation_skipped"] = skipped
        echo(f"the verify graph was not validated: {skipped[io_names.VERIFY]}; the draft graph and heads were")


def write_bundle(model, tokenizer, config, staging: Path, draft: DraftHead | None = None,
                 calibration: dict | None = None, echo=lambda line: None, streamed=None,
                 sealed: bool = True) -> Manifest:
    """Export every graph of `config`'s split into the empty directory `staging` and validate it.

    `config` is an ExportConfig whose exit layer and draft length are decided (not "auto");
    `streamed`: `model` is a skeleton whose weights it reads (export/streamed.py); `sealed=False`:
    an fp32 bundle that is only quantized's source, whose row check and exit agreement the
    quantized bundle measures on its own graphs (checking a large fp32 bundle would hold its weights).
    """
    manifest = build_manifest(model, tokenizer, config, Path(config.source).name)
    echo(f"exporting draft, verify and head graphs: exit layer {config.exit_layer} of {manifest.model.num_layers}")
    manifest = _with_draft_head(manifest, draft, staging)
    head = None
    if config.feature_head is not None:
        from .feature_graphs import load_for_export

        head = load_for_export(config.feature_head, model)
        manifest = _with_feature_head(manifest, head, staging)
        echo(f"with the feature head in {config.feature_head}: features from layers {list(manifest.feature_layers)}")
    adapter, vocab_ids = (draft.adapter, draft.vocab_ids) if draft else (None, None)
    sizes = write_graphs(model, manifest, staging, adapter, vocab_ids, streamed, head)
    mark("tracing the graphs and writing the weights")
    tok, template = save_tokenizer(tokenizer, staging)
    extra = {"weights_bytes": sizes["written"], "weights_bytes_before_dedup": sizes["referenced"],
             "source": str(Path(config.source).resolve())}
    if config.feature_head is not None:
        from ..feature_head.eagle3 import read_acceptance

        measured = read_acceptance(config.feature_head)
        if measured:
            extra["feature_head_acceptance"] = measured
    manifest = manifest.replace(tokenizer=tok, chat_template=template, extra=extra, calibration=calibration)
    if config.validate:
        _validate(model, staging, manifest, adapter, vocab_ids, streamed, echo, head)
        mark("validating against the PyTorch reference")
    if not sealed:
        return manifest_io.write(staging, manifest)
    manifest = seal(staging, manifest, echo)
    mark("checking row independence")
    return manifest

