"""`specdeploy export`: model -> validated bundle directory (graphs, weights, manifest, tokenizer)."""
from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import io_names
from .. import manifest as manifest_io
from ..config import MAX_DRAFT_TOKENS
from ..errors import ConfigError
from ..manifest import GraphInfo, Manifest
from ..manifest import DEFAULT_LOOKUP_NGRAM, check_ngram
from ..runtime.drafting import SOURCES

log = logging.getLogger("specdeploy")


@dataclass(frozen=True)
class ExportConfig:
    source: Path
    exit_layer: int
    num_draft_tokens: int = 4
    max_context: int = 2048
    output: Path = Path("engine.plan")
    draft_source: str = "hybrid"
    lookup_ngram: tuple[int, int] = DEFAULT_LOOKUP_NGRAM
    validate: bool = True
    opset: int = 24   # 23: ScatterND instead of TensorScatter, for ONNX Runtime < 1.25 (Python 3.10)

    def __post_init__(self):
        if self.opset not in (23, 24):
            raise ConfigError(f"opset={self.opset} is not supported; pick 24 (default) or 23 (ONNX Runtime 1.23)")
        if self.exit_layer < 1:
            raise ConfigError(f"exit_layer={self.exit_layer} must be >= 1")
        if not (1 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS):
            raise ConfigError(f"num_draft_tokens={self.num_draft_tokens} must be in 1..{MAX_DRAFT_TOKENS}")
        if not (16 <= self.max_context <= 32768):
            raise ConfigError(f"max_context={self.max_context} must be in 16..32768")
        if self.draft_source not in SOURCES:
            raise ConfigError(f"draft_source='{self.draft_source}' is unknown; pick one of {', '.join(SOURCES)}")
        object.__setattr__(self, "lookup_ngram", check_ngram(self.lookup_ngram))

    def check_layers(self, num_layers: int) -> None:
        if self.exit_layer >= num_layers:
            raise ConfigError(
                f"exit_layer={self.exit_layer} must be < num_layers={num_layers}; pick 1..{num_layers - 1}"
            )


def decoder_graphs(k: int, num_layers: int) -> dict[str, GraphInfo]:
    graphs = {}
    for name, first, layers in ((io_names.DRAFT, io_names.INPUT_IDS, (0, k)),
                                (io_names.VERIFY, io_names.HIDDEN_IN, (k, num_layers))):
        inputs, outputs = io_names.decoder_io(first, range(*layers))
        graphs[name] = GraphInfo(f"{name}.onnx", tuple(inputs), tuple(outputs), layers)
    inputs, outputs = io_names.head_io()
    graphs[io_names.HEAD] = GraphInfo("head.onnx", tuple(inputs), tuple(outputs))
    return graphs


def write_graphs(model, manifest: Manifest, out: Path, adapter=None, vocab_ids=None) -> dict:
    """Export every graph of `manifest` into `out` with one shared weights file."""
    from . import onnx_export, weights

    raw = out / "raw"
    raw.mkdir()
    k, ctx, opset = manifest.exit_layer, manifest.max_context, manifest.opset
    onnx_export.export_draft(model, k, ctx, raw / "draft.onnx", opset)
    onnx_export.export_verify(model, k, ctx, raw / "verify.onnx", opset)
    onnx_export.export_head(model, raw / "head.onnx", opset=opset)
    if io_names.DRAFT_HEAD in manifest.graphs:
        onnx_export.export_head(model, raw / "draft_head.onnx", adapter, vocab_ids, opset)
    files = {name: raw / f"{name}.onnx" for name in manifest.graphs}
    sizes = weights.share(files, out, manifest.weights)
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


def build_manifest(model, tokenizer, config: ExportConfig, name: str) -> Manifest:
    from .arch import eos_ids, model_info

    info = model_info(model, name, eos_ids(model, tokenizer))
    config.check_layers(info.num_layers)
    return Manifest(
        model=info, exit_layer=config.exit_layer, num_draft_tokens=config.num_draft_tokens,
        max_context=config.max_context, graphs=decoder_graphs(config.exit_layer, info.num_layers),
        draft_source=config.draft_source, lookup_ngram=config.lookup_ngram, opset=config.opset,
    )


def validate_bundle(model, bundle: Path, manifest: Manifest, adapter=None, vocab_ids=None) -> dict:
    from ..backends import load_stages
    from ..backends.torch_ref import reference_stages
    from ..runtime.split_model import SplitModel
    from .validate import compare

    exported = SplitModel(manifest, load_stages(bundle, manifest))
    reference = SplitModel(manifest, reference_stages(model, manifest, adapter, vocab_ids))
    return compare(exported, reference, manifest.precision)


def install(staging: Path, output: Path) -> None:
    """Move a finished bundle into place, replacing an older bundle only once the new one is whole."""
    output = Path(output)
    if output.exists() and not (output / manifest_io.MANIFEST_FILE).is_file():
        raise ConfigError(f"{output} exists and is not a bundle; choose another --output")
    old = output.with_name(output.name + ".old")
    if output.exists():
        shutil.rmtree(old, ignore_errors=True)
        output.rename(old)
    shutil.move(str(staging), str(output))
    shutil.rmtree(old, ignore_errors=True)


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


def export(config: ExportConfig, draft: DraftHead | None = None, calibration: dict | None = None,
           loaded=None) -> Path:
    """Export, validate and install a bundle; returns its path.

    `loaded` is an already loaded (model, tokenizer) pair, so calibration does not load twice.
    """
    from .arch import load

    model, tokenizer = loaded or load(config.source)
    manifest = build_manifest(model, tokenizer, config, Path(config.source).name)
    output = Path(config.output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=".export-") as tmp:
        staging = Path(tmp) / "bundle"
        staging.mkdir()
        log.info("exporting %s: exit layer %d of %d", manifest.model.name, config.exit_layer,
                 manifest.model.num_layers)
        manifest = _with_draft_head(manifest, draft, staging)
        adapter, vocab_ids = (draft.adapter, draft.vocab_ids) if draft else (None, None)
        sizes = write_graphs(model, manifest, staging, adapter, vocab_ids)
        tok, template = save_tokenizer(tokenizer, staging)
        extra = {"weights_bytes": sizes["written"], "weights_bytes_before_dedup": sizes["referenced"],
                 "source": str(Path(config.source).resolve())}
        manifest = manifest.replace(tokenizer=tok, chat_template=template, extra=extra,
                                    calibration=calibration)
        if config.validate:
            extra["validation_max_abs_diff"] = validate_bundle(model, staging, manifest, adapter, vocab_ids)
        manifest_io.write(staging, manifest)
        install(staging, output)
    return output
