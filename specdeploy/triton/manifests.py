"""Kubernetes and KServe manifests that run Triton's container over a `specdeploy triton` repository.

Written beside the repository, never inside it (Triton loads every directory of a repository as a
model). The image must hold specdeploy's runtime on the container's Python (deploy/triton.Dockerfile, docs/serving.md);
the repository, with its bundle copied in (`--copy`), is mounted at /models.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import require
from .config import TritonConfig

PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}   # tritonserver's defaults
MOUNT = "/models"
READY, LIVE = "/v2/health/ready", "/v2/health/live"
QUEUE_METRIC = "specdeploy_queue_depth"                 # the model's own gauge on /metrics


def _container(config: TritonConfig, image: str) -> dict:
    cpus = config.instances * (config.threads or 1)
    return {
        "name": "tritonserver", "image": image,
        "args": ["tritonserver", f"--model-repository={MOUNT}", "--disable-auto-complete-config",
                 *(f"--{name}-port={port}" for name, port in PORTS.items())],
        "ports": [{"name": name, "containerPort": port} for name, port in PORTS.items()],
        "readinessProbe": {"httpGet": {"path": READY, "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": LIVE, "port": "http"}, "initialDelaySeconds": 30},
        "resources": {"requests": {"cpu": str(cpus), "memory": "2Gi"}},
        "volumeMounts": [{"name": "models", "mountPath": MOUNT, "readOnly": True}],
    }


def kubernetes(config: TritonConfig, image: str, claim: str) -> list[dict]:
    """Deployment + Service + HorizontalPodAutoscaler (on the model's queue depth)."""
    labels = {"app": config.name}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": config.name, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels, "annotations": {"prometheus.io/scrape": "true",
                                                           "prometheus.io/port": str(PORTS["metrics"])}},
            "spec": {"containers": [_container(config, image)],
                     "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}]}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": config.name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": n, "port": p, "targetPort": n} for n, p in PORTS.items()]},
    }
    autoscaler = {  # needs a metrics adapter (e.g. prometheus-adapter) exposing the pod metric
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": config.name},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": config.name},
                 "minReplicas": 1, "maxReplicas": 4,
                 "metrics": [{"type": "Pods", "pods": {"metric": {"name": QUEUE_METRIC},
                                                       "target": {"type": "AverageValue", "averageValue": "1"}}}]},
    }
    return [deployment, service, autoscaler]


def kserve(config: TritonConfig, image: str, claim: str) -> dict:
    """A KServe InferenceService whose predictor runs the same container over the same volume."""
    container = _container(config, image)
    container.pop("volumeMounts")
    return {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": config.name},
        "spec": {"predictor": {"minReplicas": 1, "model": {
            "modelFormat": {"name": "triton"}, "storageUri": f"pvc://{claim}", "runtimeVersion": image.split(":")[-1],
            "args": [a for a in container["args"] if not a.startswith("tritonserver")],
            "ports": [{"name": "h2c", "containerPort": PORTS["grpc"]}],
            "resources": container["resources"]}}},
    }


def write_manifests(config: TritonConfig, directory: Path, image: str, claim: str = "specdeploy-models") -> list[Path]:
    yaml = require("yaml", "triton", "writing Kubernetes manifests")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {"kubernetes.yaml": kubernetes(config, image, claim), "kserve.yaml": [kserve(config, image, claim)]}
    for name, documents in files.items():
        (directory / name).write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return [directory / name for name in files]
