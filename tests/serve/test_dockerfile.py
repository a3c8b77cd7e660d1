"""deploy/serve.Dockerfile: linted here (what it installs, copies, exposes and runs), built where a
Docker daemon answers."""
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "serve.Dockerfile"
INSTRUCTIONS = {"FROM", "ARG", "RUN", "ENV", "COPY", "USER", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD", "WORKDIR"}


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split()[0], line.partition(" ")[2]) for line in lines]


def _name(requirement: str) -> str:
    return re.split(r"[<>=\[ ]", requirement.strip('"'))[0].lower()


def test_every_instruction_is_one_docker_knows_and_copies_exist():
    steps = instructions()
    assert {kind for kind, _ in steps} <= INSTRUCTIONS
    for kind, args in steps:
        if kind == "COPY":
            *sources, _ = args.split()
            assert all((ROOT / s).exists() for s in sources), args


def test_it_installs_the_runtime_and_serve_dependencies_and_one_onnx_runtime():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["serve"]}
    installed = {_name(word) for kind, args in instructions() if kind == "RUN" and "pip install" in args
                 for word in args.split() if word.startswith('"')}
    installed.add("onnxruntime")  # as "$ONNXRUNTIME": onnxruntime, or onnxruntime-gpu in its place
    assert wanted <= installed, wanted - installed
    assert "torch" not in installed


def test_it_serves_a_mounted_bundle_on_all_interfaces_as_a_user_with_a_health_check():
    steps = dict(instructions())
    assert steps["ENTRYPOINT"].startswith('["specdeploy", "serve", "/models/engine.plan", "--host", "0.0.0.0"')
    assert steps["EXPOSE"] == "8000" and "/health" in steps["HEALTHCHECK"] and steps["USER"] != "root"


def _daemon() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _daemon(), reason="no Docker daemon here: the Dockerfile is linted above, not built")
def test_the_image_builds_and_its_cli_answers():
    subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "-t", "specdeploy-serve:test", str(ROOT)],
                   check=True, timeout=1800)
    out = subprocess.run(["docker", "run", "--rm", "--entrypoint", "specdeploy", "specdeploy-serve:test", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "serve" in out.stdout
