"""specdeploy's Q4_0MatMul: GGUF's Q4_0 bytes in place, the product each form computes, rows
independent of the call, and bundles that use it kept exact."""
import ctypes
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from exactness import assert_early_exit_equals_plain

from specdeploy import kernels
from specdeploy.bundle import manifest as manifest_io
from specdeploy.errors import ConfigError
from specdeploy.quantization import nbits, operators, q4_0, q4_1, q4_k, q5, q6_k, q8
from specdeploy.quantization.compute import ComputeOptions
from specdeploy.quantization.options import QuantizeOptions
from specdeploy.quantization.quantize import quantize
from specdeploy.runtime.engine import Engine


@pytest.fixture(scope="module")
def library():
    """The operator library built here (scripts/setup.sh builds it; the headers may be missing on a
    machine set up otherwise)."""
    if kernels.find_include() is None and not kernels.library_path().is_file():
        pytest.skip("ONNX Runtime's C API header is not here: run `specdeploy build-kernels --fetch-headers`")
    return kernels.build()


def _blocks(rng, k: int = 256, n: int = 64) -> nbits.Blocks:
    w = rng.normal(size=(k, n)).astype(np.float32)
    return q4_0.half_scales(nbits.quantize(w, 4, 32, "absmax"))


def _model(blocks: nbits.Blocks, kind: str = "q4_0"):
    """x [1, S, K] @ W as one node: specdeploy's "q4_0", "q4_1", "q4_k", "q5_1", "q5_k", "q6_k" or "q8"
    operator, or "nbits" (MatMulNBits)."""
    from onnx import TensorProto, helper

    n, nb, block = blocks.q.shape
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, nb * block])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, n])
    model = helper.make_model(helper.make_graph([], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 24), helper.make_opsetid("com.microsoft", 1)])
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="m")
    makers = {"q4_0": q4_0.matmul_node, "q8": q8.matmul_node, "q4_1": q4_1.matmul_node, "q4_k": q4_k.matmul_node,
              "q6_k": q6_k.matmul_node, "q5_1": q5.Q5_1.matmul_node, "q5_k": q5.Q5_K.matmul_node,
              "nbits": lambda *args: nbits.matmul_node(*args, 4)}
    model.graph.node.append(makers[kind](model, node, "w", blocks))
    operators.use_domain(model)
    return model


def _session(model, library):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_a_gguf_q4_0_tensor_is_carried_as_its_own_bytes():
    """A Q4_0 tensor's blocks, matched by value, pack back into exactly the file's bytes (16 bytes
    of q + 8 and the float16 scale per 32 weights), sixteen columns interleaved four bytes at a time."""
    import gguf
    from gguf import quants

    from specdeploy.quantization.gguf_blocks import BlockIndex

    rng = np.random.default_rng(0)
    rows = rng.normal(size=(48, 128)).astype(np.float32)                          # [N, K] as stored
    raw = quants.quantize(rows, gguf.GGMLQuantizationType.Q4_0)                   # [48, 4 * 18]
    weight = np.ascontiguousarray(quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0).T)
    blocks = BlockIndex([raw], "Q4_0").blocks(weight, 32)
    assert q4_0.takes(blocks)
    qs, d = q4_0.pack(blocks)                                                     # [3, 4, 256], [3, 4, 16]
    file = raw.reshape(48, 4, 18)
    runs = qs.reshape(3, 4, 4, 16, 4).transpose(0, 3, 1, 2, 4)                    # [group, column, block, run, 4]
    np.testing.assert_array_equal(runs.reshape(48, 4, 16), file[..., 2:])
    np.testing.assert_array_equal(d.transpose(0, 2, 1).reshape(48, 4).view(np.uint16),
                                  file[..., :2].copy().view(np.uint16)[..., 0])
    back = q4_0.unpack(qs, d)
    np.testing.assert_array_equal(back.q, blocks.q)
    np.testing.assert_array_equal(back.scales, blocks.scales)


def test_only_symmetric_blocks_of_32_with_float16_scales_go_to_the_operator():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(64, 32)).astype(np.float32)
    assert not q4_0.takes(nbits.quantize(w, 4, 32, "absmax"))       # float32 scales
    assert q4_0.takes(q4_0.half_scales(nbits.quantize(w, 4, 32, "absmax")))
    assert not q4_0.takes(q4_0.half_scales(nbits.quantize(w, 4, 16, "absmax")))
    assert not q4_0.takes(q4_0.half_scales(nbits.quantize(w, 4, 32, "minmax")))  # float offsets
    assert not q4_0.takes(q4_0.half_scales(nbits.quantize(w[:, :24], 4, 32, "absmax")))  # N % 16


