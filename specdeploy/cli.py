"""Command line: parse options, build a config, call one library function per command."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

import click

from .constants import (TARGETS, DEFAULT_TARGET, BACKENDS, DEFAULT_BACKEND, DEFAULT_BUNDLE, DEFAULT_DRAFT_SOURCE, DEFAULT_LOOKUP_NGRAM,
                        DEFAULT_MAX_CONTEXT, DEFAULT_NUM_DRAFT_TOKENS, DEFAULT_PREFILL_CHUNK,
                        DEFAULT_INT4_KERNEL, DEFAULT_QUANT_METHOD, INT4_KERNEL_ALIASES, INT4_KERNELS, OPSETS,
                        PRECISIONS, PROVIDERS, QUANTIZED_PRECISIONS, QUANT_METHODS, QUARTER_EXIT, SOURCES)
from .errors import SpecDeployError

PRECISION = click.Choice(PRECISIONS)
SOURCE = click.Choice(SOURCES)
PROVIDER = click.Choice(PROVIDERS)
BACKEND = click.Choice(BACKENDS)
SOURCE_PRECISION = (" Default: the source's own (a quantized GGUF stays int4, or int8 for an 8-bit file, its blocks "
                    "carried losslessly; a Hugging Face directory fp32).")


INTERRUPT_RETRY_S = 0.2  # a signal that landed inside an import is taken again after this


class _Group(click.Group):
    """Turns every user error into one `Error: ...` line and a non-zero exit (no traceback)."""

    def invoke(self, ctx):
        previous = _interrupt_on_signals()
        try:
            return super().invoke(ctx)
        except (SpecDeployError, OSError) as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"Error: {_one_line(exc)}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _interrupt_on_signals() -> dict:
    """SIGTERM (a `kill`, a container stopping) handled as Ctrl-C, so that an export's or
    quantize's staging directory (tens of GB at 1.5B) is removed on the way out instead of left
    behind; Ctrl-C itself through the same handler (below), unless the shell had it ignored. The
    handlers they replace, or none off the main thread (serve's uvicorn installs its own)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    ours = [signal.SIGTERM] + [signal.SIGINT] * (signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    return {signum: signal.signal(signum, _interrupt) for signum in ours}


def _interrupt(signum, frame) -> None:
    """KeyboardInterrupt where the signal lands, unless that is inside a module's import: raised
    through an extension module's initialisation (torch.onnx imports its exporter on first use) it
    aborts the interpreter with nothing cleaned up, so the signal is sent again a moment later."""
    if _importing(frame):
        timer = threading.Timer(INTERRUPT_RETRY_S, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    raise KeyboardInterrupt


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _one_line(exc: Exception) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, SpecDeployError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}; check the path and its permissions"
    return " ".join(str(exc).split())


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.option("-v", "--verbose", is_flag=True, help="Log progress.")
@click.version_option(package_name="specdeploy")
@click.pass_context
def main(ctx, debug, verbose):
    """specdeploy: self-speculative decoding for small LLMs on edge devices."""
    ctx.obj = {"debug": debug}
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    for noisy in ("torch", "onnx_ir", "onnxscript", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _backend_options(f):
    f = click.option("--backend", type=BACKEND, default=DEFAULT_BACKEND, show_default=True)(f)
    return click.option("--provider", type=PROVIDER, default=None,
                        help="ONNX Runtime execution provider (default cpu); not for --backend tensorrt.")(f)


def _int_or_auto(value: str, name: str):
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{name} must be an integer or 'auto'") from None


def _precision_options(choices=PRECISION, default=None, required=False, default_help=""):
    def decorate(f):
        f = click.option("--verify-precision", type=PRECISION, default=None,
                         help="Override for the verify graph and head.")(f)
        f = click.option("--draft-precision", type=PRECISION, default=None,
                         help="Override for the draft graph and draft head.")(f)
        f = click.option("--method", type=click.Choice(QUANT_METHODS), default=DEFAULT_QUANT_METHOD,
                         show_default=True,
                         help="How int4/int8 blocks are rounded where a GGUF's own blocks do not carry over: "
                              "gptq (each row's error folded into the rows after it, against the calibration "
                              "text's activations: the lowest error, 97% top-1 on the example), minmax (each "
                              "32's [min, max] with a float offset), mse (per-block squared-error scales), rtn "
                              "(round to nearest: fast, lossy), or ort (ONNX Runtime's own quantizer for every "
                              "weight, GGUF or not; no exact TensorRT form at int8).")(f)
        f = click.option("--int4-kernel", type=click.Choice([*INT4_KERNELS, *INT4_KERNEL_ALIASES]),
                         default=DEFAULT_INT4_KERNEL, show_default=True,
                         help="What computes int4 weights (and an int8 GGUF's): specdeploy's own operators, reading "
                              "a GGUF's Q4_0 / Q4_1 / Q4_K / Q5_1 / Q5_K / Q6_K / Q8_0 blocks (and rtn / mse "
                              "rounding) in place from the weights file (no packed copy: faster and smaller where "
                              "decoding streams the weights; a library built here by build-kernels, or at first "
                              "use), or "
                              "matmulnbits: ONNX Runtime's own kernel (portable, nothing built; the CUDA form). "
                              "auto: specdeploy's where the library is built or a C compiler can build it. "
                              "q4_0 is specdeploy's earlier name.")(f)
        return click.option("--precision", type=choices, default=default, required=required,
                            help="int4/int8: integer compute (MatMulNBits); fp16/fp8: weight-only." + default_help)(f)
    return decorate


def _prompts_option(f):
    return click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        help="JSONL of extra calibration prompts: {\"prompt\": ...} or {\"messages\": [...]} per line.")(f)


def _ngram_option(default=DEFAULT_LOOKUP_NGRAM, purpose="recorded as the default"):
    return click.option("--lookup-ngram", nargs=2, type=int, default=default, show_default=default is not None,
                        metavar="MIN MAX", help=f"Suffix lengths lookup drafting matches (longest first), {purpose}.")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--exit-layer", default=None,
              help="Layer k to exit at (1..L-1), or 'auto' (calibrates and picks). Default: a quarter of the "
                   "layers (8 of 30): the early exit's drafts depend on it, the other drafters do not.")
