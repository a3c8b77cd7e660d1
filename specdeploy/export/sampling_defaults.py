"""The model's own sampling settings, recorded in the bundle so a generation whose caller says
nothing samples as the model's authors intended (greedy where they give none).

Read from a Hugging Face directory's generation_config.json (sampling settings only where
`do_sample` is true; a repetition penalty applies to greedy decoding too) or a GGUF's
`general.sampling.*` keys; `export --sampling KEY=VALUE` overrides or adds to them.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..bundle.manifest import SamplingDefaults
from ..config import Penalties, SamplingParams
from ..errors import ConfigError

KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
             "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
             "general.sampling.penalty_repeat": "repetition_penalty"}


def parse_options(pairs) -> dict:
    """{key: value} from export's `--sampling KEY=VALUE` options, each checked."""
    out = {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        if key not in KEYS or not text:
            raise ConfigError(f"--sampling {pair!r}: give KEY=VALUE with KEY one of {', '.join(KEYS)}, "
                              f"e.g. --sampling temperature=0.2")
        try:
            out[key] = int(text) if key == "top_k" else float(text)
        except ValueError:
            raise ConfigError(f"--sampling {pair!r}: {text!r} is not a number") from None
    return check(out)


def check(values: dict) -> dict:
    """`values` if each is a sampling default within its range, else ConfigError naming it."""
    unknown = set(values) - set(KEYS)
    if unknown:
        raise ConfigError(f"sampling default {sorted(unknown)[0]!r} is unknown; pick from {', '.join(KEYS)}")
    SamplingParams(values.get("temperature") or 0.0, values.get("top_k"), values.get("top_p"), values.get("min_p"))
    Penalties(values.get("repetition_penalty") or 1.0)
    return values


def _from_hf(directory: Path) -> dict:
    path = directory / "generation_config.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    keys = KEYS if data.get("do_sample") else ("repetition_penalty",)
    return {k: data[k] for k in keys if isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool)}


def _from_gguf(path: Path) -> dict:
    import gguf

    reader = gguf.GGUFReader(path)
    out = {}
    for name, key in GGUF_KEYS.items():
        field = reader.fields.get(name)
        if field is not None:
            out[key] = field.contents()
    return out


def recorded(source: Path, options: dict) -> SamplingDefaults | None:
    """The defaults a bundle records: the source's, then `options` over them; None when neither has any."""
    source = Path(source)
    found = _from_gguf(source) if source.suffix == ".gguf" else _from_hf(source) if source.is_dir() else {}
    values = {**found, **options}
    if not values:
        return None
    where = [w for w, given in (("the model's " + ("GGUF" if source.suffix == ".gguf" else "generation_config"),
                                 found), ("export --sampling", options)) if given]
    return SamplingDefaults(source=" and ".join(where), **check(values))
