"""KV buffers are updated in place: ONNX Runtime never copies the cache per step."""
import numpy as np
import onnxruntime as ort

from specdeploy.bundle import io_names
from specdeploy.bundle import manifest as manifest_io
from specdeploy.backends.onnxruntime import load_stages, session_options
from specdeploy.runtime.split_model import SplitModel

COPY_WARNING = "in-place optimization not activated"


def test_aliased_kv_buffers_are_written_in_place(tiny_bundle, capfd):
    m = manifest_io.read(tiny_bundle)
    stages = load_stages(tiny_bundle, m, log_severity=1)
    model = SplitModel(m, stages)
    model.verify_pass(model.draft_pass([3, 4, 5], 0), 0)
    model.verify_pass(model.draft_pass([6], 3), 3)
    key0 = stages["draft"].kv_buffer("past_key.0")  # numpy view of the bound buffer
    assert np.abs(key0[0, :, :4]).sum() > 0 and np.abs(key0[0, :, 4:]).sum() == 0
    assert COPY_WARNING not in capfd.readouterr().err


def test_unaliased_binding_copies_the_cache(tiny_bundle, capfd):
    """Control: with separate past/present buffers ONNX Runtime warns that it copies."""
    m = manifest_io.read(tiny_bundle)
    graph = m.graph("draft")
    sess = ort.InferenceSession(str(tiny_bundle / graph.file), session_options(log_severity=1))
    feeds = {
        io_names.INPUT_IDS: np.array([[3]], np.int64), io_names.POSITION_IDS: np.array([[0]], np.int64),
        io_names.WRITE_INDEX: np.array([0], np.int64), io_names.ATTENTION_MASK: np.ones((1, 1), np.int64),
    }
    feeds.update({n: np.zeros(m.kv_shape, np.float32) for n in io_names.kv_inputs(graph.layers)})
    sess.run(None, feeds)
    assert COPY_WARNING in capfd.readouterr().err


def test_stage_outputs_reuse_buffers(tiny_bundle):
    m = manifest_io.read(tiny_bundle)
    model = SplitModel(m, load_stages(tiny_bundle, m))
    a = model.draft_pass([3], 0)
    b = model.draft_pass([4], 1)
    assert np.shares_memory(a, b)  # no per-step allocation of outputs


def test_pools_spin_inside_a_run_and_stop_after_it():
    """Spinning without the stop makes alternating sessions fight for the cores (2x slower)."""
    so = session_options(threads=2)
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert so.get_session_config_entry("session.force_spinning_stop") == "1"


def test_sessions_share_one_cpu_arena_by_default():
    """Without an arena the peak moved by 8 MB between identical runs (where glibc put each buffer)."""
    from specdeploy.backends import onnxruntime as backend

    shared = session_options()
    assert shared.enable_cpu_mem_arena and shared.get_session_config_entry("session.use_env_allocators") == "1"
    assert backend.register_shared_arena.cache_info().currsize == 1  # registered once per process


def test_a_long_pass_hands_the_arena_back_and_computes_the_same(tiny_bundle, monkeypatch):
    from specdeploy.backends import onnxruntime as backend

    m = manifest_io.read(tiny_bundle)
    prompt = [3, 4, 5, 6, 7]
    plain = SplitModel(m, load_stages(tiny_bundle, m)).draft_pass(prompt, 0).copy()
    monkeypatch.setattr(backend, "SHRINK_AFTER_ROWS", len(prompt) - 1)
    stage = load_stages(tiny_bundle, m)["draft"]
    seen = []
    run = stage.session.run_with_iobinding
    monkeypatch.setattr(stage.session, "run_with_iobinding", lambda binding, options=None: (
        seen.append(options), run(binding, options))[1])
    model = SplitModel(m, {**load_stages(tiny_bundle, m), "draft": stage})
    shrunk = model.draft_pass(prompt, 0).copy()  # the stage's output buffers are reused by the next pass
    model.draft_pass([8], len(prompt))
    assert np.array_equal(shrunk, plain)
    assert seen[0].get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0" and seen[1] is None


def test_without_an_arena_nothing_is_shrunk(tiny_bundle, monkeypatch):
    from specdeploy.backends import onnxruntime as backend

    original = backend.session_options

    def without_arena(*args, **kwargs):  # as lab/scripts/arena_ab.py measures against
        so = original(*args, **kwargs)
        so.enable_cpu_mem_arena = False
        so.add_session_config_entry("session.use_env_allocators", "0")
        return so

    monkeypatch.setattr(backend, "session_options", without_arena)
    m = manifest_io.read(tiny_bundle)
    assert all(stage.shrink is None for stage in load_stages(tiny_bundle, m).values())
