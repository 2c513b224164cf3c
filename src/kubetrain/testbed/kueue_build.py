"""Build the Kueue controller manager for `kubetrain testbed up --kueue`, into its own cache.

Kueue is pinned in a Go module of its own (`go-kueue/`): v0.17 requires k8s.io/* v0.35,
which would move the testbed's Kubernetes 1.33 components if it shared their module.
Why v0.17.0: its README says "Requires Kubernetes 1.29 or newer" and its end-to-end
suite runs on Kubernetes 1.33.7, 1.34 and 1.35 (E2E_K8S_VERSIONS in Makefile-test.mk),
so the testbed's 1.33 is inside the range it tests; it is also the only release the
module proxy serves here.

Kueue reads two certificates from absolute paths its Deployment mounts from Secrets
(`/etc/kueue/metrics/certs`, `/visibility`). A testbed runs as a user process, side by
side with others, so the build makes exactly those two paths relative to Kueue's working
directory (the testbed's state directory); nothing else of Kueue's source changes. Go
refuses `-overlay` for files in its module cache, so the build copies the module's
source, patches the copy, and builds with `-modfile`: a copy of go-kueue/go.mod that
adds `replace sigs.k8s.io/kueue => <the copy>` (our go.mod and go.sum are untouched).
The CRDs and webhook manifests of the same module version are copied next to the
binary, so `up --kueue` installs what this binary serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kubetrain.testbed.build import BuildError, build_lock, cache_root, go_version

KUEUE_VERSION = "v0.17.0"
KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_PACKAGE = "sigs.k8s.io/kueue/cmd/kueue"
MIN_GO = (1, 25)  # the `go` line of go-kueue/go.mod (Kueue 0.17's own)
LDFLAGS = f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={KUEUE_VERSION}"

# file in the module -> (text, replacement): each must occur exactly once.
PATCHES = {
    "cmd/kueue/main.go": ('"/etc/kueue/metrics/certs"', '"etc/kueue/metrics/certs"'),
    "pkg/visibility/server.go": ('certDir = "/visibility"', 'certDir = "visibility"'),
}
# Copied from the module's config/components into the cache, beside the binary.
# crd/kustomization.yaml says which of the patches apply: a release ships patches it
# leaves commented out (v0.17.0: ResourceFlavor's conversion webhook, which its binary
# does not serve).
MANIFESTS = ("crd/bases", "webhook/manifests.yaml", "crd/patches", "crd/kustomization.yaml")


def _remove_tree(path: Path) -> None:
    """rmtree for a copy of the read-only module cache."""
    for sub in path.rglob("*"):
        if sub.is_dir():
            sub.chmod(0o755)
    shutil.rmtree(path)


@dataclass(frozen=True)
class KueueBuild:
    directory: Path

    @property
    def binary(self) -> Path:
        return self.directory / "bin" / "kueue"

    @property
    def manifests(self) -> Path:
        return self.directory / "manifests"

    def complete(self) -> bool:
        return os.access(self.binary, os.X_OK) and (self.manifests / "done").exists()


def module_dir() -> Path:
    return Path(str(resources.files("kubetrain.testbed") / "go-kueue"))


def cache_key() -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((module_dir() / name).read_bytes())
    digest.update(LDFLAGS.encode())
    digest.update(repr(sorted(PATCHES.items())).encode())
    digest.update(repr(MANIFESTS).encode())  # a build copied what it copied
    return f"kueue-{KUEUE_VERSION}-{digest.hexdigest()[:12]}"


def installed() -> KueueBuild:
    if override := os.environ.get("KUBETRAIN_KUEUE_DIR"):
        return KueueBuild(Path(override))
    return KueueBuild(cache_root() / "testbed" / cache_key())


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local"),
        "GOFLAGS": "-mod=readonly",
    }


def _module_source(go: str) -> Path:
    """Where Go keeps Kueue's module source (downloaded on first use)."""
    cmd = [go, "mod", "download", "-json", f"{KUEUE_MODULE}@{KUEUE_VERSION}"]
    result = subprocess.run(
        cmd, cwd=module_dir(), env=_env(), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise BuildError(f"`{' '.join(cmd)}` failed: {result.stderr.strip() or result.stdout}")
    return Path(json.loads(result.stdout)["Dir"])


def patched_modfile(source: Path, staging: Path) -> Path:
    """Copy Kueue's module source into `staging`, relocate its certificate paths, and
    write the go.mod (with its go.sum) that builds from the copy. Refuses a source that
    no longer matches."""
    copy = staging / "src"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("test", "keps", "charts", "site"))
    for relative, (old, new) in PATCHES.items():
        target = copy / relative
        text = target.read_text()
        if text.count(old) != 1:
            raise BuildError(
                f"{KUEUE_MODULE}@{KUEUE_VERSION}/{relative} does not contain {old} exactly once: "
                "the certificate paths the testbed relocates have moved"
            )
        target.chmod(0o644)
        target.write_text(text.replace(old, new))
    modfile = staging / "build.mod"
    modfile.write_text(
        (module_dir() / "go.mod").read_text()
        + f"\nreplace {KUEUE_MODULE} {KUEUE_VERSION} => {copy}\n"
    )
    shutil.copyfile(module_dir() / "go.sum", staging / "build.sum")
    return modfile


