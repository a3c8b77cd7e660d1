"""Each supported family on a tiny random model with its own mechanisms switched on.

Gemma 2 / 3: sliding windows of 4 (prompts are longer, drafts cross the edge), soft-capping, Gemma 3's
per-layer RoPE bases; Phi-3: LongRoPE factors and partial rotary; SmolLM3: NoPE layers; Granite:
embedding / residual / attention / logit multipliers; OLMo 2: post-norms and QK-norm; Llama 3 RoPE.
"""
import numpy as np
import pytest
import torch
import transformers

from conftest import TINY, export_tiny, save_tiny_model, tiny_config
from distribution import CHI2_999_10DOF, histogram, homogeneity_chi2
from specdeploy.bundle import manifest as manifest_io
from specdeploy.config import GenerationConfig
from specdeploy.errors import UnsupportedModelError
from specdeploy.export import ExportConfig, export
from specdeploy.quantization.quality import teacher_forced_logits
from specdeploy.runtime.engine import Engine

pytestmark = pytest.mark.integration  # servers, a browser, real models or every family: not the fast tier

FAMILIES = ["gemma2", "gemma3_text", "phi3", "smollm3", "granite", "olmo2", "llama3"]
PROMPTS = [[5, 17, 33, 8, 61, 2, 90, 41, 12, 13, 14], [3, 4, 5, 6, 7, 8, 9, 10], [40, 41, 42, 43, 44, 45]]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    bundle = export_tiny(request.param, root, exit_layer=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(root / f"{request.param}-model").eval()
    return request.param, bundle, model


def test_split_equals_the_unsplit_model_and_validates(family):
    arch, bundle, model = family
    assert max(manifest_io.read(bundle).extra["validation_max_abs_diff"].values()) < 1e-3
    with Engine(bundle) as engine:
        for ids in PROMPTS:
            with torch.no_grad():
                theirs = model(torch.tensor([ids])).logits[0].double().numpy()
            assert np.abs(teacher_forced_logits(engine, ids) - theirs).max() < 1e-4, arch


def _hf_greedy(model, prompt, n):
    """The unsplit model's greedy continuation, EOS included as a token (as `ignore_eos` decodes it);
    `generate(min_new_tokens=...)` would instead suppress EOS."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_greedy_speculative_equals_plain_equals_hugging_face(family):
    arch, bundle, model = family
    with Engine(bundle) as engine:
        for prompt in PROMPTS:
            expected = _hf_greedy(model, prompt, 24)
            base = dict(max_new_tokens=24, ignore_eos=True)
            assert engine.generate_ids(prompt, GenerationConfig(speculative=False, **base)) == expected, arch
            for source in ("early_exit", "lookup", "hybrid"):
                for gamma in (2, 5):  # 5 drafted rows cross a window of 4 inside one verify pass
                    config = GenerationConfig(num_draft_tokens=gamma, draft_source=source, **base)
                    assert engine.generate_ids(prompt, config) == expected, (arch, source, gamma)


@pytest.mark.parametrize("arch", ["gemma3_text", "granite"])
@pytest.mark.parametrize("exit_layer", [1, pytest.param(3, marks=pytest.mark.long)])
def test_other_exit_layers_stay_exact(arch, exit_layer, tmp_path):
    bundle = export_tiny(arch, tmp_path, exit_layer=exit_layer, validate=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / f"{arch}-model").eval()
    with Engine(bundle) as engine:
        spec = engine.generate_ids(PROMPTS[0], GenerationConfig(max_new_tokens=20, num_draft_tokens=4,
                                                                draft_source="early_exit", ignore_eos=True))
    assert spec == _hf_greedy(model, PROMPTS[0], 20)


@pytest.mark.parametrize("arch", ["gemma2", "granite"])
def test_sampling_keeps_the_distribution(arch, tmp_path):
    bundle = export_tiny(arch, tmp_path, exit_layer=2, validate=False)
    with Engine(bundle) as engine:
        prompt = [10, 11, 12, 13, 14, 15]  # longer than the window
        plain = histogram(engine, prompt, 500, temperature=1.0, speculative=False)
        spec = histogram(engine, prompt, 500, temperature=1.0, num_draft_tokens=3, draft_source="early_exit")
    assert homogeneity_chi2(plain, spec) < CHI2_999_10DOF


def test_int8_and_tensorrt_build_per_family(family, tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    from specdeploy.backends.tensorrt.build import BuildConfig, build_engines
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
    import fake_tensorrt

    import shutil

    arch, bundle, _ = family
    base = dict(max_new_tokens=20, ignore_eos=True)
    quantized = quantize(bundle, tmp_path / "int8", QuantizeOptions("int8", report=False), echo=lambda s: None)
    with Engine(quantized) as engine:
        plain = engine.generate_ids(PROMPTS[0], GenerationConfig(speculative=False, **base))
        assert engine.generate_ids(PROMPTS[0], GenerationConfig(num_draft_tokens=4, **base)) == plain
    # the fake executes graphs in plain ONNX Runtime, so it is compared on the fp32 graphs
    fp32 = tmp_path / "fp32"
    shutil.copytree(bundle, fp32)
    fake_tensorrt.install(monkeypatch)
    build_engines(fp32, BuildConfig(max_draft_tokens=4, max_prompt=32), echo=lambda s: None)
    with Engine(fp32) as engine:
        expected = engine.generate_ids(PROMPTS[0], GenerationConfig(speculative=False, **base))
    with Engine(fp32, backend="tensorrt") as engine:
        assert engine.generate_ids(PROMPTS[0], GenerationConfig(num_draft_tokens=4, **base)) == expected


@pytest.mark.parametrize("arch", [  # soft-capping, windows, LongRoPE
    "gemma3_text", pytest.param("gemma2", marks=pytest.mark.long), pytest.param("phi3", marks=pytest.mark.long)])
def test_calibrated_bundles_are_exact(arch, tmp_path, monkeypatch):
    from specdeploy.calibration.steps import CalibrationConfig

    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    model_dir = save_tiny_model(arch, tmp_path / "model")
    small = CalibrationConfig(gammas=(2, 3), exits=(2,), draft_vocab_size=48, max_new_tokens=12, train_steps=20,
                              measure_prompts=1, measure_tokens=8)
    bundle = export(ExportConfig(source=model_dir, exit_layer=None, num_draft_tokens=None, max_context=128,
                                 output=tmp_path / "cal"), lambda s: None, small)
    with Engine(bundle) as engine:
        assert "draft_head" in engine.manifest.graphs
        base = dict(max_new_tokens=24, ignore_eos=True)
        plain = engine.generate_ids(PROMPTS[0], GenerationConfig(speculative=False, **base))
        assert engine.generate_ids(PROMPTS[0], GenerationConfig(draft_source="early_exit", **base)) == plain


def test_unsupported_options_are_refused_by_name(tmp_path):
    dynamic = save_tiny_model("llama", tmp_path / "dynamic", config=transformers.LlamaConfig(
        rope_scaling={"rope_type": "dynamic", "factor": 2.0}, **TINY))
    with pytest.raises(UnsupportedModelError, match="rope type dynamic is not supported"):
        export(ExportConfig(source=dynamic, exit_layer=1, output=tmp_path / "o1"))
    model_dir = save_tiny_model("phi3", tmp_path / "phi3")
    with pytest.raises(UnsupportedModelError, match="LongRoPE.*--max-context 256"):
        export(ExportConfig(source=model_dir, exit_layer=1, max_context=512, output=tmp_path / "o2"))


def test_a_window_in_a_config_without_layer_types_slides_every_layer(tmp_path):
    """Mistral (and Phi-3) name a window but no layer types; Hugging Face's model slides every layer
    by it, so the split does too (a window of 4, shorter than the prompt)."""
    config = tiny_config("mistral")
    config.sliding_window = 4
    model_dir = save_tiny_model("mistral", tmp_path / "model", config=config)
    bundle = export(ExportConfig(source=model_dir, exit_layer=2, max_context=128, output=tmp_path / "bundle"))
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with Engine(bundle) as engine, torch.no_grad():
        theirs = model(torch.tensor([PROMPTS[0]])).logits[0].double().numpy()
        assert np.abs(teacher_forced_logits(engine, PROMPTS[0]) - theirs).max() < 1e-4
        plain = engine.generate_ids(PROMPTS[0], GenerationConfig(speculative=False, max_new_tokens=12, ignore_eos=True))
    assert plain == _hf_greedy(model, PROMPTS[0], 12)


def _fused_layers(graph) -> int:
    """Layers of an fp32 graph that quantize would make one GroupQueryAttention each."""
    import onnx

    from specdeploy.optimize import attention, fusion
    from specdeploy.quantization.rewrites import fold_weight_transposes

    model = onnx.load(str(graph))
    fold_weight_transposes(model)
    fusion.fuse_all(model)
    return attention.fuse_attention(model, 128)


@pytest.mark.parametrize("arch,window", [("mistral", 4), ("mistral", None), ("qwen3", None)])
def test_sliding_windows_and_per_head_norms_become_the_kernel_too(arch, window, tmp_path):
    """Mistral with a window (which slides every layer, above) gets the kernel's local window;
    Qwen3's per-head QK-norm sits between the head split and the rotary, so its q and k reach the
    kernel apart from v. Either way every layer is fused and the fused graphs compute what the
    split ones do, past the window too."""
    config = tiny_config(arch)
    config.sliding_window = window
    model_dir = save_tiny_model(arch, tmp_path / "model", config=config)
    bundle = export(ExportConfig(source=model_dir, exit_layer=2, max_context=128, output=tmp_path / "bundle"))
    fused, counts = _fused_copy(bundle, tmp_path / "fused")
    assert sum(c["attention"] for c in counts.values()) == TINY["num_hidden_layers"], counts
    with Engine(bundle) as engine, Engine(fused) as fused_engine:
        for ids in PROMPTS:
            expected = teacher_forced_logits(engine, ids)
            assert np.abs(teacher_forced_logits(fused_engine, ids) - expected).max() < 1e-4


def test_scatter_nd_kv_writes_fuse_too(tmp_path):
    """Opset-23 bundles (ONNX Runtime 1.23, Python 3.10) write KV rows with ScatterND: the same
    layers become the kernel, which writes the rows itself."""
    from specdeploy.optimize.gqa_probe import kernel_row_independent
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    bundle = export_tiny("llama", tmp_path, exit_layer=2, opset=23)
    assert _fused_layers(bundle / manifest_io.read(bundle).graph("verify").file) == 2
    if kernel_row_independent(4, 2, 16):
        out = quantize(bundle, tmp_path / "int4", QuantizeOptions("int4", report=False), echo=lambda s: None)
        assert manifest_io.read(out).fused_attention == {"draft": 2, "verify": 2}
        cfg = dict(max_new_tokens=30, ignore_eos=True)
        with Engine(out) as engine:
            plain = engine.generate_ids([4, 5, 6], GenerationConfig(speculative=False, **cfg))
            assert engine.generate_ids([4, 5, 6], GenerationConfig(num_draft_tokens=4, **cfg)) == plain


def test_biased_q_k_v_split_into_heads_and_one_attention_kernel(tmp_path):
    """Qwen2's q / k / v carry biases: their three Adds become one before the Split, so the layer
    still splits into heads in three kernels and its attention is one kernel; the fused graphs
    compute what the split ones do."""
    bundle = export_tiny("qwen2", tmp_path, exit_layer=2)
    fused, counts = _fused_copy(bundle, tmp_path / "fused")
    for key in ("split_biases", "head_split", "attention"):
        assert sum(c[key] for c in counts.values()) == TINY["num_hidden_layers"], (key, counts)
    with Engine(bundle) as engine, Engine(fused) as fused_engine:
        for ids in PROMPTS:
            expected = teacher_forced_logits(engine, ids)
            assert np.abs(teacher_forced_logits(fused_engine, ids) - expected).max() < 1e-4


def test_a_multimodal_gemma3_checkpoint_exports_its_text_decoder(tmp_path):
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=tiny_config("gemma3_text").to_dict(),
                                       vision_config=vision.to_dict(), mm_tokens_per_image=4)
    model_dir = save_tiny_model("gemma3", tmp_path / "mm", config=config)
    bundle = export(ExportConfig(source=model_dir, exit_layer=2, max_context=128, output=tmp_path / "b"))
    multimodal = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert manifest_io.read(bundle).model.architecture == "gemma3_text"
    with Engine(bundle) as engine:
        ids = PROMPTS[0]
        with torch.no_grad():
            theirs = multimodal(input_ids=torch.tensor([ids])).logits[0].double().numpy()
        assert np.abs(teacher_forced_logits(engine, ids) - theirs).max() < 1e-4
        spec = engine.generate_ids(ids, GenerationConfig(max_new_tokens=16, num_draft_tokens=4, ignore_eos=True))
    assert spec == _hf_greedy(multimodal, ids, 16)


def _fused_copy(bundle, target):
    """The bundle with its fp32 graphs through the fusions quantize makes (siblings, head splits and
    attention kernels too, still in float), and how many of each were made."""
    import shutil

    import onnx

    from specdeploy.optimize import attention, fusion
    from specdeploy.quantization.rewrites import fold_weight_transposes

    shutil.copytree(bundle, target)
    counts, manifest = {}, manifest_io.read(target)
    for name, graph in manifest.graphs.items():
        model = onnx.load(str(target / graph.file))
        fold_weight_transposes(model)  # as quantize_graph does first
        counts[name] = fusion.fuse_all(model)
        counts[name]["attention"] = attention.fuse_attention(model, manifest.max_context) if graph.kv_layers else 0
        onnx.save(model, str(target / graph.file), save_as_external_data=True, location=graph.file + ".data")
    fused = {name: c["attention"] for name, c in counts.items()}
    manifest_io.write(target, manifest.replace(kv_spare_rows=1, fused_attention={k: v for k, v in fused.items() if v}))
    return target, counts


ROTARY_LAYERS = {"smollm3": 2}  # NoPE every second layer: only two of four rotate
# layers whose attention becomes one kernel: every layer (Gemma 2's soft-capped scores and sliding
# layers, Gemma 3's QK-norm after the head split and per-type RoPE bases, OLMo 2's QK-norm over all
# heads, SmolLM3's NoPE layers without rotary) but Phi-3's (partial rotary: not the kernel's)
ATTENTION_LAYERS = {"phi3": 0}


def test_fused_graphs_compute_what_the_split_graphs_do(family, tmp_path):
    arch, bundle, _ = family
    fused, counts = _fused_copy(bundle, tmp_path / "fused")
    rotary = sum(c["rotary"] for c in counts.values())
    assert rotary == 2 * ROTARY_LAYERS.get(arch, TINY["num_hidden_layers"]), (arch, counts)  # q and k
    if arch == "llama3":  # q/k/v without biases or per-head norms: every layer's split into heads
        assert sum(c["head_split"] for c in counts.values()) == TINY["num_hidden_layers"], counts
    assert sum(c["attention"] for c in counts.values()) == ATTENTION_LAYERS.get(arch, TINY["num_hidden_layers"]), \
        (arch, counts)
    with Engine(bundle) as engine, Engine(fused) as fused_engine:
        for ids in PROMPTS:
            expected = teacher_forced_logits(engine, ids)
            assert np.abs(teacher_forced_logits(fused_engine, ids) - expected).max() < 1e-4, arch


def test_a_windowed_int4_bundle_is_exact_and_refused_where_the_window_counts_differently(tmp_path, monkeypatch):
    """Gemma 3's sliding layers quantized with fused attention: greedy speculative == plain past the
    window for every draft source; the bundle records how this ONNX Runtime counts the kernel's
    window, and an ONNX Runtime counting it otherwise (1.23 sees one key more) refuses to load it."""
    from specdeploy.backends import attention_window
    from specdeploy.errors import BackendError
    from specdeploy.optimize.gqa_probe import form_row_independent
    from specdeploy.optimize.attention_match import KernelForm
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    if not form_row_independent(KernelForm(4, 2, 16, packed=False, window=4)):
        pytest.skip("GroupQueryAttention's rows depend on the call on this machine")
    bundle = export_tiny("gemma3_text", tmp_path, exit_layer=2)
    out = quantize(bundle, tmp_path / "int4", QuantizeOptions("int4", report=False), echo=lambda s: None)
    m = manifest_io.read(out)
    assert m.fused_attention == {"draft": 2, "verify": 2}
    assert m.attention_window_shift == attention_window.shift()
    cfg = dict(max_new_tokens=24, ignore_eos=True)
    with Engine(out) as engine:
        plain = engine.generate_ids(PROMPTS[0], GenerationConfig(speculative=False, **cfg))
        for source in ("early_exit", "lookup", "hybrid"):
            spec = engine.generate_ids(PROMPTS[0], GenerationConfig(num_draft_tokens=4, draft_source=source, **cfg))
            assert spec == plain, source
    monkeypatch.setattr(attention_window, "shift", lambda: m.attention_window_shift + 1)
    with pytest.raises(BackendError, match="--attention ops"):
        Engine(out)