def test_the_operator_computes_x_at_w_as_closely_as_matmulnbits_with_rows_independent(library):
    """Both quantize each activation row to int8 per block of 32; each of 9 rows (two tiles of four
    and one alone) is bitwise the row computed alone."""
    rng = np.random.default_rng(2)
    blocks = _blocks(rng)
    ours, theirs = _session(_model(blocks), library), _session(_model(blocks, "nbits"), library)
    x = rng.normal(size=(1, 9, 256)).astype(np.float32)
    want = x @ blocks.dequantize()
    error = lambda s: np.abs(s.run(None, {"x": x})[0] - want).max() / np.abs(want).max()  # noqa: E731
    assert error(ours) < 0.02 and error(ours) < 2 * error(theirs)
    many = ours.run(None, {"x": x})[0]
    alone = np.concatenate([ours.run(None, {"x": x[:, i:i + 1]})[0] for i in range(9)], axis=1)
    np.testing.assert_array_equal(many, alone)


@pytest.mark.parametrize("k", [256, 96, 2112])   # an even and an odd number of blocks; more than a stretch's 64
def test_the_8_bit_operator_computes_what_matmulnbits_does_with_rows_independent(library, k):
    """Q8MatMul over MatMulNBits' own 8-bit bytes: both quantize each activation row to int8 per
    block of 32 and take exact integer dots, so they agree to float rounding; each of 9 rows is
    bitwise the row alone."""
    rng = np.random.default_rng(5)
    blocks = nbits.quantize(rng.normal(size=(k, 40)).astype(np.float32), 8, 32, "absmax")
    ours, theirs = _session(_model(blocks, "q8"), library), _session(_model(blocks, "nbits"), library)
    x = rng.normal(size=(1, 9, k)).astype(np.float32)
    want = x @ blocks.dequantize()
    mine = ours.run(None, {"x": x})[0]
    assert np.abs(mine - want).max() < 0.01 * np.abs(want).max()
    np.testing.assert_allclose(mine, theirs.run(None, {"x": x})[0], rtol=0, atol=1e-4 * np.abs(want).max())
    alone = np.concatenate([ours.run(None, {"x": x[:, i:i + 1]})[0] for i in range(9)], axis=1)
    np.testing.assert_array_equal(mine, alone)


@pytest.mark.parametrize("kind", ["q4_0", "q8"])
def test_a_bias_add_after_an_operator_becomes_its_input_with_the_same_sums(library, kind):
    """Qwen2's q / k / v biases: the Add goes (one kernel fewer a layer) and every value is the one
    the Add computed, bitwise."""
    from onnx import numpy_helper

    rng = np.random.default_rng(7)
    blocks = _blocks(rng) if kind == "q4_0" else nbits.quantize(rng.normal(size=(256, 64)).astype(np.float32), 8, 32, "absmax")
    model = _model(blocks, kind)
    model.graph.node[0].output[0] = "product"
    model.graph.initializer.append(numpy_helper.from_array(rng.normal(size=64).astype(np.float32), "b"))
    model.graph.node.append(__import__("onnx").helper.make_node("Add", ["product", "b"], ["y"], name="bias"))
    x = rng.normal(size=(1, 5, 256)).astype(np.float32)
    apart = _session(model, library).run(None, {"x": x})[0]
    assert operators.fuse_biases(model) == 1
    assert [n.op_type for n in model.graph.node] == [q4_0.OP if kind == "q4_0" else q8.OP]
    np.testing.assert_array_equal(_session(model, library).run(None, {"x": x})[0], apart)


def _cpu_has(flag: str) -> bool:
    info = Path("/proc/cpuinfo")
    return info.is_file() and f" {flag} " in f" {info.read_text()} ".replace("\n", " ")


FORMS = {"avx2": ("-march=x86-64-v3", "avx2"), "c": ("-march=x86-64", None)}


def _k_quant(checkpoint_script, rng, k: int, n: int, kind: str = "Q4_K") -> nbits.Blocks:
    """A GGUF Q4_1, Q5_1, Q4_K, Q5_K or Q6_K tensor's blocks, as export carries them (K-quants by our
    writer, Q4_1 and Q5_1 by gguf's)."""
    import gguf
    from gguf import quants

    from specdeploy.quantization.gguf_blocks import BlockIndex

    values = rng.normal(size=(n, k)).astype(np.float32)
    raw = quants.quantize(values, getattr(gguf.GGMLQuantizationType, kind)) if kind in ("Q4_1", "Q5_1") else \
        getattr(checkpoint_script, f"{kind.lower()}_bytes")(values)
    weight = np.ascontiguousarray(quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).T)   # [K, N]
    return BlockIndex([raw], kind).blocks(weight, 32)


K_QUANTS = {"Q4_1": q4_1, "Q4_K": q4_k, "Q5_1": q5.Q5_1, "Q5_K": q5.Q5_K, "Q6_K": q6_k}


