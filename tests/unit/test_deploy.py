"""What can be checked of the image and the Kustomize base without a container engine
or a cluster: non-root users, files that exist, manifests that agree with the code."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.settings import ServerSettings
from tests.isolated import isolated_settings

__all__ = ["isolated_settings"]  # a fixture, re-exported for pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy/base"


def stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """The Dockerfile's stages: (name, [(instruction, arguments)])."""
    out: list[tuple[str, list[tuple[str, str]]]] = []
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            out.append((rest.split(" AS ")[-1].strip(), []))
        out[-1][1].append((instruction.upper(), rest.strip()))
    return out


def documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    out = []
    for name in kustomization["resources"]:
        out += [d for d in yaml.safe_load_all((BASE / name).read_text()) if d]
    return out


def one(kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents() if d["kind"] == kind]
    return found


def test_every_image_stage_that_ships_runs_as_a_non_root_user():
    shipped = [(name, steps) for name, steps in stages() if name in ("runtime", "server")]
    assert [name for name, _ in shipped] == ["runtime", "server"]
    for name, steps in shipped:
        users = [args for instruction, args in steps if instruction == "USER"]
        assert users, f"stage {name} has no USER"
        uid = users[-1].split(":")[0]
        assert uid.isdigit(), f"stage {name}: USER {uid} is not a numeric uid"
        assert int(uid) != 0, f"stage {name} runs as root"


def test_the_server_image_is_the_default_target():
    assert stages()[-1][0] == "server"


def test_what_the_dockerfile_copies_from_the_context_exists():
    for _, steps in stages():
        for instruction, args in steps:
            if instruction == "COPY" and not args.startswith("--from"):
                *sources, _ = args.split()
                for source in sources:
                    assert (ROOT / source).exists(), f"COPY {source}: no such file"


def test_the_deployment_runs_as_the_image_user_with_nothing_to_escalate():
    pod = one("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]


def test_the_database_url_comes_from_a_secret_never_from_plain_config():
    (container,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert "value" not in env["KUBETRAIN_DATABASE_URL"]
    assert env["KUBETRAIN_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    config = tomllib.loads(one("ConfigMap")["data"]["config.toml"])
    assert "database_url" not in config["server"]


def test_the_config_file_is_one_kubetrain_reads(tmp_path, monkeypatch, isolated_settings):
    path = tmp_path / "config.toml"
    path.write_text(one("ConfigMap")["data"]["config.toml"])
    monkeypatch.setenv("KUBETRAIN_CONFIG", str(path))
    settings = ServerSettings.load(database_url="sqlite://")
    assert (settings.host, settings.port, settings.log_format) == ("0.0.0.0", 8080, "json")  # noqa: S104 - in a Pod


def test_the_probes_ask_paths_the_app_serves():
    from kubetrain.api import create_app
    from kubetrain.store import Database

    app = create_app(ServerSettings(database_url="sqlite://"), Database("sqlite://"))
    paths = {getattr(route, "path", None) for route in app.routes}
    (container,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] in paths
    assert "/metrics" in paths


def test_the_service_selects_the_pods_and_targets_their_port():
    deployment, service = one("Deployment"), one("Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}


def test_the_install_is_the_base_alone_and_no_chart_copies_it():
    # docs/operations.md: Kustomize alone, no Helm chart; a chart would be a second
    # source of these objects, which this project does not keep by hand.
    readme = (ROOT / "README.md").read_text()
    assert "kubectl apply -k deploy/base" in readme
    charts = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "__pycache__"]
        charts += [Path(folder, name) for name in files if name == "Chart.yaml"]
    assert charts == [], "a Helm chart must be generated from deploy/base, see operations.md"
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}


def test_no_service_link_variable_can_pose_as_a_setting():
    # Service links name variables after the namespace's Services: the Service
    # `kubetrain` would give KUBETRAIN_PORT=tcp://..., read as the server's port.
    service = one("Service")["metadata"]["name"]
    assert service.upper().startswith("KUBETRAIN")
    assert one("Deployment")["spec"]["template"]["spec"]["enableServiceLinks"] is False