def build(*, force: bool = False, log: bool = True) -> KueueBuild:
    """Build Kueue and copy its manifests unless the cache already holds them."""
    # Two builds at once (two test workers, two shells) would share one staging
    # directory: the second waits, then finds the first one's cache.
    with build_lock("kueue"):
        return _build(force=force, log=log)


def _build(*, force: bool, log: bool) -> KueueBuild:
    target = installed()
    if target.complete() and not force:
        if log:
            print(f"kueue {KUEUE_VERSION} is up to date in {target.directory}")
        return target
    need = f"Go {MIN_GO[0]}.{MIN_GO[1]} or newer"
    go = shutil.which("go")
    if go is None:
        raise BuildError(f"Kueue is built from its Go module and needs {need}: no `go` on PATH")
    found = go_version(go)
    if found < MIN_GO:
        raise BuildError(
            f"Kueue {KUEUE_VERSION} needs {need}; `go` is {found[0]}.{found[1]}. Install a newer Go"
        )
    staging = target.directory.with_name(target.directory.name + ".partial")
    if staging.exists():
        _remove_tree(staging)
    (staging / "bin").mkdir(parents=True)
    source = _module_source(go)
    modfile = patched_modfile(source, staging)
    if log:
        print(f"building kueue ({KUEUE_PACKAGE}@{KUEUE_VERSION}) ...", flush=True)
    cmd = [
        go,
        "build",
        "-trimpath",
        f"-modfile={modfile}",
        "-ldflags",
        LDFLAGS,
        "-o",
        str(staging / "bin" / "kueue"),
        KUEUE_PACKAGE,
    ]
    result = subprocess.run(cmd, cwd=module_dir(), env=_env(), check=False)
    if result.returncode != 0:
        raise BuildError(f"`{' '.join(cmd)}` failed with exit code {result.returncode}")
    components = source / "config" / "components"
    for part in MANIFESTS:
        origin, copy = components / part, staging / "manifests" / part
        if origin.is_dir():
            shutil.copytree(origin, copy)
        else:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(origin, copy)
    # Copies of the read-only module cache are read-only too; the cache dir must be removable.
    for path in (staging / "manifests").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (staging / "manifests" / "done").write_text(KUEUE_VERSION + "\n")
    _remove_tree(staging / "src")
    for name in ("build.mod", "build.sum"):
        (staging / name).unlink()
    shutil.rmtree(target.directory, ignore_errors=True)
    staging.rename(target.directory)
    if log:
        print(f"kueue built in {target.directory}", file=sys.stderr)
    return target