@pytest.mark.parametrize("form", ["native", *sorted(FORMS)])
def test_every_form_quantizes_activations_to_the_same_bytes(library, form):
    """Each row's int8 blocks as the operators take them: d = max|x| / 127 and x / d rounded to
    nearest even (ties included), in float32, whatever form the compiler built."""
    import platform

    if form != "native" and (platform.machine() not in ("x86_64", "AMD64") or
                             (FORMS[form][1] and not _cpu_has(FORMS[form][1]))):
        pytest.skip(f"the {form} form is an x86-64 build this CPU cannot run")
    flags = kernels.FLAGS if form == "native" else tuple(FORMS[form][0] if f == "-march=native" else f
                                                         for f in kernels.FLAGS)
    lib = ctypes.CDLL(str(kernels.build(flags=flags)))
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3, 96)).astype(np.float32)
    x[0, :32] = np.arange(32) - 15.5            # with 127 beside them d = 1: 31 exact halves,
    x[0, 0] = 127.0                             # rounded to even (-14.5 -> -14, -13.5 -> -14, ...)
    x[1, :32] = np.linspace(-127, 127, 32)
    x[2, 32:64] = 0.0                           # a block of zeros: d = 0, q = 0
    xq, xd, xs = np.zeros((3, 96), np.int8), np.zeros((3, 3), np.float32), np.zeros((3, 3), np.int32)
    pointer = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    lib.quantize_activations(pointer(x), ctypes.c_int64(3), ctypes.c_int64(96), pointer(xq), pointer(xd), pointer(xs))
    blocks = x.reshape(3, 3, 32)
    d = np.abs(blocks).max(-1) / np.float32(127)                                       # [3, 3] float32
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8)                                # half to even
    assert d[0, 0] == 1 and not np.array_equal(q[0, 0], np.trunc(blocks[0, 0] + np.sign(blocks[0, 0]) * 0.5))
    np.testing.assert_array_equal(xd, d)
    np.testing.assert_array_equal(xq.reshape(3, 3, 32), q)
    np.testing.assert_array_equal(xs, q.astype(np.int32).sum(-1))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_of_the_kernel_computes_the_product_with_rows_independent(library, form, checkpoint_script):
    """The AVX2 and plain C forms (what a machine without AVX-512 VNNI builds), through the
    library's own entry point: the same product within int8 activations' error, each row alone."""
    import platform

    march, needs = FORMS[form]
    if platform.machine() not in ("x86_64", "AMD64") or (needs and not _cpu_has(needs)):
        pytest.skip(f"the {form} form is an x86-64 build this CPU cannot run")
    flags = tuple(march if f == "-march=native" else f for f in kernels.FLAGS)
    lib = ctypes.CDLL(str(kernels.build(flags=flags)))
    lib.q4_0_form.restype = ctypes.c_char_p
    assert lib.q4_0_form().decode() == form
    rng = np.random.default_rng(3)
    four = _blocks(rng, k=128, n=16)
    eight = nbits.quantize(rng.normal(size=(96, 8)).astype(np.float32), 8, 32, "absmax")  # 3 blocks: an odd one
    qs, d = q4_0.pack(four)
    b, scales = nbits.pack(eight)
    k_quants = [_k_quant(checkpoint_script, rng, 512, 32, kind) for kind in K_QUANTS]
    for entry, blocks, weights in ((lib.q4_0_matmul, four, (qs, d.view(np.uint16))), (lib.q8_matmul, eight, (b, scales)),
                                   *((getattr(lib, f"{kind.lower()}_matmul"), blocks, K_QUANTS[kind].pack(blocks))
                                     for kind, blocks in zip(K_QUANTS, k_quants))):
        for rows in (6, 11):  # a verify pass (tiles of four and two rows), a prefill chunk (past TILE)
            x = rng.normal(size=(rows, blocks.q.shape[1] * blocks.block)).astype(np.float32)
            many = _call(entry, x, weights, blocks.q.shape[0])
            want = x @ blocks.dequantize()
            assert np.abs(many - want).max() < 0.02 * np.abs(want).max()
            np.testing.assert_array_equal(many, np.concatenate([_call(entry, x[i:i + 1], weights, blocks.q.shape[0])
                                                                for i in range(rows)]))


ARM = ("aarch64-linux-gnu-gcc", "qemu-aarch64")  # a cross compiler and a user-mode emulator


