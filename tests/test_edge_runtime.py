"""scripts/edge_runtime.py: the runtime's load time, memory and speed at a bundle's size, in one run."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_it_reports_load_decoding_and_a_long_prompt(tiny_bundle):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "edge_runtime.py"), str(tiny_bundle),
                           "--prompt-tokens", "100", "--new-tokens", "8", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("load: ") and "x the weights" in lines[0]
    assert lines[1].startswith("decoding: plain ") and "tok/s, default " in lines[1]
    assert lines[2].startswith("a 100-token prompt: prefill ")
