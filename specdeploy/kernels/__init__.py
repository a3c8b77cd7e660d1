"""specdeploy's own ONNX Runtime operators, built on this machine from the C files here.

`Q4_0MatMul` (q4_0_matmul.c) reads int4 weights as GGUF's Q4_0 blocks (4.5 bits a weight) and
`Q8MatMul` (q8_matmul.c) int8 blocks of 32 in MatMulNBits' own layout, both as the weights file
holds them, instead of MatMulNBits' packed copies (6 bits a weight at 4 bits; a float32 block sum
beside every 32 bytes at 8): fewer bytes a token and no second copy. It is a shared library compiled with this machine's C
compiler against ONNX Runtime's C API header (`onnxruntime_c_api.h`, which the onnxruntime wheel
does not ship): `specdeploy build-kernels` finds the header (`--include`, $ORT_INCLUDE_DIR,
/usr/include/onnxruntime, or the copy `--fetch-headers` took from Debian's libonnxruntime-dev) and
compiles once per source and CPU into the cache ($SPECDEPLOY_CACHE, else ~/.cache/specdeploy).
The API is append-only, so a header older than the installed runtime serves.
"""
from __future__ import annotations

import hashlib
import io
import os
import platform
import shutil
import subprocess
import tarfile
import urllib.request
from pathlib import Path

from ..errors import ConfigError

HERE = Path(__file__).parent
SOURCES = ("ops.c", "q4_0_matmul.c", "q4_k_matmul.c", "q6_k_matmul.c", "q8_matmul.c")  # with ops.h
DOMAIN = "ai.specdeploy"
Q4_0 = "q4_0.v2"            # the manifest's name for this library's operators and their weights' layout
                             # (v2: sixteen columns a group; a v1 bundle is refused at load: re-export it)
Q4_K = "q4_k.v1"            # Q4_KMatMul and Q4_1MatMul (int4 with minima) and their layouts
Q6_K = "q6_k.v1"            # Q6_KMatMul and its layout
Q5 = "q5.v1"                # Q5_KMatMul and Q5_1MatMul (Q4_K / Q4_1 with a fifth bit) and their layouts
NAMES = (Q4_0, Q4_K, Q5, Q6_K)    # what this library computes; a bundle naming anything else is refused at load
HEADER = "onnxruntime_c_api.h"
# Debian's package of ONNX Runtime's headers: any architecture's holds the same files
HEADERS_URL = ("https://deb.debian.org/debian/pool/main/o/onnxruntime/"
               "libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb")
HEADERS_SHA256 = "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=c11")


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEPLOY_CACHE") or Path.home() / ".cache" / "specdeploy")


def _fetched_include() -> Path:
    return cache_dir() / "onnxruntime-include"


def find_include(include: Path | None = None) -> Path | None:
    """The first folder holding onnxruntime_c_api.h among `include`, $ORT_INCLUDE_DIR, the system's
    and the fetched copy."""
    places = [include, os.environ.get("ORT_INCLUDE_DIR"), "/usr/include/onnxruntime",
              "/usr/local/include/onnxruntime", _fetched_include()]
    for place in places:
        if place and (Path(place) / HEADER).is_file():
            return Path(place)
    return None


def fetch_headers(url: str = HEADERS_URL, sha256: str = HEADERS_SHA256) -> Path:
    """ONNX Runtime's headers from Debian's libonnxruntime-dev (a .deb: an ar archive whose
    data.tar.xz holds usr/include/onnxruntime), checked against its SHA-256, into the cache."""
    try:
        with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 (a fixed https address)
            package = response.read()
    except OSError as exc:
        raise ConfigError(f"could not download ONNX Runtime's headers from {url} ({exc}); pass --include or "
                          f"set ORT_INCLUDE_DIR to a folder holding {HEADER}") from None
    if hashlib.sha256(package).hexdigest() != sha256:
        raise ConfigError(f"{url} did not match its SHA-256; fetch it again, or pass --include with "
                          f"a folder holding {HEADER}")
    data = _ar_member(package, "data.tar.xz")
    dest = _fetched_include()
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if member.isfile() and parts[-3:-1] == ("include", "onnxruntime") and member.name.endswith(".h"):
                (dest / parts[-1]).write_bytes(tar.extractfile(member).read())
    return dest


