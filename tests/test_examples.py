"""The programs in examples/ run as a user would run them."""
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # servers, a browser, real models or every family: not the fast tier

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(*args, stdin=None):
    return subprocess.run([sys.executable, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=120)


def test_stream_generate(tiny_bundle):
    out = run(EXAMPLES / "stream_generate.py", tiny_bundle, "w3 w4")
    assert out.returncode == 0, out.stderr
    assert "tok/s" in out.stdout and "tokens/round" in out.stdout


def test_chat_loop(tiny_bundle):
    out = run(EXAMPLES / "chat_loop.py", tiny_bundle, stdin="w3 w4\nw5\nexit\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("bot> ") == 2


def test_openai_client(tiny_bundle):
    sys.path.insert(0, str(Path(__file__).parent / "serve"))
    from tests_serve_support import RunningServer

    server = RunningServer(tiny_bundle)
    try:
        out = run(EXAMPLES / "openai_client.py", server.url + "/v1", "w3 w4")
        assert out.returncode == 0, out.stderr
        assert "tokens/round" in out.stdout and "source: plain" in out.stdout
    finally:
        server.stop()