def test_the_arm_form_computes_the_product_with_rows_independent(tmp_path, checkpoint_script):
    """The NEON dotprod form (what Jetson Orin builds), cross-built and run under an emulator where
    both are installed: the product within int8 activations' error, each row bitwise the row alone."""
    import shutil
    import subprocess

    import os

    missing = not all(shutil.which(tool) for tool in ARM) or kernels.find_include() is None
    if missing and os.environ.get("SPECDEPLOY_ARM_TEST") == "required":  # scripts/test.sh installed them
        pytest.fail("aarch64-linux-gnu-gcc, qemu-aarch64 or ONNX Runtime's C API header went missing")
    if missing:
        pytest.skip("needs aarch64-linux-gnu-gcc, qemu-aarch64 and ONNX Runtime's C API header")
    harness = tmp_path / "harness"
    subprocess.run([ARM[0], "-O3", "-march=armv8.2-a+dotprod+fp16", "-std=c11", "-static",
                    f"-I{kernels.find_include()}", *(str(kernels.HERE / s) for s in kernels.SOURCES),
                    str(Path(__file__).with_name("kernel_harness.c")), "-o", str(harness), "-lm"], check=True)
    rng = np.random.default_rng(8)
    four = _blocks(rng, k=128, n=32)
    eight = nbits.quantize(rng.normal(size=(96, 8)).astype(np.float32), 8, 32, "absmax")  # 3 blocks: an odd one
    qs, d = q4_0.pack(four)

    def run(kind, x, weights, n):
        paths = [tmp_path / name for name in ("x.bin", "w.bin", "s.bin", "y.bin")]
        for path, array in zip(paths, (x, *weights)):
            path.write_bytes(np.ascontiguousarray(array).tobytes())
        done = subprocess.run([ARM[1], str(harness), kind, *map(str, (*x.shape, n)), *map(str, paths)],
                              capture_output=True, text=True, check=True)
        assert done.stdout.strip() == "neon-dotprod"
        return np.fromfile(paths[3], np.float32).reshape(x.shape[0], n)

    k_quants = {kind: _k_quant(checkpoint_script, rng, 512, 32, kind) for kind in K_QUANTS}
    for kind, blocks, weights in (("q4_0", four, (qs, d)), ("q8", eight, nbits.pack(eight)),
                                  *((kind.lower(), b, K_QUANTS[kind].pack(b)) for kind, b in k_quants.items())):
        n = blocks.q.shape[0]
        x = rng.normal(size=(6, blocks.q.shape[1] * blocks.block)).astype(np.float32)
        many = run(kind, x, weights, n)
        want = x @ blocks.dequantize()
        assert np.abs(many - want).max() < 0.02 * np.abs(want).max()
        np.testing.assert_array_equal(many, np.concatenate([run(kind, x[i:i + 1], weights, n) for i in range(6)]))


def _call(entry, rows: np.ndarray, weights: tuple, n: int) -> np.ndarray:
    """y [M, N] from a library entry point (q4_0_matmul, q8_matmul) over rows [M, K]."""
    y = np.zeros((rows.shape[0], n), np.float32)
    pointer = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    assert entry(pointer(rows), ctypes.c_int64(rows.shape[0]), ctypes.c_int64(rows.shape[1]), pointer(weights[0]),
                 pointer(weights[1]), ctypes.c_int64(n), pointer(y)) == 0
    return y


@pytest.fixture(scope="module")
def q4_0_bundle(library, tiny_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("q4_0") / "int4"
    lines = []
    quantize(tiny_bundle, out, QuantizeOptions("int4", method="rtn", compute=ComputeOptions(int4_kernel="q4_0")),
             echo=lines.append)
    return out, lines


def test_an_int4_bundle_by_the_operator_is_exact_and_names_it(q4_0_bundle):
    import onnx

    bundle, lines = q4_0_bundle
    manifest = manifest_io.read(bundle)
    assert manifest.operators == (kernels.Q4_0,) and manifest.row_check["passed"]
    in_place = manifest.read_in_place         # what the runtime reads into huge-page memory
    size = (bundle / manifest.weights).stat().st_size
    assert {"draft", "verify", "head"} <= set(in_place)
    assert all(0 <= w.offset and w.offset + w.length <= size for rows in in_place.values() for w in rows)
    assert any("matmuls by specdeploy's operators (read in place)" in line for line in lines)
    assert any(line.startswith("head:") and "1 matmul by specdeploy's operators" in line for line in lines)
    for name, op in (("draft", q4_0.OP), ("verify", q4_0.OP), ("head", q8.OP)):   # the LM head at 8 bits
        ops = [n.op_type for n in onnx.load(str(bundle / manifest.graphs[name].file)).graph.node]
        assert op in ops and "MatMulNBits" not in ops
    assert manifest.quality["greedy_identical"]
    with Engine(bundle) as engine:
        assert_early_exit_equals_plain(engine)


def test_a_bundle_needing_the_operator_says_how_to_build_it(q4_0_bundle, tmp_path, monkeypatch):
    bundle, _ = q4_0_bundle
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path))       # nothing built there
    monkeypatch.setattr(kernels, "find_include", lambda include=None: None)

    def offline():
        raise ConfigError("could not download ONNX Runtime's headers")

    monkeypatch.setattr(kernels, "fetch_headers", offline)
    with pytest.raises(ConfigError, match="could not download.*build-kernels.*--int4-kernel matmulnbits"):
        Engine(bundle)


