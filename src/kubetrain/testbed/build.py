"""Build the testbed's binaries from the Go module we ship, into a versioned cache.

The cache key hashes go.mod, go.sum and the build flags, so a change of any
pinned version builds into a new directory and an unchanged one is reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kubetrain.errors import KubetrainError
from kubetrain.testbed.processes import machine_lock

KUBERNETES_VERSION = "v1.33.13"
MIN_GO = (1, 24)  # the `go` line of go.mod: k8s.io/kubernetes 1.33 and kwok 0.7 need 1.24

# binary name -> Go package; etcd's main package is its server module's root.
BINARIES = {
    "etcd": "go.etcd.io/etcd/server/v3",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
    # The real-node pool: a kubelet per node, our device plugin beside it, and the
    # sandbox ("pause") image's only file.
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    # `up --in-cluster`: the Services of kubetrain's own install routed by the real thing.
    "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    "testbed-device-plugin": "kubetrain.io/testbed/cmd/testbed-device-plugin",
    "testbed-pause": "kubetrain.io/testbed/cmd/testbed-pause",
    # The real-node pool's cluster DNS, from a module of its own (go-coredns/).
    "coredns": "kubetrain.io/testbed/coredns",
    # The real-node pool's dynamic provisioner (default StorageClass `local-path`),
    # from a module of its own (go-local-path/): its main package is the module's root.
    "local-path-provisioner": "github.com/rancher/local-path-provisioner",
}
# Binaries built from another module than go/ (folder beside it).
MODULE_OF = {"coredns": "go-coredns", "local-path-provisioner": "go-local-path"}

_MAJOR, _MINOR = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
LDFLAGS = " ".join(
    [
        "-s -w",
        f"-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}",
        f"-X k8s.io/component-base/version.gitMajor={_MAJOR}",
        f"-X k8s.io/component-base/version.gitMinor={_MINOR}",
        "-X k8s.io/component-base/version.gitTreeState=clean",
        f"-X k8s.io/client-go/pkg/version.gitVersion={KUBERNETES_VERSION}",
    ]
)


class BuildError(KubetrainError, RuntimeError):
    """The binaries could not be built; the message says what to do."""


@dataclass(frozen=True)
class Binaries:
    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    def complete(self) -> bool:
        return all(os.access(self.path(name), os.X_OK) for name in BINARIES)


def go_module_dir(binary: str | None = None) -> Path:
    folder = MODULE_OF.get(binary or "", "go")
    return Path(str(resources.files("kubetrain.testbed") / folder))


@contextlib.contextmanager
def build_lock(name: str) -> Iterator[None]:
    """Hold this machine's lock on building `name` (released if the process dies)."""
    with machine_lock(cache_root() / "testbed" / f".{name}.lock"):
        yield


def cache_root() -> Path:
    if override := os.environ.get("KUBETRAIN_CACHE_DIR"):
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kubetrain"


def cache_key() -> str:
    digest = hashlib.sha256()
    root = go_module_dir().parent
    for path in _module_sources():
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    digest.update(LDFLAGS.encode())
    digest.update(" ".join(sorted(BINARIES.items()).__repr__()).encode())
    return f"{KUBERNETES_VERSION}-{digest.hexdigest()[:12]}"


def _module_sources() -> list[Path]:
    """Each module's go.mod and go.sum, and our own Go programs: a change in any
    builds anew."""
    paths = []
    for module in sorted({go_module_dir(name) for name in BINARIES}):
        paths += [module / "go.mod", module / "go.sum"]
        paths += sorted(p for p in module.rglob("*.go") if p.name != "tools.go")
    return paths


def installed() -> Binaries:
    """Where the binaries of the pinned versions live (built or not)."""
    if override := os.environ.get("KUBETRAIN_TESTBED_BIN"):
        return Binaries(Path(override))
    return Binaries(cache_root() / "testbed" / cache_key() / "bin")


def go_version(go: str) -> tuple[int, int]:
    try:
        out = subprocess.run(
            [go, "env", "GOVERSION"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"cannot run {go}: {exc}") from None
    match = re.match(r"go(\d+)\.(\d+)", out)
    if match is None:
        raise BuildError(f"cannot read the Go version from {out!r}")
    return int(match[1]), int(match[2])


def build(*, force: bool = False, log: bool = True) -> Binaries:
    """Build every binary unless the cache already holds them all."""
    # Two builds at once (two test workers, two shells) would share one staging
    # directory: the second waits, then finds the first one's cache.
    with build_lock("binaries"):
        return _build(force=force, log=log)


def _build(*, force: bool, log: bool) -> Binaries:
    target = installed()
    if target.complete() and not force:
        if log:
            print(f"testbed binaries are up to date in {target.directory}")
        return target
    need = f"Go {MIN_GO[0]}.{MIN_GO[1]} or newer"
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            f"the testbed is built from Go modules and needs {need}: `go` is not on PATH"
        )
    found = go_version(go)
    if found < MIN_GO:
        raise BuildError(
            f"the testbed needs {need}; `go` is {found[0]}.{found[1]}. Install a newer Go"
        )
    staging = target.directory.with_name("bin.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        # Use the machine's Go: no toolchain is downloaded behind the user's back.
        "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local"),
        "GOFLAGS": "-mod=readonly",
    }
    for name, package in BINARIES.items():
        if log:
            print(f"building {name} ({package}) ...", flush=True)
        cmd = [go, "build", "-trimpath", "-ldflags", LDFLAGS, "-o", str(staging / name), package]
        result = subprocess.run(cmd, cwd=go_module_dir(name), env=env, check=False)
        if result.returncode != 0:
            raise BuildError(f"`{' '.join(cmd)}` failed with exit code {result.returncode}")
    # Publish atomically: a half-built directory is never taken for a cache hit.
    shutil.rmtree(target.directory, ignore_errors=True)
    staging.rename(target.directory)
    if log:
        print(f"testbed binaries built in {target.directory}", file=sys.stderr)
    return target