@click.option("--num-draft-tokens", default=str(DEFAULT_NUM_DRAFT_TOKENS), show_default=True,
              help="Draft length γ recorded as the default, or 'auto'.")
@click.option("--max-context", default=DEFAULT_MAX_CONTEXT, show_default=True, help="KV buffer capacity in tokens.")
@click.option("--output", "-o", default=Path(DEFAULT_BUNDLE), type=click.Path(path_type=Path), show_default=True)
@click.option("--draft-source", type=SOURCE, default=DEFAULT_DRAFT_SOURCE, show_default=True,
              help="Default draft source recorded in the bundle (hybrid: lookup, else the faster of early exit and plain).")
@_ngram_option()
@click.option("--calibrate/--no-calibrate", default=False, help="Train an exit adapter and tune drafting (needs the export extra).")
@_precision_options(default_help=SOURCE_PRECISION)
@_prompts_option
@click.option("--no-validate", is_flag=True, help="Skip the ONNX Runtime vs PyTorch parity check.")
@click.option("--backend", type=BACKEND, default=DEFAULT_BACKEND, show_default=True,
              help="tensorrt: also build TensorRT engines here (needs a GPU and TensorRT).")
@click.option("--opset", type=click.Choice([str(o) for o in OPSETS]), default=None,
              help="24 (default) or 23: for ONNX Runtime 1.23, the newest on Python 3.10 (jetson-orin's default).")
@click.option("--feature-head", type=click.Path(path_type=Path), default=None,
              help="An EAGLE-3 head (train-head's output, or a published one) to add, with the features it reads (a bundle of any precision).")
