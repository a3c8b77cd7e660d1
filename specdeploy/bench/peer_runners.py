"""One runner per runtime: `generate(prompt ids, n) -> n greedy token ids`, EOS ignored, then `close()`.

Peers are imported lazily and built once into a cache directory; a peer that cannot run raises
PeerUnavailable with the reason, which the comparison prints in its row.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ..backends.base import usable_cpus


class PeerUnavailable(Exception):
    pass


def _import(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PeerUnavailable(f"{module} is not installed ({exc}); scripts/setup_peers.sh installs it") from None


def _threads(threads: int | None) -> int:
    return threads or usable_cpus()


class Specdeploy:
    def __init__(self, bundle: Path, speculative: bool | None, threads: int | None):
        from ..runtime.engine import Engine

        self.engine = Engine(bundle, threads=threads)
        m = self.engine.manifest
        self.precision, self.speculative = m.precision, speculative
        mode = "plain decoding" if speculative is False else f"bundle default ({m.draft_source}, γ {m.num_draft_tokens})"
        self.note = f"{Path(bundle).name}: {m.precision}, {mode}"

    def generate(self, ids: list[int], n: int) -> list[int]:
        from ..config import UNWARPED, GenerationConfig

        config = GenerationConfig(max_new_tokens=n, temperature=0.0, ignore_eos=True, speculative=self.speculative,
                                  **UNWARPED)
        return self.engine.generate_ids(ids, config)

    def close(self) -> None:
        self.engine.close()


def hf_directory(source: Path, cache: Path) -> Path:
    """The source as a Hugging Face directory (a .gguf is dequantized once into `cache`)."""
    source = Path(source)
    if source.is_dir():
        return source
    target = cache / f"hf-{source.stem}"
    if (target / "config.json").is_file():
        return target
    transformers = _import("transformers")
    from ..export.gguf_reads import parsed_once

    with parsed_once():
        model = transformers.AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
        tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def builder_python() -> str:
    """The interpreter that runs ONNX Runtime GenAI's model builder: it needs a newer transformers
    than Optimum allows, so by default the project's main environment (.venv), where
    scripts/setup_peers.sh installs onnxruntime-genai too; SPECDEPLOY_BUILDER_PYTHON overrides."""
    configured = os.environ.get("SPECDEPLOY_BUILDER_PYTHON")
    if configured:
        return configured
    main_env = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"
    return str(main_env) if main_env.is_file() else sys.executable


class OrtGenAI:
    """ONNX Runtime GenAI on a model its own builder made from the HF directory (cached)."""

    def __init__(self, source: Path, cache: Path, precision: str, threads: int | None):
        og = _import("onnxruntime_genai")
        hf = hf_directory(source, cache)
        out = cache / f"ortgenai-{precision}-{hf.name}"
        if not (out / "genai_config.json").is_file():
            cmd = [builder_python(), "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out),
                   "-p", precision, "-e", "cpu", "-c", str(cache / "ortgenai-tmp")]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                raise PeerUnavailable(f"the ONNX Runtime GenAI builder failed: {tail[0][:160]}")
        config = og.Config(str(out))
        config.clear_providers()
        self.og, self.model = og, og.Model(config)
        self.note = f"ONNX Runtime GenAI {og.__version__}, its builder -p {precision} -e cpu"

    def generate(self, ids: list[int], n: int) -> list[int]:
        params = self.og.GeneratorParams(self.model)
        total = len(ids) + n
        params.set_search_options(max_length=total, min_length=total, do_sample=False, batch_size=1)
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(ids)
        out = []
        while len(out) < n and not gen.is_done():
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return out

    def close(self) -> None:
        self.model = None


class LlamaCpp:
    """llama.cpp through llama-cpp-python, on the GGUF file itself."""

    def __init__(self, source: Path, threads: int | None):
        if Path(source).suffix != ".gguf":
            raise PeerUnavailable("llama.cpp runs a .gguf file; pass --model FILE.gguf")
        llama_cpp = _import("llama_cpp")
        self.llm = llama_cpp.Llama(model_path=str(source), n_ctx=2048, n_threads=_threads(threads),
                                   n_threads_batch=_threads(threads), verbose=False)
        self.note = f"llama-cpp-python {llama_cpp.__version__} on {Path(source).name}"

    def generate(self, ids: list[int], n: int) -> list[int]:
        out = []
        for token in self.llm.generate(ids, temp=0.0, top_k=1, reset=True):
            out.append(int(token))
            if len(out) == n:
                break
        return out

    def close(self) -> None:
        self.llm.close()


class Transformers:
    """Hugging Face `generate` (fp32, PyTorch), or Optimum's ORTModelForCausalLM over its ONNX export."""

    def __init__(self, source: Path, cache: Path, optimum: bool, threads: int | None):
        torch = _import("torch")
        torch.set_num_threads(_threads(threads))
        hf = hf_directory(source, cache)
        if optimum:
            ort_models = _import("optimum.onnxruntime")
            exported = cache / f"optimum-{hf.name}"
            if not (exported / "config.json").is_file():
                ort_models.ORTModelForCausalLM.from_pretrained(hf, export=True).save_pretrained(exported)
            self.model = ort_models.ORTModelForCausalLM.from_pretrained(exported)
            self.note = "Optimum ORTModelForCausalLM (ONNX Runtime, fp32, its own export)"
        else:
            transformers = _import("transformers")
            self.model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
            self.note = f"transformers {transformers.__version__} generate, fp32"
        self.torch = torch

    def generate(self, ids: list[int], n: int) -> list[int]:
        x = self.torch.tensor([ids])
        with self.torch.no_grad():
            out = self.model.generate(x, attention_mask=self.torch.ones_like(x), max_new_tokens=n,
                                      min_new_tokens=n, do_sample=False)
        return [int(t) for t in out[0, len(ids):]]

    def close(self) -> None:
        self.model = None


def make(peer: str, source: Path, cache: Path, threads: int | None = None):
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    try:
        if peer.startswith("ortgenai-"):
            return OrtGenAI(source, cache, peer.split("-", 1)[1], threads)
        if peer == "llama.cpp":
            return LlamaCpp(source, threads)
        return Transformers(source, cache, optimum=peer == "optimum", threads=threads)
    except PeerUnavailable:
        raise
    except Exception as exc:  # a peer's own failure is reported in its row, not fatal to the run
        raise PeerUnavailable(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}") from None