def _ar_member(archive: bytes, name: str) -> bytes:
    """One member of an ar archive (the .deb format): 60-byte headers, bodies padded to even."""
    if not archive.startswith(b"!<arch>\n"):
        raise ConfigError("the headers' package is not a Debian archive")
    at = 8
    while at + 60 <= len(archive):
        header = archive[at:at + 60]
        size = int(header[48:58].decode().strip())
        if header[:16].decode().strip().rstrip("/") == name:
            return archive[at + 60:at + 60 + size]
        at += 60 + size + (size & 1)
    raise ConfigError(f"the headers' package holds no {name}")


def _cpu_key() -> str:
    """What -march=native depends on: the machine and its CPU's feature flags."""
    flags = ""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith(("flags", "Features")))
    except (OSError, StopIteration):
        pass
    return f"{platform.machine()} {flags}"


def library_path(flags: tuple[str, ...] = FLAGS) -> Path:
    """Where this source, built with `flags` for this CPU, lies once built."""
    text = b"".join((HERE / name).read_bytes() for name in (*SOURCES, "ops.h"))
    key = hashlib.sha256(text + " ".join(flags).encode() + _cpu_key().encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / key / "libspecdeploy_kernels.so"


def build(include: Path | None = None, compiler: str | None = None, flags: tuple[str, ...] = FLAGS) -> Path:
    """Compile the operators for this machine (once: an existing build is reused); the library's path.
    `flags`: the compiler's (another -march builds another form, for tests)."""
    target = library_path(flags)
    if target.is_file():
        return target
    headers = find_include(include)
    if headers is None:
        raise ConfigError(f"ONNX Runtime's C API header ({HEADER}) is not here; run `specdeploy build-kernels "
                          f"--fetch-headers`, or pass --include / set ORT_INCLUDE_DIR to a folder holding it")
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise ConfigError("no C compiler here (cc or gcc); install one (Debian: apt-get install gcc) "
                          "and run `specdeploy build-kernels` again")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run([cc, *flags, f"-I{headers}", *(str(HERE / name) for name in SOURCES), "-o", str(partial),
                           "-lm"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        first = (done.stderr.strip().splitlines() or ["no message"])[0]
        raise ConfigError(f"compiling specdeploy's operators failed: {first}")
    partial.replace(target)
    return target


def ensure() -> Path:
    """The built library: built now where a C compiler is here, its header fetched when none is
    found (a ConfigError saying what is missing where that fails)."""
    if library_path().is_file():
        return library_path()
    if find_include() is None:
        if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
            raise ConfigError("no C compiler here (cc or gcc); install one (Debian: apt-get install gcc)")
        fetch_headers()
    return build()


def library(required_by: str = "this bundle") -> Path:
    """The built library, building it at first use where it can be; a clear error where it cannot."""
    try:
        return ensure()
    except ConfigError as exc:
        raise ConfigError(f"{required_by} uses specdeploy's int4 operators, which are not built here: {exc}; "
                          f"then run `specdeploy build-kernels`, or re-export with --int4-kernel matmulnbits") from None


def unavailable() -> str | None:
    """Why the library cannot be had here, or None (it is built, or was just built)."""
    try:
        ensure()
    except ConfigError as exc:
        return str(exc)
    return None


def build_here(include: Path | None = None, fetch: bool = False) -> str:
    """`specdeploy build-kernels`: fetch the headers if asked (or if none is found and nothing was
    named), build, and say what was built."""
    import ctypes

    if fetch or (include is None and find_include() is None and not library_path().is_file()):
        fetch_headers()
    path = build(include)
    form = ctypes.CDLL(str(path))
    form.q4_0_form.restype = ctypes.c_char_p
    return f"built {path} (Q4_0MatMul, Q4_1MatMul, Q4_KMatMul, Q5_KMatMul, Q5_1MatMul, Q6_KMatMul, Q8MatMul; {form.q4_0_form().decode()} form)"