@click.option("--features", "head_features", is_flag=True,
              help="Also output the residual stream a feature head reads (its default three layers), so that "
                   "`train-head --bundle` can teacher-force with this bundle's own graphs.")
@click.option("--target", type=click.Choice(TARGETS), default=DEFAULT_TARGET, show_default=True,
              help="What the graphs are made for: cpu (specdeploy's operators, fused attention), cuda (ONNX Runtime "
                   "GPU: MatMulNBits, attention as ops), tensorrt (also TensorRT's Q/DQ form), jetson-orin (that "
                   "form at opset 23, no fp8). GPU targets are checked against their kernel tables.")
@click.option("--sampling", "sampling", multiple=True, metavar="KEY=VALUE",
              help="A sampling default to record over the model's own (temperature, top_k, top_p, min_p, "
                   "repetition_penalty); used where a request says nothing. Repeatable.")
def export(model, exit_layer, num_draft_tokens, max_context, output, draft_source, lookup_ngram, calibrate, precision,
           draft_precision, verify_precision, method, int4_kernel, prompts_file, no_validate, backend, opset,
           feature_head, head_features, target, sampling):
    """Split MODEL (Hugging Face directory or .gguf) into a bundle of draft/verify graphs."""
    from .export import ExportConfig, export as run_export
    from .export.sampling_defaults import parse_options as parse_sampling

    config = ExportConfig(
        source=model, exit_layer=QUARTER_EXIT if exit_layer is None else _int_or_auto(exit_layer, "--exit-layer"),
        num_draft_tokens=_int_or_auto(num_draft_tokens, "--num-draft-tokens"),
        max_context=max_context, output=output, draft_source=draft_source, lookup_ngram=lookup_ngram,
        calibrate=calibrate, precision=precision, validate=not no_validate, prompts_file=prompts_file,
        draft_precision=draft_precision, verify_precision=verify_precision, method=method, backend=backend,
        opset=None if opset is None else int(opset), feature_head=feature_head, int4_kernel=int4_kernel,
        head_features=head_features, sampling=parse_sampling(sampling), target=target,
    )
    click.echo(f"bundle written to {run_export(config, echo=click.echo)}")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--exit-layer", default="auto", show_default=True, help="Exit layer k, or 'auto' to choose among candidates.")
@click.option("--num-draft-tokens", default="auto", show_default=True, help="Draft length γ, or 'auto'.")
@click.option("--max-context", default=DEFAULT_MAX_CONTEXT, show_default=True)
@click.option("--output", "-o", default=Path(DEFAULT_BUNDLE), type=click.Path(path_type=Path), show_default=True)
@_prompts_option
@_ngram_option()
@_precision_options(default_help=SOURCE_PRECISION)
def calibrate(model, exit_layer, num_draft_tokens, max_context, output, prompts_file, lookup_ngram, precision,
              draft_precision, verify_precision, method, int4_kernel):
    """Calibrate early exit (adapter, draft vocabulary, autotune) and export a bundle.

    MODEL is a Hugging Face directory, a .gguf file, or an existing bundle (re-calibrated from the
    model it was exported from)."""
    from .export import ExportConfig, export as run_export

    config = ExportConfig(
        source=model, exit_layer=_int_or_auto(exit_layer, "--exit-layer"),
        num_draft_tokens=_int_or_auto(num_draft_tokens, "--num-draft-tokens"),
        max_context=max_context, output=output, calibrate=True, precision=precision, lookup_ngram=lookup_ngram,
        prompts_file=prompts_file, draft_precision=draft_precision, verify_precision=verify_precision,
        method=method, int4_kernel=int4_kernel,
    )
    click.echo(f"calibrated bundle written to {run_export(config, echo=click.echo)}")


@main.command("train-head")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--data", required=True, type=click.Path(path_type=Path),
              help="Conversations, JSONL: {\"messages\": [...]} (OpenAI), {\"conversations\": [...]} (ShareGPT) or {\"text\": ...}.")
