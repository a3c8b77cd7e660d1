import pytest

from tests_serve_support import RunningServer


@pytest.fixture(scope="module")
def server(tiny_bundle):
    s = RunningServer(tiny_bundle, "--max-queue", "2", "--prefill-chunk", "8")  # prompts prefilled in chunks
    yield s
    s.stop()

