"""The bundle manifest: a versioned JSON file beside the graphs that drives all binding.

Nothing in the runtime is inferred from file names; everything it binds is read from here.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..constants import DEFAULT_LOOKUP_NGRAM, DEFAULT_OPSET
from ..errors import BundleError
from . import files
from .files import FileRecord

FORMAT = "specdeploy-bundle"
SCHEMA_VERSION = 2   # 2: every file's size and SHA-256 recorded (files)
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_kv_heads: int
    head_dim: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    add_bos_token: bool = False   # plain-text prompts start with BOS (as the model's tokenizer does)


@dataclass(frozen=True)
class SamplingDefaults:
    """The model's own sampling settings, recorded at export (its generation_config.json, a GGUF's
    general.sampling.* keys, or export's options): what a generation uses where its caller says
    nothing. `source` says where they came from."""

    source: str
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None


@dataclass(frozen=True)
class InPlaceWeight:
    """A span of the weights file one of specdeploy's operators reads every step: the runtime reads
    it once into memory of its own and hands it to ONNX Runtime as the initializer `name`."""

    name: str
    offset: int
    length: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class GraphInfo:
    """One graph of the bundle: file, I/O names, and which layers' KV buffers it binds."""

    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kv_layers: tuple[int, int] | None = None  # [first, last) or None for head graphs
    precision: str = "fp32"
    tensorrt_file: str | None = None  # int4/int8: the DequantizeLinear form TensorRT builds from

    @property
    def layers(self) -> range:
        return range(*self.kv_layers) if self.kv_layers else range(0)


@dataclass(frozen=True)
class Manifest:
    model: ModelInfo
    exit_layer: int
    num_draft_tokens: int
    max_context: int
    graphs: dict[str, GraphInfo]
    weights: str = "weights.bin"
    kv_dtype: str = "float32"
    precision: str = "fp32"
    draft_source: str = "early_exit"
    lookup_ngram: tuple[int, int] = DEFAULT_LOOKUP_NGRAM  # suffix lengths lookup matches, longest first
    default_speculative: bool = True           # False when calibration found speculation slower
    tokenizer: str = "tokenizer.json"
    chat_template: str | None = None
    draft_vocab: str | None = None            # .npy of token ids the draft head covers
    confidence_threshold: float | None = None  # adaptive drafting: stop below this draft top-p
    calibration: dict | None = None
    quality: dict | None = None
    tensorrt: dict | None = None              # engines built for one TensorRT version and GPU
    row_check: dict | None = None             # runtime.row_check result: passed, max_diff, machine
    exit_agreement: float | None = None       # runtime.exit_agreement: draft head vs full model, held-out text
    opset: int = DEFAULT_OPSET              # 23 = ScatterND KV writes, for ONNX Runtime < 1.25
    kv_spare_rows: int = 0                    # KV rows past max_context: fused attention's padded row
    feature_layers: tuple[int, ...] = ()      # layers whose input the graphs output, for a feature head
    feature_vocab: str | None = None          # .npy of the token ids the feature head's rows draft
    operators: tuple[str, ...] = ()           # specdeploy's own operators the graphs use (kernels/): "q4_0.v2"
    sampling_defaults: SamplingDefaults | None = None  # the model's generation defaults (None: greedy)
    target: str = "cpu"                       # what the graph forms are made for (config.TARGET_FORMS)
    fused_attention: dict[str, int] = field(default_factory=dict)  # graph -> layers whose attention is one GQA kernel
    attention_window_shift: int | None = None  # keys GQA counts past its window, where fused layers are windowed
    read_in_place: dict[str, tuple[InPlaceWeight, ...]] = field(default_factory=dict)  # graph -> its operators' weights
    files: dict[str, FileRecord] = field(default_factory=dict)  # every bound file; filled in by write()
    schema_version: int = SCHEMA_VERSION
    format: str = FORMAT
    extra: dict = field(default_factory=dict)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        m = self.model
        return (1, m.num_kv_heads, self.max_context + self.kv_spare_rows, m.head_dim)

    @property
    def exit_agreement_floor(self) -> float:
        """Half the draft graph's share of layers: an exit agreeing with the full model less often
        than this never pays for the draft pass its rounds add (runtime.exit_agreement)."""
        return self.exit_layer / (2 * self.model.num_layers)

    @property
    def exit_can_pay(self) -> bool:
        """False where the measured agreement is under the floor; unmeasured exits may pay."""
        return self.exit_agreement is None or self.exit_agreement >= self.exit_agreement_floor

    def graph(self, name: str) -> GraphInfo:
        if name not in self.graphs:
            raise BundleError(f"bundle has no '{name}' graph; re-export it with 'specdeploy export'")
        return self.graphs[name]

    def replace(self, **changes) -> "Manifest":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


def from_dict(d: dict) -> Manifest:
    """The manifest in `d`, every field checked (bundle/schema.py): errors name the field."""
    from . import schema

    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise BundleError("not a specdeploy bundle manifest; export one with 'specdeploy export'")
    if d.get("schema_version") != SCHEMA_VERSION:
        raise BundleError(
            f"bundle schema version {d.get('schema_version')} is not supported by this "
            f"specdeploy (needs {SCHEMA_VERSION}); re-export the model"
        )
    if "files" not in d:
        schema.fail("files", "is missing")
    manifest = schema.build(Manifest, _typed_from_extra(d))
    schema.check(manifest)
    return manifest


FROM_EXTRA = ("fused_attention", "attention_window_shift", "read_in_place")  # earlier bundles kept these in extra


def _typed_from_extra(d: dict) -> dict:
    """An earlier manifest's `extra` records that are fields now, moved into their fields."""
    extra = d.get("extra")
    if not isinstance(extra, dict) or not any(key in extra for key in FROM_EXTRA):
        return d
    d, extra = dict(d), dict(extra)
    for key in FROM_EXTRA:
        if key in extra and key not in d:
            d[key] = extra.pop(key)
    table = d.get("read_in_place")
    if isinstance(table, dict):  # rows were [name, offset, length, dtype, shape]
        d["read_in_place"] = {g: [dict(zip(("name", "offset", "length", "dtype", "shape"), row))
                                  if isinstance(row, list) else row for row in rows] if isinstance(rows, list) else rows
                              for g, rows in table.items()}
    return {**d, "extra": extra}


def read(bundle: Path) -> Manifest:
    path = Path(bundle) / MANIFEST_FILE
    if not path.is_file():
        raise BundleError(
            f"{bundle} is not a bundle (no {MANIFEST_FILE}); create one with "
            f"'specdeploy export --exit-layer K MODEL --output {bundle}'"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}); copy the bundle again or re-export it") from None
    manifest = from_dict(data)
    files.check_sizes(bundle, manifest)
    return manifest


def read_verified(bundle: Path) -> Manifest:
    """`read`, then every file's SHA-256 checked: for commands that derive a new bundle from this one,
    so that a damaged byte is named here rather than sealed into the new bundle with fresh hashes."""
    manifest = read(bundle)
    files.verify(bundle, manifest)
    return manifest


def write(bundle: Path, manifest: Manifest) -> Manifest:
    """Seal `manifest` into `bundle`: every file it binds recorded with its size and SHA-256."""
    sealed = manifest.replace(files=files.record(bundle, manifest))
    (Path(bundle) / MANIFEST_FILE).write_text(sealed.to_json() + "\n")
    return sealed