@click.option("--output", "-o", required=True, type=click.Path(path_type=Path), help="Directory for the head (EAGLE-3 format).")
@click.option("--tokens", default=300_000, show_default=True, help="Training positions (the model teacher-forced over them).")
@click.option("--steps", default=3000, show_default=True, help="Optimizer steps (8 windows of 256 positions each).")
@click.option("--draft-vocab", default=8192, show_default=True, help="Rows of the head's LM head (the likeliest tokens).")
@click.option("--intermediate-size", type=int, default=None, help="The head's MLP width (default: the model's).")
@click.option("--held-out", default=32, show_default=True, help="Conversations kept out of training to measure acceptance.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where training runs, and the PyTorch model's teacher-forcing when no --bundle is given.")
@click.option("--bundle", type=click.Path(path_type=Path), default=None,
              help="Teacher-force with this bundle's own graphs (exported from MODEL with --features): the "
                   "distribution the head will draft against (on the example, 1.2-1.5x the PyTorch model's positions a second on a CPU).")
def train_head_command(model, data, output, tokens, steps, draft_vocab, intermediate_size, held_out, device, bundle):
    """Train an EAGLE-style feature head for MODEL (a Hugging Face directory or .gguf) by distillation.

    Resumable: the model's features are cached, training checkpoints as it goes."""
    from .export.train_head import TrainConfig, TrainHeadConfig, train_head

    config = TrainHeadConfig(source=model, data=data, output=output, tokens=tokens, draft_vocab_size=draft_vocab,
                             intermediate_size=intermediate_size, train=TrainConfig(steps=steps),
                             held_out=held_out, device=device, bundle=bundle)
    path, measured = train_head(config, echo=click.echo)
    click.echo(f"head written to {path}; {measured.line()}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("prompt")
@click.option("--max-tokens", "--max-new-tokens", "max_tokens", default=128, show_default=True)
@click.option("--temperature", type=float, default=None,
              help="0 is greedy. Default: the bundle's sampling defaults (the model's own), else greedy.")
@click.option("--greedy", is_flag=True, help="Same as --temperature 0.")
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--min-p", type=float, default=None)
@click.option("--repetition-penalty", type=float, default=None, help="> 1 discourages repeats (1 is off).")
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--speculative/--plain", " /--no-speculation", default=None,
              help="Speculative (default, unless the bundle defaults to plain) or plain decoding.")
@click.option("--num-draft-tokens", type=int, default=None, help="Override the bundle's draft length.")
@click.option("--draft-source", type=SOURCE, default=None)
@_ngram_option(default=None, purpose="overriding the bundle's range")
@click.option("--chat/--raw", default=True, show_default=True, help="Wrap PROMPT in the chat template.")
@_backend_options
def generate(bundle, prompt, max_tokens, temperature, greedy, top_k, top_p, min_p, repetition_penalty, seed, stop,
             speculative, num_draft_tokens, draft_source, lookup_ngram, chat, provider, backend):
    """Generate text from PROMPT with BUNDLE, streaming it to stdout; a summary line goes to stderr."""
    from .config import GenerationConfig
    from .runtime.console import generate_to

    config = GenerationConfig(
        max_new_tokens=max_tokens, temperature=0.0 if greedy else temperature, top_k=top_k, top_p=top_p, seed=seed,
        min_p=min_p, repetition_penalty=repetition_penalty, stop=tuple(stop), speculative=speculative, num_draft_tokens=num_draft_tokens,
        draft_source=draft_source, lookup_ngram=lookup_ngram,
    )
    generate_to(bundle, prompt, config, lambda s: click.echo(s, nl=False),
                lambda s: click.echo(s, nl=False, err=True), chat=chat, provider=provider, backend=backend)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@_precision_options(choices=click.Choice(QUANTIZED_PRECISIONS), required=True)
