"""The pure parts of `testbed up --in-cluster` (tests/realnode/test_incluster.py runs it)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from kubetrain.testbed import incluster, postgres
from kubetrain.testbed.images import SERVER_IMAGE, _server_config, oci_archive

pytestmark = pytest.mark.unit


def test_kube_proxy_changes_no_machine_setting_it_need_not(tmp_path: Path):
    argv = incluster.kube_proxy_argv(
        tmp_path, tmp_path / "kubeconfig", "real-0", "10.244.0.0/16", 1, 2
    )
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:] if "=" in a)
    assert flags["proxy-mode"] == "iptables"
    assert "--masquerade-all" in argv
    for name in ("conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established"):
        assert flags[name] == "0"
    assert flags["iptables-localhost-nodeports"] == "false"
    assert flags["healthz-bind-address"].startswith("127.0.0.1:")


def test_the_overlay_changes_the_image_and_the_database_only(tmp_path: Path):
    base = tmp_path / "deploy" / "base"
    base.mkdir(parents=True)
    overlay = tmp_path / "state" / "in-cluster"
    url = "postgresql+psycopg://kubetrain:pw@10.244.0.1:5432/kubetrain"
    incluster.write_overlay(overlay, base, url)
    text = (overlay / "kustomization.yaml").read_text()
    assert "resources:\n  - ../../deploy/base\n" in text
    assert f"newName: {SERVER_IMAGE.split(':')[0]}" in text
    assert "pw" not in text  # the password is in the env file, readable by root only
    env = overlay / "database.env"
    assert env.read_text() == f"url={url}\n"
    assert env.stat().st_mode & 0o777 == 0o600


def test_postgres_lets_the_pod_network_in_with_a_password_only():
    lines = postgres.hba("10.244.0.0/16").splitlines()
    assert lines == [
        "local all all trust",
        "host kubetrain kubetrain 10.244.0.0/16 scram-sha-256",
    ]


def test_the_server_image_runs_kubetrain_as_the_dockerfiles_user():
    config = _server_config()
    assert config["User"] == "10001:10001"
    entrypoint = config["Entrypoint"]
    assert isinstance(entrypoint, list)
    assert entrypoint[-1].endswith("/bin/kubetrain")
    archive = oci_archive(SERVER_IMAGE, b"layer", config)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        index = json.load(tar.extractfile("index.json"))
    (manifest,) = index["manifests"]
    assert manifest["annotations"]["io.containerd.image.name"] == "localhost/kubetrain:testbed"
