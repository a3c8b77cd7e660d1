"""Shared fixtures: tiny random models built in-process, exported once per test session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_GGUF = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
VOCAB = 96
CHAT_TEMPLATE = (
    "{% for m in messages %}w2 {{ m['content'] }} w3 {% endfor %}"
    "{% if add_generation_prompt %}w4{% endif %}"
)


TINY = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    initializer_range=0.3, bos_token_id=0, eos_token_id=1,
)


def tiny_config(arch: str):
    import transformers

    common = TINY
    configs = {
        "llama": lambda: transformers.LlamaConfig(tie_word_embeddings=True, **common),
        "mistral": lambda: transformers.MistralConfig(sliding_window=None, **common),
        "qwen2": lambda: transformers.Qwen2Config(tie_word_embeddings=False, **common),
        "qwen3": lambda: transformers.Qwen3Config(head_dim=16, **common),
        # each family's own mechanisms switched on; windows smaller than the test prompts
        "llama3": lambda: transformers.LlamaConfig(tie_word_embeddings=True, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16}, **common),
        "gemma2": lambda: transformers.Gemma2Config(
            head_dim=16, sliding_window=4, final_logit_softcapping=5.0, attn_logit_softcapping=3.0,
            query_pre_attn_scalar=16, **common),
        "gemma3_text": lambda: transformers.Gemma3TextConfig(
            head_dim=16, sliding_window=4, query_pre_attn_scalar=16, final_logit_softcapping=8.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"], **common),
        "phi3": lambda: transformers.Phi3Config(
            pad_token_id=0, partial_rotary_factor=0.5, original_max_position_embeddings=256,
            rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],
                          "long_factor": [2.0, 2.5, 3.0, 3.5]}, **common),
        "smollm3": lambda: transformers.SmolLM3Config(no_rope_layer_interval=2, pad_token_id=0, **common),
        "granite": lambda: transformers.GraniteConfig(
            embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=4.0, **common),
        "olmo2": lambda: transformers.Olmo2Config(**common),
    }
    return configs[arch]()


def save_tiny_model(arch: str, directory: Path, seed: int = 0, config=None) -> Path:
    """A random model plus a word-level tokenizer ('w0' .. 'w95') and a chat template."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config or tiny_config(arch)).eval()
    model.save_pretrained(directory)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w5"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="w0", eos_token="w1", unk_token="w5"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return directory


def export_tiny(arch: str, root: Path, exit_layer: int = 2, **options) -> Path:
    from specdeploy.export import ExportConfig, export

    model_dir = save_tiny_model(arch, root / f"{arch}-model")
    options = {"max_context": 128, **options}
    config = ExportConfig(source=model_dir, exit_layer=exit_layer, output=root / f"{arch}-bundle", **options)
    return export(config)


HEAD_SHAPE = dict(hidden_size=32, target_hidden_size=32, intermediate_size=48, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, vocab_size=VOCAB, draft_vocab_size=40,
                  feature_layers=(2, 3, 5), target_num_layers=8, rope_theta=500000.0)


@pytest.fixture
def head_config():
    """A small feature head's shape (feature_head/config.py)."""
    from specdeploy.feature_head.config import HeadConfig

    return HeadConfig(**HEAD_SHAPE)


@pytest.fixture
def head_tensors(head_config) -> dict:
    """Random tensors of that head in the EAGLE-3 layout, over a random draft vocabulary."""
    import numpy as np

    from specdeploy.feature_head import eagle3

    rng = np.random.default_rng(0)
    out = {k: rng.standard_normal(s).astype(np.float32) for k, s in eagle3.shapes(head_config).items()
           if k not in ("d2t", "t2d")}
    ids = np.sort(rng.choice(head_config.vocab_size, head_config.draft_vocab_size, replace=False))
    out["d2t"], out["t2d"] = eagle3.vocab_maps(ids, head_config.vocab_size)
    return out


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(tmp_path_factory):
    """The tiny random Llama and its word-level tokenizer, loaded as export loads a model."""
    from specdeploy.export.arch import load

    return load(save_tiny_model("llama", tmp_path_factory.mktemp("tiny-hf") / "llama-model"))


@pytest.fixture(scope="session")
def head_bundle(tmp_path_factory):
    """The tiny Llama exported with a random EAGLE-3 head (features from layers 1, 2, 3), and the head."""
    import numpy as np

    from specdeploy.feature_head import eagle3
    from specdeploy.feature_head.config import HeadConfig

    root = tmp_path_factory.mktemp("feature-head")
    config = HeadConfig(hidden_size=64, target_hidden_size=64, intermediate_size=48, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, vocab_size=96, draft_vocab_size=40,
                        feature_layers=(1, 2, 3), target_num_layers=4, rms_norm_eps=1e-6)
    rng = np.random.default_rng(3)
    tensors = {k: (0.2 * rng.standard_normal(s)).astype(np.float32) for k, s in eagle3.shapes(config).items()
               if k not in ("d2t", "t2d")}
    tensors["d2t"], tensors["t2d"] = eagle3.vocab_maps(np.sort(rng.choice(96, 40, replace=False)), 96)
    eagle3.write(root / "head", config, tensors)
    eagle3.write_acceptance(root / "head", {"per_position": [0.5, 0.25], "tau": 1.625, "training_positions": 1000})
    return export_tiny("llama", root, feature_head=root / "head"), root / "head"


