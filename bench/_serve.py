"""What the server benchmarks share: a real `kubetrain serve` subprocess and a job to submit."""

from __future__ import annotations

from typing import Any

from kubetrain.local_server import LocalServer

# The benchmarks' server is the one the demo and the end-to-end tests use.
Serve = LocalServer


def training_job(
    name: str, project: str, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "project": project, "annotations": annotations or {}},
        "spec": {
            "image": "registry.example/trainer:2026-08",
            "command": ["python", "train.py"],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        },
    }