@_prompts_option
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True,
              help="Where to write the quantized bundle (may be BUNDLE itself: replaced only once whole).")
@click.option("--tensorrt", is_flag=True,
              help="Also write the DequantizeLinear form of int4/int8 graphs that build-engines builds from.")
@click.option("--int4-block", type=click.Choice(["auto", "32", "16"]), default="auto", show_default=True,
              help="int4 block size; auto: 32 where the bundle is row-independent on this machine, else 16.")
@click.option("--two-rows", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="Hand int4 matmuls in blocks of 32 a padded second row where a one-row call is another kernel "
                   "(auto: where this CPU's is, e.g. AVX2 without VNNI; always: for a bundle made on a VNNI machine "
                   "for AVX2 devices; never: to measure what it costs).")
@click.option("--int4-head-bits", type=click.Choice(["8", "4"]), default="8", show_default=True,
              help="Bits of an int4 bundle's LM head where it is re-quantized (a GGUF's own head blocks carry "
                   "as they are; --method ort keeps 4): 8 keeps most of the quality, 4 is smaller and faster.")
@click.option("--no-fuse", is_flag=True,
              help="Keep the exported rotary, norm and matmul nodes unfused (to measure what fusing gains).")
@click.option("--float-outliers/--no-float-outliers", default=None,
              help="Compute activation outlier channels in float beside the integer matmuls (default: on for "
                   "int8, +1-2 points of top-1 at 8-10% of the speed; off for int4).")
@click.option("--exact-offsets", is_flag=True,
              help="Keep float offsets (a GGUF's Q4_1 / Q4_K minima, minmax / gptq) as an exact float32 term "
                   "beside each integer matmul instead of folding them into it (bitwise the file's minima; "
                   "slower).")
@click.option("--attention", type=click.Choice(["fused", "ops"]), default=None,
              help="int4/int8: fused: each layer's attention as one ONNX Runtime GroupQueryAttention kernel "
                   "(CPU provider; where its rows are independent here); ops: op by op. Default: the target's.")
@click.option("--target", type=click.Choice(TARGETS), default=DEFAULT_TARGET, show_default=True,
              help="What the graphs are made for (as export's --target); GPU targets are checked against their kernel tables.")
def quantize(bundle, precision, draft_precision, verify_precision, method, int4_kernel, prompts_file, output, tensorrt,
             int4_block, two_rows, int4_head_bits, no_fuse, float_outliers, exact_offsets, attention, target):
    """Write a quantized copy of the fp32 BUNDLE and print its quality report."""
    from .quantization.compute import ComputeOptions
    from .quantization.options import QuantizeOptions, for_target
    from .quantization.quantize import quantize as run_quantize

    compute = ComputeOptions(int4_block=None if int4_block == "auto" else int(int4_block), fuse=not no_fuse,
                             float_outliers=float_outliers, exact_offsets=exact_offsets,
                             fused_attention=attention != "ops", head_bits=int(int4_head_bits),
                             two_rows={"auto": None, "always": True, "never": False}[two_rows],
                             int4_kernel=int4_kernel)
    options = for_target(QuantizeOptions(precision, draft_precision, verify_precision, method, tensorrt, prompts_file,
                                         compute=compute), target, attention)
    path = run_quantize(bundle, output, options, click.echo)
    click.echo(f"quantized bundle written to {path}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--verify", is_flag=True, help="Also check every file's SHA-256 against the manifest (reads every byte).")
def inspect(bundle, verify):
    """Show what BUNDLE holds: model, split, graphs, precision, calibration, engines."""
    from .bundle.describe import describe

    click.echo(describe(bundle, verify))


@main.command("build-kernels")
@click.option("--include", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A folder holding ONNX Runtime's onnxruntime_c_api.h (else $ORT_INCLUDE_DIR, the system's, "
                   "or the fetched copy).")
