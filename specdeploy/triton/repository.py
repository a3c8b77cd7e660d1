"""`specdeploy triton`: a Triton model repository (config.pbtxt + model.py) over one bundle.

Inputs and outputs follow Triton's LLM conventions (`text_input`, `text_output`, `stream`, the
sampling parameters as optional inputs), so its `generate` / `generate_stream` endpoints work
unchanged. The model is decoupled: one request, many responses.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from ..bundle import manifest as manifest_io
from ..errors import ConfigError
from .config import TritonConfig

MODEL_FILE = Path(__file__).with_name("model.py")
# (name, Triton type); all inputs optional (text_input or messages is required, checked by the model)
INPUTS = [("text_input", "TYPE_STRING"), ("messages", "TYPE_STRING"), ("stream", "TYPE_BOOL"),
          ("max_tokens", "TYPE_INT32"), ("temperature", "TYPE_FP32"), ("top_p", "TYPE_FP32"),
          ("top_k", "TYPE_INT32"), ("seed", "TYPE_INT64"), ("stop", "TYPE_STRING"),
          ("speculative", "TYPE_BOOL"), ("num_draft_tokens", "TYPE_INT32"), ("draft_source", "TYPE_STRING"),
          ("ignore_eos", "TYPE_BOOL")]
OUTPUTS = [("text_output", "TYPE_STRING"), ("finish_reason", "TYPE_STRING"), ("draft_source", "TYPE_STRING"),
           ("completion_tokens", "TYPE_INT32"), ("draft_tokens", "TYPE_INT32"), ("accepted_tokens", "TYPE_INT32"),
           ("acceptance_rate", "TYPE_FP32"), ("tokens_per_round", "TYPE_FP32")]


def _io(kind: str, entries, optional: bool) -> str:
    rows = []
    for name, dtype in entries:
        extra = " optional: true" if optional else ""  # text_input or messages: the model checks
        rows.append(f'  {{ name: "{name}" data_type: {dtype} dims: [ {"-1" if name == "stop" else "1"} ]{extra} }}')
    return f"{kind} [\n" + ",\n".join(rows) + "\n]"


def config_pbtxt(config: TritonConfig, bundle_path: str) -> str:
    params = {"bundle": bundle_path, "max_queue": str(config.max_queue), "threads": str(config.threads or 0),
              "site_packages": config.site_packages or "", "backend": config.backend}
    kind = "KIND_GPU" if config.backend == "tensorrt" else "KIND_CPU"
    parameters = "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    return "\n".join([
        f'name: "{config.name}"', 'backend: "python"', "max_batch_size: 0",
        _io("input", INPUTS, optional=True), _io("output", OUTPUTS, optional=False),
        "model_transaction_policy { decoupled: true }",
        f"instance_group [ {{ count: {config.instances} kind: {kind} }} ]", parameters, "",
    ])


def write_repository(config: TritonConfig, manifests: Path | None = None, image: str = "") -> Path:
    """Write NAME/config.pbtxt and NAME/1/model.py under `config.output` (and Kubernetes / KServe
    manifests into `manifests`); returns the model directory."""
    if manifests is not None and not config.copy:
        raise ConfigError("--manifests needs --copy: a cluster mounts the repository, which must hold the bundle")
    bundle = Path(config.bundle).resolve()
    manifest_io.read(bundle)  # a bad bundle is refused here, not when Triton loads it
    model_dir = Path(config.output).resolve() / config.name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    (model_dir / "1").mkdir(parents=True)
    shutil.copy(MODEL_FILE, model_dir / "1" / "model.py")
    if config.copy:
        shutil.copytree(bundle, model_dir / "bundle")
        bundle_path = "bundle"  # relative: found inside the model directory wherever it is mounted
    else:
        bundle_path = str(bundle)
    (model_dir / "config.pbtxt").write_text(config_pbtxt(config, bundle_path))
    if manifests is not None:
        from .manifests import write_manifests

        write_manifests(config, manifests, image)
    return model_dir

