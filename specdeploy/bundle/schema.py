"""The manifest's schema, checked in one place: every field's type, then what the fields must agree on.

The schema is the manifest's own dataclasses: their type hints say what each JSON field must hold,
so a field added there is checked here without a second list to keep in step. A damaged or
hand-edited manifest gets one error naming the field, never a KeyError from deep inside a command.
"""
from __future__ import annotations

import dataclasses
import types
import typing

from ..config import Penalties, SamplingParams, check_ngram, check_num_draft_tokens, check_precision, check_source
from ..constants import TARGETS
from ..errors import BundleError, ConfigError
from . import io_names

_FIX = "fix it there or re-export the bundle"


def fail(path: str, problem: str):
    raise BundleError(f"manifest.json: field '{path}' {problem}; {_FIX}")


def _agrees(path: str, check, value):
    """`check(value)` (config.py's own rule for the same setting), its error naming the field."""
    try:
        return check(value)
    except ConfigError as exc:
        fail(path, f"is wrong: {exc}")


def _kind(hint) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "a list"
    if origin is dict:
        return "an object"
    if dataclasses.is_dataclass(hint):
        return "an object"
    return str(hint)


def _is(value, hint) -> bool:
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint) or hint
    if origin is tuple:
        return isinstance(value, list)
    if origin is dict or dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return isinstance(value, origin)


def convert(value, hint, path: str):
    """`value` (as JSON holds it) as `hint` asks, or a BundleError naming `path`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        for option in options:
            if _is(value, option):
                return convert(value, option, path)
        fail(path, f"must be {' or '.join(_kind(o) for o in options if o is not type(None))}"
                   f"{' or null' if type(None) in options else ''}, not {value!r}")
    if not _is(value, hint):
        fail(path, f"must be {_kind(hint)}, not {value!r}")
    if dataclasses.is_dataclass(hint):
        return build(hint, value, path + ".")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if args[-1] is not Ellipsis and len(value) != len(args):
            fail(path, f"must hold {len(args)} items, not {len(value)}")
        each = [args[0]] * len(value) if args[-1] is Ellipsis else list(args)
        return tuple(convert(v, h, f"{path}[{i}]") for i, (v, h) in enumerate(zip(value, each)))
    if origin is dict and args:
        return {k: convert(v, args[1], f"{path}.{k}") for k, v in value.items()}
    return float(value) if hint is float else value


def build(cls, data: dict, prefix: str = ""):
    """An instance of the dataclass `cls` from `data`, every field checked against its type hint."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            fail(prefix + key, f"is not one this version of specdeploy knows (known: {', '.join(fields)})")
    values = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                fail(prefix + name, "is missing")
            continue
        values[name] = convert(data[name], hints[name], prefix + name)
    return cls(**values)


# the records kept as free-form objects, and the keys of theirs that commands read
RECORDS = {
    "tensorrt": {"version": str, "compute_capability": str, "max_draft_tokens": int, "max_prompt": int,
                 "engines": dict},
    "quality": {"top1_agreement": float, "perplexity": float, "perplexity_fp32": float, "acceptance_rate": float,
                "plain_tokens_per_second": float, "speculative_tokens_per_second": float, "greedy_identical": bool},
    "extra": {"int4_block_size": int, "source": str},
}
REQUIRED = {"tensorrt": ("version", "compute_capability", "max_draft_tokens", "max_prompt", "engines")}
ENGINE = {"file": str, "profiles": list}


def _check_record(name: str, record: dict | None) -> None:
    if record is None:
        return
    for key in REQUIRED.get(name, ()):
        if key not in record:
            fail(f"{name}.{key}", "is missing")
    for key, hint in RECORDS[name].items():
        if key in record and not _is(record[key], hint):
            fail(f"{name}.{key}", f"must be {_kind(hint)}, not {record[key]!r}")
    for graph, engine in (record.get("engines") or {}).items() if name == "tensorrt" else ():
        for key, hint in ENGINE.items():
            if not isinstance(engine, dict) or not _is(engine.get(key), hint):
                fail(f"tensorrt.engines.{graph}.{key}", f"must be {'a list' if hint is list else _kind(hint)}")


def check(manifest) -> None:
    """What the fields must agree on, beyond each one's type."""
    for name in RECORDS:
        _check_record(name, getattr(manifest, name))
    model = manifest.model
    for name in ("num_layers", "hidden_size", "vocab_size", "num_kv_heads", "head_dim"):
        if getattr(model, name) < 1:
            fail(f"model.{name}", f"must be >= 1, not {getattr(model, name)}")
    if not 1 <= manifest.exit_layer < model.num_layers:
        fail("exit_layer", f"must be in 1..{model.num_layers - 1}, not {manifest.exit_layer}")
    _agrees("num_draft_tokens", check_num_draft_tokens, manifest.num_draft_tokens)
    _agrees("draft_source", check_source, manifest.draft_source)
    _agrees("lookup_ngram", check_ngram, manifest.lookup_ngram)
    _check_sampling_defaults(manifest.sampling_defaults)
    if manifest.target not in TARGETS:
        fail("target", f"must be one of {', '.join(TARGETS)}, not {manifest.target!r}")
    if manifest.max_context < 1:
        fail("max_context", f"must be >= 1, not {manifest.max_context}")
    for name in (io_names.DRAFT, io_names.VERIFY, io_names.HEAD):
        if name not in manifest.graphs:
            fail(f"graphs.{name}", "is missing")
    for name, graph in manifest.graphs.items():
        _agrees(f"graphs.{name}.precision", check_precision, graph.precision)
    expected = {io_names.DRAFT: (0, manifest.exit_layer), io_names.VERIFY: (manifest.exit_layer, model.num_layers)}
    for name, layers in expected.items():
        if manifest.graphs[name].kv_layers != layers:
            fail(f"graphs.{name}.kv_layers", f"must be {list(layers)} for exit layer {manifest.exit_layer}, "
                                             f"not {manifest.graphs[name].kv_layers}")


def _check_sampling_defaults(defaults) -> None:
    if defaults is None:
        return
    _agrees("sampling_defaults", lambda d: SamplingParams(d.temperature or 0.0, d.top_k, d.top_p, d.min_p), defaults)
    _agrees("sampling_defaults", lambda d: Penalties(d.repetition_penalty or 1.0), defaults)