@click.option("--fetch-headers", is_flag=True,
              help="Download ONNX Runtime's C API headers (Debian's libonnxruntime-dev, checked by SHA-256) first.")
def build_kernels_command(include, fetch_headers):
    """Build specdeploy's own ONNX Runtime operators for this machine (the q4_0 int4 kernel)."""
    from .kernels import build_here

    click.echo(build_here(include, fetch_headers))


@main.command("build-engines")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--max-draft-tokens", default=8, show_default=True, help="Largest draft length the decode profile covers.")
@click.option("--max-prompt", default=512, show_default=True,
              help="Rows the prefill profile covers; a longer prompt is prefilled in passes of this many.")
@click.option("--workspace-mb", default=2048, show_default=True)
def build_engines_command(bundle, max_draft_tokens, max_prompt, workspace_mb):
    """Build TensorRT engines for BUNDLE on this machine (engines are tied to the GPU and TensorRT version)."""
    from .backends.tensorrt.build import BuildConfig, build_engines

    build_engines(bundle, BuildConfig(max_draft_tokens, max_prompt, workspace_mb), echo=click.echo)
    click.echo(f"engines recorded in {bundle}/manifest.json; run with --backend tensorrt")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option("--max-queue", default=8, show_default=True, help="Requests that may wait; more get 429.")
@click.option("--model-name", default=None, help="Model id reported by /v1/models (default: the bundle's).")
@click.option("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK, show_default=True,
              help="Most prompt rows one prefill pass carries; lower it to bound a long prompt's peak memory.")
@click.option("--api-key", envvar="SPECDEPLOY_API_KEY", default=None,
              help="Answer 401 unless a request sends 'Authorization: Bearer KEY' (or set SPECDEPLOY_API_KEY).")
@click.option("--cors-origin", "cors_origins", multiple=True,
              help="Let browser pages from this origin call the API (repeatable; '*' for any). Off by default.")
@click.option("--prefix-reuse/--no-prefix-reuse", default=True, show_default=True,
              help="Prefill a request only from where it leaves the last one's tokens (a chat's history is kept).")
@_backend_options
def serve(bundle, host, port, max_queue, model_name, prefill_chunk, api_key, cors_origins, prefix_reuse, provider,
          backend):
    """Serve BUNDLE over an OpenAI-compatible HTTP API with a playground at /."""
    from .serve.server import ServeConfig, serve as run_server

    config = ServeConfig(bundle=bundle, host=host, port=port, max_queue=max_queue, model_name=model_name,
                         provider=provider, backend=backend, prefill_chunk=prefill_chunk, api_key=api_key,
                         cors_origins=tuple(cors_origins), prefix_reuse=prefix_reuse)
    run_server(config, ready=lambda: click.echo(f"serving {bundle} on http://{host}:{port} "
                                                f"(playground at /, API at /v1)"))


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSONL of {\"category\": ..., \"prompt\": ...} replacing the built-in set.")
@click.option("--quick", is_flag=True, help="One prompt per category, 32 tokens, one repeat (< 2 min).")
@click.option("--max-tokens", type=int, default=None, help="New tokens per prompt (default 64, quick 32).")
@click.option("--repeats", type=int, default=None, help="Repeats per mode (median; default 3).")
@click.option("--prompts-per-category", type=int, default=None)
@click.option("--greedy-only", is_flag=True, help="Skip the temperature-1 runs.")
@click.option("--compare", is_flag=True,
              help="Instead: BUNDLE (and --also bundles) beside ONNX Runtime GenAI, llama.cpp, Optimum and HF "
                   "generate on the same prompts, one run (needs --model; scripts/setup_peers.sh).")
@click.option("--also", "also", multiple=True, type=click.Path(path_type=Path),
              help="With --compare: more bundles to run (e.g. the int8 and int4 ones).")
@click.option("--peers", "peer_names", default=None,
              help="With --compare: comma-separated subset of ortgenai-fp32,ortgenai-int8,ortgenai-int4,llama.cpp,optimum,hf.")
