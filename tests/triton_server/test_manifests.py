"""The Kubernetes / KServe manifests parse and agree with the repository, the image and Triton."""
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from specdeploy.cli import main
from specdeploy.triton.manifests import LIVE, MOUNT, PORTS, QUEUE_METRIC, READY

DOCKERFILE = Path(__file__).resolve().parents[2] / "deploy" / "triton.Dockerfile"


@pytest.fixture(scope="module")
def written(tiny_bundle, tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    result = CliRunner().invoke(main, ["triton", str(tiny_bundle), "-o", str(root / "repo"), "--copy",
                                       "--instances", "2", "--threads", "2", "--manifests", str(root / "k8s")])
    assert result.exit_code == 0, result.output
    kube = list(yaml.safe_load_all((root / "k8s" / "kubernetes.yaml").read_text()))
    kserve = list(yaml.safe_load_all((root / "k8s" / "kserve.yaml").read_text()))
    return {d["kind"]: d for d in kube + kserve}, root


def test_kubernetes_objects_have_their_required_fields(written):
    docs, _ = written
    assert set(docs) == {"Deployment", "Service", "HorizontalPodAutoscaler", "InferenceService"}
    for doc in docs.values():
        assert doc["apiVersion"] and doc["metadata"]["name"] == "specdeploy"
    deployment = docs["Deployment"]["spec"]
    assert deployment["selector"]["matchLabels"] == deployment["template"]["metadata"]["labels"]
    assert docs["Service"]["spec"]["selector"] == deployment["selector"]["matchLabels"]
    scale = docs["HorizontalPodAutoscaler"]["spec"]
    assert scale["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "specdeploy"}
    assert scale["metrics"][0]["pods"]["metric"]["name"] == QUEUE_METRIC


def test_container_ports_probes_and_volume_agree(written):
    docs, _ = written
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == PORTS
    assert {p["targetPort"] for p in docs["Service"]["spec"]["ports"]} == set(ports)
    assert container["readinessProbe"]["httpGet"] == {"path": READY, "port": "http"}
    assert container["livenessProbe"]["httpGet"]["path"] == LIVE
    assert f"--model-repository={MOUNT}" in container["args"] and "--disable-auto-complete-config" in container["args"]
    for name, port in PORTS.items():
        assert f"--{name}-port={port}" in container["args"]
    assert container["volumeMounts"][0]["mountPath"] == MOUNT
    assert pod["volumes"][0]["name"] == container["volumeMounts"][0]["name"]
    assert container["resources"]["requests"]["cpu"] == "4"  # 2 instances x 2 threads


def test_image_is_the_one_the_dockerfile_builds(written):
    docs, _ = written
    image = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    base = next(line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM"))
    assert image == "specdeploy-triton:24.10" and base.endswith(":24.10-py3") and image in DOCKERFILE.read_text()
    assert docs["InferenceService"]["spec"]["predictor"]["model"]["runtimeVersion"] == "24.10"


def test_repository_holds_only_the_model(written):
    _, root = written
    assert [p.name for p in (root / "repo").iterdir()] == ["specdeploy"]  # Triton loads every directory


def test_manifests_need_a_copied_bundle(tiny_bundle, tmp_path):
    result = CliRunner().invoke(main, ["triton", str(tiny_bundle), "-o", str(tmp_path / "repo"),
                                       "--manifests", str(tmp_path / "k8s")])
    assert result.exit_code == 1 and "--manifests needs --copy" in result.output
    assert not (tmp_path / "repo").exists()
