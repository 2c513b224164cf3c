"""The pieces of `testbed up --kueue` that need no cluster: the address the visibility API
listens on, the webhooks kept and pointed at loopback, and the build's source patch."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubetrain.testbed import kueue, kueue_build
from kubetrain.testbed.build import BuildError

pytestmark = pytest.mark.unit

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 127.0.0.0/8 2 0 2
           |-- 127.0.0.1
              /32 host LOCAL
     +-- 169.254.0.0/16 2 0 2
           |-- 169.254.3.4
              /32 host LOCAL
     +-- 192.0.2.0/24 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
"""


def test_without_a_default_route_the_first_local_address_endpoints_accept_is_taken(
    tmp_path: Path,
) -> None:
    trie = tmp_path / "fib_trie"
    trie.write_text(FIB_TRIE)
    assert kueue.local_address(trie) == "192.0.2.2"
    trie.write_text(FIB_TRIE.split("     +-- 192.0.2.0/24")[0])
    assert kueue.local_address(trie) is None  # loopback and link-local only
    assert kueue.local_address(tmp_path / "absent") is None


def _manifests(tmp_path: Path) -> kueue_build.KueueBuild:
    build = kueue_build.KueueBuild(tmp_path)
    hooks = [
        ("mjob.kb.io", ["batch"], "/mutate-batch-v1-job"),
        ("mpod.kb.io", [""], "/mutate--v1-pod"),
        ("mworkload.kb.io", ["kueue.x-k8s.io"], "/mutate-kueue-x-k8s-io-v1beta2-workload"),
    ]
    doc = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            {
                "name": name,
                "clientConfig": {
                    "service": {"name": "webhook-service", "namespace": "system", "path": path}
                },
                "rules": [{"apiGroups": groups, "resources": ["x"]}],
            }
            for name, groups, path in hooks
        ],
    }
    (tmp_path / "manifests" / "webhook").mkdir(parents=True)
    (tmp_path / "manifests" / "webhook" / "manifests.yaml").write_text(yaml.safe_dump(doc))
    return build


def test_webhooks_of_kueues_kinds_and_jobs_are_kept_and_called_by_url(tmp_path: Path) -> None:
    [config] = kueue.webhook_configurations(_manifests(tmp_path), "https://127.0.0.1:9443", "Q0E=")
    assert config["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    assert [h["name"] for h in config["webhooks"]] == ["mjob.kb.io", "mworkload.kb.io"]
    assert config["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-batch-v1-job",
        "caBundle": "Q0E=",
    }


def test_without_a_visibility_address_the_visibility_server_is_off(tmp_path: Path) -> None:
    off = kueue.configuration(tmp_path, 1, 2, 3, 4, None)
    assert off["featureGates"] == {"VisibilityOnDemand": False}
    on = kueue.configuration(tmp_path, 1, 2, 3, 4, "192.0.2.2")
    assert on["visibilityServer"] == {"bindAddress": "192.0.2.2", "bindPort": 4}
    assert on["internalCertManagement"] == {"enable": False}
    assert on["waitForPodsReady"]["timeout"] == kueue.PODS_READY_TIMEOUT
    # The recorder's own Kueue testbed (kueue-pods-ready-timeout) shortens it.
    short = kueue.configuration(tmp_path, 1, 2, 3, 4, None, pods_ready_timeout="10s")
    assert short["waitForPodsReady"] == {"timeout": "10s", "blockAdmission": False}


def test_the_build_patches_exactly_the_certificate_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "kueue"
    for relative, (old, _) in kueue_build.PATCHES.items():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_text(f"a\n{old}\nb\n")
    staging = tmp_path / "staging"
    modfile = kueue_build.patched_modfile(source, staging)
    for relative, (old, new) in kueue_build.PATCHES.items():
        assert (staging / "src" / relative).read_text() == f"a\n{new}\nb\n"
        assert (source / relative).read_text() == f"a\n{old}\nb\n"
    assert modfile.read_text().endswith(
        f"replace sigs.k8s.io/kueue {kueue_build.KUEUE_VERSION} => {staging / 'src'}\n"
    )
    assert (staging / "build.sum").read_bytes() == (
        kueue_build.module_dir() / "go.sum"
    ).read_bytes()

    moved = tmp_path / "moved"
    (moved / "cmd/kueue").mkdir(parents=True)
    (moved / "cmd/kueue/main.go").write_text("nothing to patch")
    with pytest.raises(BuildError, match="have moved"):
        kueue_build.patched_modfile(moved, tmp_path / "staging2")


def test_only_the_conversion_patches_the_kustomization_applies_are_applied(
    tmp_path: Path,
) -> None:
    # v0.17.0 ships webhook_in_resourceflavors.yaml but comments it out: its binary
    # converts no ResourceFlavor, and a webhook named for it breaks the v1beta1 list.
    build = kueue_build.KueueBuild(tmp_path)
    crd = tmp_path / "manifests" / "crd"
    (crd / "bases").mkdir(parents=True)
    (crd / "patches").mkdir()
    for plural in ("workloads", "resourceflavors"):
        name = f"{plural}.kueue.x-k8s.io"
        (crd / "bases" / f"kueue.x-k8s.io_{plural}.yaml").write_text(
            yaml.safe_dump(
                {"kind": "CustomResourceDefinition", "metadata": {"name": name}, "spec": {}}
            )
        )
        (crd / "patches" / f"webhook_in_{plural}.yaml").write_text(
            yaml.safe_dump({"kind": "CustomResourceDefinition", "metadata": {"name": name}})
        )
    (crd / "kustomization.yaml").write_text(
        "patches:\n- path: patches/webhook_in_workloads.yaml\n"
        "#- path: patches/webhook_in_resourceflavors.yaml\n"
    )
    found = {c["metadata"]["name"]: c["spec"] for c in kueue.crds(build, "https://k", "Q0E=")}
    assert found["workloads.kueue.x-k8s.io"]["conversion"]["strategy"] == "Webhook"
    assert "conversion" not in found["resourceflavors.kueue.x-k8s.io"]