@pytest.fixture(scope="session")
def tiny_config_for():
    """tiny_config as a fixture: a test module's `from conftest import ...` can find another
    directory's conftest once several are loaded (tests/serve has one)."""
    return tiny_config


@pytest.fixture(scope="session")
def export_tiny_for():
    """export_tiny as a fixture (a module's `from conftest import ...` may find another directory's conftest)."""
    return export_tiny


@pytest.fixture(scope="session")
def checkpoint_script():
    """scripts/make_checkpoint.py as a module (it is a script, not part of the package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "make_checkpoint.py"
    spec = importlib.util.spec_from_file_location("make_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    """An exported tiny Llama bundle (exit layer 2 of 4, context 128)."""
    return export_tiny("llama", tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def features_bundle(tmp_path_factory) -> Path:
    """The tiny Llama exported with the features a feature head reads (`export --features`)."""
    return export_tiny("llama", tmp_path_factory.mktemp("features"), head_features=True)


@pytest.fixture(scope="session")
def long_bundle(tmp_path_factory) -> Path:
    """The tiny Llama with a 4096-token context: generations long enough to cancel midway."""
    return export_tiny("llama", tmp_path_factory.mktemp("long"), max_context=4096)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_bundle) -> Path:
    return tiny_bundle.parent / "llama-model"


@pytest.fixture(scope="session")
def tiny_engine(tiny_bundle):
    from specdeploy.runtime.engine import Engine

    engine = Engine(tiny_bundle)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def example_bundle(tmp_path_factory) -> Path:
    """The real example model (SmolLM2-135M-Instruct) exported at exit layer 8, fp32 (the reference
    its quantized bundles are measured against)."""
    if not EXAMPLE_GGUF.is_file():
        pytest.skip(f"example model not fetched ({EXAMPLE_GGUF}); run scripts/fetch_model.sh")
    from specdeploy.export import ExportConfig, export

    prebuilt = os.environ.get("SPECDEPLOY_EXAMPLE_BUNDLE")
    if prebuilt and (Path(prebuilt) / "manifest.json").is_file():
        return Path(prebuilt)
    out = tmp_path_factory.mktemp("example") / "engine.plan"
    return export(ExportConfig(source=EXAMPLE_GGUF, exit_layer=8, max_context=1024, output=out, precision="fp32"))


def _has_gpu() -> bool:
    try:
        from cuda.bindings import runtime as cudart

        err, count = cudart.cudaGetDeviceCount()
        return int(err) == 0 and count > 0
    except Exception:
        return False


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true",
                     help="also run the `long` end-to-end tests (minutes each; the default set keeps the suite short)")


def pytest_configure(config):
    _pin_xdist_worker()


def _pin_xdist_worker() -> None:
    """Under `-n N` on N or more CPUs, each worker runs on its own share of them. Every ONNX Runtime
    session spins one thread per CPU it may use between kernels; two workers each spinning on both
    CPUs of a 2-core machine took turns on them instead of running side by side."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not worker or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= count:
        os.sched_setaffinity(0, cpus[int(worker.removeprefix("gw")) :: count])


def _end_to_end_files_first(items) -> None:
    """Files holding `slow` (end-to-end) tests first, then by test count, each file's tests in order.

    The test command hands out whole files in this order (`--dist loadfile --no-loadscope-reorder`).
    The end-to-end files run minutes each (the example model's and Gemma 3's exports); started last,
    one ran on a worker while the other sat idle, and the shorter files fill in around them instead.
    """
    from collections import Counter

    count, first = Counter(item.path for item in items), {}
    for index, item in enumerate(items):
        first.setdefault(item.path, index)
    slow = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("long")}
    items.sort(key=lambda item: (item.path not in slow, -count[item.path], first[item.path]))


NOT_UNIT = ("slow", "long", "integration", "triton", "gpu", "tensorrt")  # `-m unit`: every test without these


def pytest_collection_modifyitems(config, items):
    """`gpu` / `tensorrt` tests skip cleanly where the hardware or package is absent, `long` ones
    unless asked for; the end-to-end files are scheduled first."""
    import importlib.util

    _end_to_end_files_first(items)

    gpu = _has_gpu()
    trt = importlib.util.find_spec("tensorrt") is not None
    long = config.getoption("--long")
    for item in items:
        if not any(item.get_closest_marker(m) for m in NOT_UNIT):
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("long") and not long:  # the marker, not a test or parameter named so
            item.add_marker(pytest.mark.skip(reason="a long end-to-end run: `scripts/test.sh --long` runs it"))
        if item.get_closest_marker("gpu") and not gpu:  # markers, not tests or parameters named so
            item.add_marker(pytest.mark.skip(reason="no NVIDIA GPU with a working CUDA driver"))
        if item.get_closest_marker("tensorrt") and not trt:
            item.add_marker(pytest.mark.skip(reason="the tensorrt package is not installed"))
