"""The build's guard rails: cache hits, and one clear message about Go."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def run_build(tmp_path: Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path, "KUBETRAIN_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("KUBETRAIN_TESTBED_BIN", None)
    return subprocess.run(
        [sys.executable, "-m", "kubetrain.cli.main", "testbed", "build"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_missing_go_says_which_version_is_needed(tmp_path: Path):
    result = run_build(tmp_path, str(tmp_path / "empty-bin"))
    assert result.returncode == 1
    assert "needs Go 1.24 or newer: `go` is not on PATH" in result.stderr
    assert "Traceback" not in result.stderr


def test_too_old_go_says_which_version_is_needed(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "go").write_text("#!/bin/sh\necho go1.21.6\n")
    (bin_dir / "go").chmod(0o755)
    result = run_build(tmp_path, str(bin_dir))
    assert result.returncode == 1
    assert "needs Go 1.24 or newer; `go` is 1.21" in result.stderr


def test_cache_hit_builds_nothing(tmp_path: Path):
    from kubetrain.testbed import build, kueue_build

    os.environ["KUBETRAIN_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        target = build.installed()
        assert build.cache_key() in str(target.directory)
        target.directory.mkdir(parents=True)
        for name in build.BINARIES:
            (target.directory / name).write_text("#!/bin/sh\n")
            (target.directory / name).chmod(0o755)
        # `testbed build` builds Kueue too: cached as well.
        kueue = kueue_build.installed()
        kueue.binary.parent.mkdir(parents=True)
        kueue.binary.write_text("#!/bin/sh\n")
        kueue.binary.chmod(0o755)
        kueue.manifests.mkdir()
        (kueue.manifests / "done").write_text("v0\n")
    finally:
        del os.environ["KUBETRAIN_CACHE_DIR"]
    # No `go` on PATH: a cache hit must not need it.
    result = run_build(tmp_path, str(tmp_path / "empty-bin"))
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stdout


def test_cache_key_follows_the_pins():
    from kubetrain.testbed import build

    key = build.cache_key()
    assert key.startswith(build.KUBERNETES_VERSION)
    assert key == build.cache_key()


def test_cache_key_covers_every_module_and_our_own_programs():
    from kubetrain.testbed import build

    sources = {str(p.relative_to(build.go_module_dir().parent)) for p in build._module_sources()}
    assert {"go/go.mod", "go/go.sum", "go-coredns/go.mod", "go-coredns/main.go"} <= sources
    assert "go/cmd/testbed-device-plugin/main.go" in sources
    assert build.go_module_dir("coredns").name == "go-coredns"
    assert {"go-local-path/go.mod", "go-local-path/go.sum"} <= sources
    assert build.go_module_dir("local-path-provisioner").name == "go-local-path"
    assert build.go_module_dir("kubelet").name == "go"


def test_a_build_holds_a_machine_wide_lock_that_a_second_build_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from kubetrain.testbed.build import build_lock

    monkeypatch.setenv("KUBETRAIN_CACHE_DIR", str(tmp_path / "cache"))
    # Another process trying the same lock without waiting is refused while it is held,
    # and gets it once it is let go.
    probe = (
        "import fcntl, sys\n"
        f"f = open({str(tmp_path / 'cache' / 'testbed' / '.binaries.lock')!r}, 'a')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except BlockingIOError:\n    sys.exit(3)\n"
    )

    def other() -> int:
        return subprocess.run([sys.executable, "-c", probe], timeout=30, check=False).returncode

    with build_lock("binaries"):
        assert other() == 3
    assert other() == 0