@pytest.mark.parametrize("name", ["q9_9", "q4_0"])  # unknown; the first layout (four columns a group)
def test_a_bundle_needing_an_unknown_operator_is_refused(q4_0_bundle, tmp_path, name):
    import shutil

    from specdeploy.errors import BackendError

    bundle = tmp_path / "b"
    shutil.copytree(q4_0_bundle[0], bundle)
    manifest = manifest_io.read(bundle)
    manifest_io.write(bundle, dataclasses.replace(manifest, operators=(name,)))
    with pytest.raises(BackendError, match=f"needs operator.s. {name}, .*re-export the bundle"):
        Engine(bundle)


def test_the_operators_weights_are_read_into_memory_of_their_own_and_compute_the_same(q4_0_bundle):
    """The runtime hands ONNX Runtime the file's bytes from huge-page anonymous memory: logits bitwise
    those of the same graphs reading the file's mapping."""
    import onnxruntime as ort

    from specdeploy.backends import onnxruntime as backend

    bundle, _ = q4_0_bundle
    manifest = manifest_io.read(bundle)
    weights, held = backend.in_place_weights(bundle, manifest)
    names, values = weights["verify"]
    assert held is not None and len(names) == len(manifest.read_in_place["verify"])
    raw = (bundle / manifest.weights).read_bytes()
    for value, weight in zip(values, manifest.read_in_place["verify"]):
        assert value.numpy().tobytes() == raw[weight.offset:weight.offset + weight.length]
    path = str(bundle / manifest.graphs["verify"].file)
    mapped = ort.InferenceSession(path, backend.session_options(operators=manifest.operators))
    options = backend.session_options(operators=manifest.operators)
    options.add_external_initializers(names, values)
    held_here = ort.InferenceSession(path, options)
    feeds = {}
    for i in mapped.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        dtype = np.int64 if "int64" in i.type else np.float32
        feeds[i.name] = (np.zeros(shape, dtype) if dtype is np.int64
                         else np.random.default_rng(0).normal(size=shape).astype(np.float32))
    for a, b in zip(mapped.run(None, feeds), held_here.run(None, feeds)):
        np.testing.assert_array_equal(a, b)


def test_the_kernel_is_refused_with_blocks_of_16():
    with pytest.raises(ConfigError, match="blocks of 32"):
        ComputeOptions(int4_kernel="specdeploy", int4_block=16)
    with pytest.raises(ConfigError, match="q4_1"):
        ComputeOptions(int4_kernel="q4_1")


@pytest.mark.parametrize("change", ["columns", "layout", "bias"])
def test_weights_of_another_shape_than_the_nodes_are_refused_not_read_past(library, change):
    """The node says 128 columns where the weights hold 64; or the weights are in an earlier
    layout of as many bytes (four columns a group: [N/4, K/32, 64]); or its bias is not [N]."""
    from onnx import helper, numpy_helper

    model = _model(_blocks(np.random.default_rng(4)))
    node = model.graph.node[0]
    if change == "columns":
        node.attribute.remove(next(a for a in node.attribute if a.name == "N"))
        node.attribute.append(helper.make_attribute("N", 128))
    elif change == "layout":
        qs = next(t for t in model.graph.initializer if t.name == node.input[1])
        qs.dims[:] = [16, 8, 64]
    else:
        model.graph.initializer.append(numpy_helper.from_array(np.zeros(10, np.float32), "b"))
        node.input.append("b")
    message = "the bias must hold N values" if change == "bias" else \
        "shape does not match the node.s K and N in this library.s layout"
    with pytest.raises(Exception, match=message):
        _session(model, library).run(None, {"x": np.zeros((1, 1, 256), np.float32)})


def _deb(tmp_path, header: bytes) -> bytes:
    """A Debian package (ar archive) whose data.tar.xz holds usr/include/onnxruntime/<HEADER>."""
    import io
    import tarfile

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        info = tarfile.TarInfo(f"./usr/include/onnxruntime/{kernels.HEADER}")
        info.size = len(header)
        tar.addfile(info, io.BytesIO(header))
    out = b"!<arch>\n"
    for name, body in ((b"debian-binary", b"2.0\n"), (b"data.tar.xz", data.getvalue())):
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2 + b"100644".ljust(8)
        out += str(len(body)).encode().ljust(10) + b"`\n" + body + (b"\n" if len(body) % 2 else b"")
    return out