@click.option("--sweep", is_flag=True, help="Sweep draft length (and --sweep-exits with --model).")
@click.option("--sweep-exits", default="", help="Comma-separated exit layers for --sweep.")
@click.option("--model", "model", type=click.Path(exists=True, path_type=Path), default=None,
              help="The source model (HF directory or .gguf) for --compare / --sweep-exits.")
@click.option("--lookup-ngram", nargs=2, type=int, default=None, metavar="MIN MAX",
              help="Lookup n-gram range for the lookup/hybrid runs and the bound (default: the bundle's).")
@click.option("--output-dir", "-o", type=click.Path(path_type=Path), default=Path("bench-results"), show_default=True)
@click.option("--no-plots", is_flag=True)
def bench(bundle, prompts_file, quick, max_tokens, repeats, prompts_per_category, greedy_only, compare, also,
          peer_names, sweep, sweep_exits, model, lookup_ngram, output_dir, no_plots):
    """Benchmark speculative vs plain decoding on BUNDLE (per category, greedy and T=1)."""
    from .bench.runner import BenchConfig, bench as run_bench
    from .bench.report import markdown

    if compare:
        from .bench.peers import compare_command

        compare_command(bundle, also, model, peer_names, max_tokens, repeats, prompts_per_category,
                        output_dir, not no_plots, click.echo)
        return
    try:
        exits = tuple(int(k) for k in sweep_exits.split(",") if k.strip())
    except ValueError:
        raise click.BadParameter("--sweep-exits must be comma-separated integers") from None
    options = dict(bundle=bundle, prompts_file=prompts_file, sweep=sweep,
                   sweep_exits=exits, compare_model=model, output_dir=output_dir, plots=not no_plots,
                   lookup_ngram=lookup_ngram)
    if greedy_only:
        options["temperatures"] = (0.0,)
    for key, value in (("max_new_tokens", max_tokens), ("repeats", repeats),
                       ("prompts_per_category", prompts_per_category)):
        if value is not None:
            options[key] = value
    config = BenchConfig.quick(**options) if quick else BenchConfig(**options)
    results, files = run_bench(config)
    click.echo(markdown(results))
    click.echo("wrote " + ", ".join(str(f) for f in files))


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="Model repository directory.")
@click.option("--name", default="specdeploy", show_default=True, help="Model name in the repository.")
@click.option("--instances", default=1, show_default=True, help="Engines per node (instance_group count).")
@click.option("--max-queue", default=8, show_default=True, help="Requests that may wait per instance.")
@click.option("--threads", type=int, default=None, help="ONNX Runtime threads per instance (default: every CPU the process may use).")
@click.option("--copy", is_flag=True, help="Copy the bundle into the repository instead of referencing it.")
@click.option("--site-packages", default=None,
              help="Extra import paths for Triton's Python stub (colon-separated), where specdeploy and numpy<2 live.")
@click.option("--manifests", type=click.Path(path_type=Path), default=None,
              help="Also write Kubernetes (Deployment, Service, autoscaler) and KServe manifests into this directory.")
@click.option("--image", default="specdeploy-triton:24.10", show_default=True,
              help="Container image for the manifests: Triton's plus specdeploy (see docs/serving.md).")
@click.option("--backend", type=BACKEND, default=DEFAULT_BACKEND, show_default=True,
              help="tensorrt: the bundle's TensorRT engines, instances on the GPU (build them on the device first).")
def triton(bundle, output, name, instances, max_queue, threads, copy, site_packages, manifests, image, backend):
    """Write a Triton Inference Server model repository (Python backend, decoupled) for BUNDLE."""
    from .triton.repository import TritonConfig, write_repository

    config = TritonConfig(bundle, output, name, instances, max_queue, threads, copy, site_packages, backend)
    click.echo(f"model repository written: {write_repository(config, manifests, image)}")


if __name__ == "__main__":
    main()