def test_headers_are_taken_from_a_debian_package_checked_by_its_sha256(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    package = tmp_path / "dev.deb"
    package.write_bytes(_deb(tmp_path, b"/* the API */\n"))
    digest = hashlib.sha256(package.read_bytes()).hexdigest()
    with pytest.raises(ConfigError, match="SHA-256"):
        kernels.fetch_headers(package.as_uri(), "0" * 64)
    folder = kernels.fetch_headers(package.as_uri(), digest)
    assert (folder / kernels.HEADER).read_bytes() == b"/* the API */\n"
    with pytest.raises(ConfigError, match="could not download"):
        kernels.fetch_headers((tmp_path / "missing.deb").as_uri(), digest)


def test_rounding_for_the_operators_keeps_gptqs_grid_in_float16_and_gives_rtn_float16_scales():
    """rtn / mse round on the symmetric grid with float16 scales (Q4_0MatMul's); GPTQ and minmax keep
    their offset grid with float16 scales and minima (Q4_1MatMul's: quality before the kernel), the
    values those blocks hold being what the operator computes with."""
    from specdeploy.quantization import gptq
    from specdeploy.quantization.compute import ComputeForm, _blocks

    rng = np.random.default_rng(6)
    w = rng.normal(size=(64, 16)).astype(np.float32)
    form = ComputeForm(bits=4, block_size=32)
    for method in ("absmax", "mse"):
        assert q4_0.takes(_blocks(w, form, method, None, q4_0=True)[0])
        assert not q4_0.takes(_blocks(w, form, method, None, q4_0=False)[0])
    x = rng.normal(size=(256, 64)).astype(np.float32)
    with_gram = gptq.quantize(w, x.T @ x, 4, 32, "minmax", half=True)
    rounded = _blocks(w, form, "minmax", None, q4_0=True)[0]
    for blocks in (rounded, with_gram):
        assert q4_1.takes(blocks) and blocks.offsets is not None
        back = q4_1.unpack(*q4_1.pack(blocks))
        np.testing.assert_array_equal(back.dequantize(), blocks.dequantize())
    step = np.repeat(rounded.scales, 32, axis=1).T                                   # [K, N]
    assert (np.abs(rounded.dequantize() - w) <= 0.51 * step).all()                    # float16 moved no weight far
    for method in ("gptq", "minmax"):
        assert not q4_1.takes(_blocks(w, form, method, None, q4_0=False)[0])


def test_tensorrt_forms_are_refused_with_the_operator():
    with pytest.raises(ConfigError, match="TensorRT cannot build"):
        QuantizeOptions("int4", tensorrt=True, compute=ComputeOptions(int4_kernel="specdeploy"))


def test_a_gguf_q4_k_tensor_is_carried_with_the_files_own_scales_and_nibbles(checkpoint_script):
    """Q4_KMatMul's bytes are the file's: each column's float16 d and dmin, its 6-bit scales and
    minima (a byte each), its nibbles in Q4_0MatMul's interleave; unpacked, the blocks export carried."""
    from gguf.quants import Q4_K

    blocks = _k_quant(checkpoint_script, np.random.default_rng(11), 512, 32)
    raw = checkpoint_script.q4_k_bytes(np.random.default_rng(11).normal(size=(32, 512)).astype(np.float32))  # the same
    assert q4_k.takes(blocks) and not q4_0.takes(blocks)
    supers = raw.reshape(32, 2, 144)                                                  # [N, K/256, 144]
    qs, sc = q4_k.pack(blocks)                                                        # [2, 16, 256], [2, 2, 320]
    assert qs.shape == (2, 16, 256) and sc.shape == (2, 2, q4_k.SUPER_BYTES)
    by_column = sc.reshape(2, 2, 20, 16).transpose(0, 3, 1, 2).reshape(32, 2, 20)     # [N, K/256, 20 rows of bytes]
    halves = np.ascontiguousarray(sc[..., :64]).view(np.uint16).reshape(2, 2, 2, 16).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(halves.reshape(32, 2, 2), supers[..., :4].copy().view(np.uint16))
    scale, least = Q4_K.get_scale_min(np.ascontiguousarray(supers[..., 4:16]).reshape(-1, 12))
    np.testing.assert_array_equal(by_column[..., 4::2].reshape(-1, 8), scale)
    np.testing.assert_array_equal(by_column[..., 5::2].reshape(-1, 8), least)
    file_q = (supers[..., 16:].reshape(32, 2, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F
    np.testing.assert_array_equal(q4_0.unpack_nibbles(qs) + 8, file_q.reshape(32, 16, 32))
    back = q4_k.unpack(qs, sc)
    for field in ("q", "scales", "offsets"):
        np.testing.assert_array_equal(getattr(back, field), getattr(blocks, field))


def test_a_gguf_q6_k_tensor_is_carried_with_the_files_own_values_and_scales(checkpoint_script):
    """Q6_KMatMul's bytes hold the file's 6-bit values and int8 scales and float16 d (6.5625 bits a
    weight, as the file): unpacked, exactly the blocks export carried."""
    blocks = _k_quant(checkpoint_script, np.random.default_rng(13), 512, 32, "Q6_K")
    assert q6_k.takes(blocks) and not q4_k.takes(blocks) and not q8.takes(blocks)
    q, sc = q6_k.pack(blocks)                                                         # [2, 16, 384], [2, 2, 288]
    assert q.nbytes + sc.nbytes == 32 * 512 * 6.5625 / 8
    back = q6_k.unpack(q, sc)
    for field in ("q", "scales"):
        np.testing.assert_array_equal(getattr(back, field), getattr(blocks, field))
    np.testing.assert_array_equal(back.super_scales.sc, blocks.super_scales.sc)


def test_a_gguf_q4_1_tensor_is_carried_with_the_files_own_d_and_m(checkpoint_script):
    """Q4_1MatMul's bytes are the file's nibbles and its float16 d and m (5 bits a weight)."""
    import gguf
    from gguf import quants

    rng = np.random.default_rng(14)
    blocks = _k_quant(checkpoint_script, rng, 128, 16, "Q4_1")
    raw = quants.quantize(np.random.default_rng(14).normal(size=(16, 128)).astype(np.float32),
                          gguf.GGMLQuantizationType.Q4_1).reshape(16, 4, 20)        # the same tensor
    assert q4_1.takes(blocks) and not q4_0.takes(blocks) and not q4_k.takes(blocks)
    qs, dm = q4_1.pack(blocks)                                                        # [1, 4, 256], [1, 4, 32]
    assert qs.nbytes + dm.nbytes == 16 * 128 * 5 / 8
    np.testing.assert_array_equal(dm.transpose(0, 2, 1).reshape(2, 16, 4).transpose(1, 2, 0).view(np.uint16),
                                  raw[..., :4].copy().view(np.uint16))
    back = q4_1.unpack(qs, dm)
    for field in ("q", "scales", "offsets"):
        np.testing.assert_array_equal(getattr(back, field), getattr(blocks, field))


@pytest.mark.parametrize("kind", ["Q5_K", "Q5_1"])
def test_a_gguf_5_bit_tensor_is_carried_with_the_files_own_values_scales_and_minima(checkpoint_script, kind):
    """Q5_KMatMul's / Q5_1MatMul's bytes: the file's low four bits as Q4_KMatMul's, its fifth bits as
    masks, its scales as the 4-bit sibling's (5.625 and 6 bits a weight); unpacked, the blocks export
    carried, whose values are the file's."""
    import gguf
    from gguf import quants

    blocks = _k_quant(checkpoint_script, np.random.default_rng(15), 512, 32, kind)
    values = np.random.default_rng(15).normal(size=(32, 512)).astype(np.float32)  # the same tensor
    raw = quants.quantize(values, gguf.GGMLQuantizationType.Q5_1) if kind == "Q5_1" else checkpoint_script.q5_k_bytes(values)
    five = K_QUANTS[kind]
    assert five.takes(blocks) and blocks.bits == 8 and not q8.takes(blocks) and not q4_k.takes(blocks)
    np.testing.assert_array_equal(blocks.dequantize().T, quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)))
    qs, scales = five.pack(blocks)
    assert qs.shape == (2, 16, 320) and (qs.nbytes + scales.nbytes) * 8 / values.size == (5.625 if kind == "Q5_K" else 6)
    back = five.unpack(qs, scales)
    for field in ("q", "scales", "offsets"):
        np.testing.assert_array_equal(getattr(back, field), getattr(blocks, field))
    assert back.super_scales.kind == kind and blocks.q.min() >= -16 and blocks.q.max() <= 15


@pytest.mark.parametrize("kind", sorted(K_QUANTS))
def test_a_k_quant_operator_keeps_every_row_count_bitwise_the_row_alone(library, checkpoint_script, kind):
    """Every count a pass can carry (1 to the longest verify pass: each tile and the prefill's
    4 x 2): each row bitwise alone, the product the file's values' within int8 activations."""
    from specdeploy.constants import MAX_DRAFT_TOKENS

    rng = np.random.default_rng(12)
    blocks = _k_quant(checkpoint_script, rng, 512, 48, kind)
    ours = _session(_model(blocks, kind.lower()), library)
    x = rng.normal(size=(1, MAX_DRAFT_TOKENS + 1, 512)).astype(np.float32)
    alone = np.concatenate([ours.run(None, {"x": x[:, i:i + 1]})[0] for i in range(x.shape[1])], axis=1)
    want = x @ blocks.dequantize()
    assert np.abs(alone - want).max() < 0.02 * np.abs(want).max()
    for m in range(2, x.shape[1] + 1):
        np.testing.assert_array_equal(ours.run(None, {"x": x[:, :m]})[0], alone[:, :m], err_msg=f"{m} rows")


def test_a_q4_k_m_gguf_exports_onto_the_operators_exactly(library, checkpoint_script, tmp_path, capsys):
    """A Q4_K_M file (Q4_K layers, Q6_K where llama.cpp gives more bits) exported for specdeploy's
    kernels: every weight the file's own blocks (a Q6_K v_proj kept apart from its Q4_K siblings),
    its Q4_K weights on Q4_KMatMul and Q6_K ones on Q6_KMatMul, named in the manifest, greedy early
    exit == plain."""
    import onnx

    from specdeploy.export import ExportConfig, export

    shape = dict(checkpoint_script.SHAPES["qwen2.5-0.5b"], hidden_size=256, num_hidden_layers=3,
                 intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=400)
    config, params = checkpoint_script.parameters(shape)
    source = tmp_path / "tiny-q4_k_m.gguf"
    checkpoint_script.write_gguf(source, config, params, mix="q4_k_m")
    bundle = export(ExportConfig(source=source, exit_layer=1, output=tmp_path / "b", max_context=256,
                                 int4_kernel="q4_0"))
    log = capsys.readouterr().out
    assert "gptq" not in log and "re-quantiz" not in log
    manifest = manifest_io.read(bundle)
    assert manifest.operators == (kernels.Q4_K, kernels.Q6_K) and manifest.row_check["passed"]
    ops = [n.op_type for g in ("draft", "verify", "head") for n in onnx.load(str(bundle / manifest.graphs[g].file)).graph.node]
    assert ops.count(q4_k.OP) >= 4 and ops.count(q6_k.OP) >= 3 and "MatMulNBits" not in ops  # v, down, the head
    assert ops.count("GroupQueryAttention") == 3  # every layer's attention one kernel, q / k / v apart or not
    with Engine(bundle) as engine:
        assert_early_exit_equals_plain(engine)


@pytest.mark.parametrize("kernel", ["specdeploy", "matmulnbits"])
def test_a_q5_k_m_gguf_is_carried_exactly_onto_either_kernel(library, checkpoint_script, tmp_path, capsys, kernel):
    """A Q5_K_M file (Q5_K layers, Q6_K where llama.cpp gives more bits): its Q5_K weights on
    Q5_KMatMul where specdeploy's kernels are chosen, on MatMulNBits at 8 bits with their minima
    folded where not; never re-quantized; greedy early exit == plain either way."""
    import onnx

    from specdeploy.export import ExportConfig, export

    shape = dict(checkpoint_script.SHAPES["qwen2.5-0.5b"], hidden_size=256, num_hidden_layers=3,
                 intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=400)
    config, params = checkpoint_script.parameters(shape)
    source = tmp_path / "tiny-q5_k_m.gguf"
    checkpoint_script.write_gguf(source, config, params, mix="q5_k_m")
    bundle = export(ExportConfig(source=source, exit_layer=1, output=tmp_path / "b", max_context=256,
                                 int4_kernel=kernel))
    log = capsys.readouterr().out
    assert "gptq" not in log and "re-quantiz" not in log
    manifest = manifest_io.read(bundle)
    ops = [n.op_type for g in ("draft", "verify", "head") for n in onnx.load(str(bundle / manifest.graphs[g].file)).graph.node]
    if kernel == "specdeploy":
        assert manifest.operators == (kernels.Q5, kernels.Q6_K) and manifest.row_check["passed"]
        assert ops.count(q5.Q5_K.op) >= 4 and ops.count(q6_k.OP) >= 3 and "MatMulNBits" not in ops
    else:
        assert not manifest.operators and q5.Q5_K.op not in ops and ops.count("MatMulNBits") >= 7
    with Engine(bundle) as engine:
        assert_early_exit_equals_plain(engine)


def test_auto_takes_specdeploys_kernels_where_they_can_be_built_and_says_why_not_elsewhere(monkeypatch):
    from specdeploy.quantization.operators import decided

    said = []
    monkeypatch.setattr(kernels, "unavailable", lambda: None)
    assert decided(ComputeOptions(), False, said.append).int4_kernel == "specdeploy" and not said
    assert decided(ComputeOptions(), True, said.append).int4_kernel == "matmulnbits" and not said  # TensorRT
    monkeypatch.setattr(kernels, "unavailable", lambda: "no C compiler here (cc or gcc)")
    assert decided(ComputeOptions(), False, said.append).int4_kernel == "matmulnbits"
    assert len(said) == 1 and "MatMulNBits" in said[0] and "no C compiler" in said[0] and "build-kernels" in said[0]
    assert decided(ComputeOptions(int4_kernel="matmulnbits"), False, said.append).int4_kernel == "matmulnbits"
    assert ComputeOptions(int4_kernel="q4_0").int4_kernel == "specdeploy"  # the earlier name


def test_a_machine_without_a_compiler_or_header_is_named(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(kernels, "find_include", lambda include=None: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "no C compiler" in kernels.unavailable()
