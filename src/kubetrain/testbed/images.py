"""The real-node pool's images, built without a registry as OCI archives for
`ctr images import`, and cached by content like the binaries.

* the sandbox image `localhost/kubetrain-pause:testbed`: our static
  `testbed-pause` program, the image's only file;
* the trainer image `localhost/kubetrain-trainer:testbed`: an empty root file
  system (symlinks into /usr, empty /etc and /tmp) whose entrypoint is
  `kubetrain run --` from this machine's Python environment;
* the server image `localhost/kubetrain:testbed` (`up --in-cluster` runs
  `deploy/base` on it): the same root file system, entrypoint `kubetrain`, user
  10001:10001 as the Dockerfile's server stage. That environment
  (the virtualenv, its base Python, kubetrain's source and /usr for the C
  library) is not copied in: the node's runtime bind-mounts it read-only into
  every container (see `host_mounts`), because torch alone is gigabytes.

Each archive carries one name, in the `io.containerd.image.name` annotation, so
the import makes exactly one image (an extra `import-…` name made the CRI look
the image up under that name and fail).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import kubetrain
from kubetrain.testbed.build import Binaries, cache_root

PAUSE_IMAGE = "localhost/kubetrain-pause:testbed"
TRAINER_IMAGE = "localhost/kubetrain-trainer:testbed"
SERVER_IMAGE = "localhost/kubetrain:testbed"
SERVER_USER = "10001:10001"  # the Dockerfile's, and deploy/base's runAsUser
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Image:
    name: str
    archive: Path


def host_mounts() -> list[str]:
    """Host directories the trainer image's entrypoint needs, mounted read-only at
    the same paths: /usr (the C library; Debian's /lib is /usr/lib), the base
    Python, the virtualenv and, for an editable install, kubetrain's source."""
    paths = {"/usr", sys.base_prefix, sys.prefix, str(_source_root())}
    # Nested paths would be mounted twice; keep the outermost.
    ordered = sorted(paths)
    return [p for p in ordered if not any(p != q and p.startswith(q + "/") for q in ordered)]


def _source_root() -> Path:
    return Path(kubetrain.__file__).resolve().parents[1]


def build_images(binaries: Binaries) -> list[Image]:
    """The archives to import into every real node's containerd (built once)."""
    return [
        _cached(PAUSE_IMAGE, _pause_layer(binaries), {"Entrypoint": ["/pause"]}),
        _cached(TRAINER_IMAGE, _trainer_layer(), _trainer_config()),
        _cached(SERVER_IMAGE, _trainer_layer(), _server_config()),
    ]


def _trainer_config() -> dict[str, object]:
    venv_bin = Path(sys.prefix) / "bin"
    env = [f"PATH={venv_bin}:{_PATH}", f"PYTHONPATH={_source_root()}", "PYTHONUNBUFFERED=1"]
    return {"Entrypoint": [str(venv_bin / "kubetrain"), "run", "--"], "Env": env}


def _server_config() -> dict[str, object]:
    """The Dockerfile's server stage: `kubetrain serve` as user 10001. Nothing is
    written beside the code (the root file system is read-only in deploy/base)."""
    venv_bin = Path(sys.prefix) / "bin"
    env = [
        f"PATH={venv_bin}:{_PATH}",
        f"PYTHONPATH={_source_root()}",
        "PYTHONUNBUFFERED=1",
        "PYTHONDONTWRITEBYTECODE=1",
    ]
    return {
        "Entrypoint": [str(venv_bin / "kubetrain")],
        "Cmd": ["serve", "--host", "0.0.0.0"],  # noqa: S104 (inside the Pod)
        "Env": env,
        "User": SERVER_USER,
        "ExposedPorts": {"8080/tcp": {}},
    }


def _pause_layer(binaries: Binaries) -> bytes:
    return _tar([("pause", binaries.path("testbed-pause").read_bytes(), 0o755)])


def _trainer_layer() -> bytes:
    links = [("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")]
    return _tar([], dirs=[("etc", 0o755), ("tmp", 0o1777), ("usr", 0o755)], links=links)


def _tar(
    files: Sequence[tuple[str, bytes, int]],
    dirs: Sequence[tuple[str, int]] = (),
    links: Sequence[tuple[str, str]] = (),
) -> bytes:
    """A layer with fixed owners and times, so equal contents give equal digests."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in dirs:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name, target in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _blob(data: bytes) -> tuple[str, dict[str, object]]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return digest, {"digest": digest, "size": len(data)}


def oci_archive(name: str, layer: bytes, config: dict[str, object]) -> bytes:
    """An OCI image layout (oci-layout, index.json, blobs) in one tar, one image."""
    layer_digest, layer_desc = _blob(layer)
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_digest, config_desc = _blob(config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest, manifest_desc = _blob(manifest_bytes)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **manifest_desc,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    entries = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
        *[
            (f"blobs/sha256/{d.removeprefix('sha256:')}", data)
            for d, data in (
                (layer_digest, layer),
                (config_digest, config_bytes),
                (manifest_digest, manifest_bytes),
            )
        ],
    ]
    return _tar([(path, data, 0o644) for path, data in entries])


def _cached(name: str, layer: bytes, config: dict[str, object]) -> Image:
    archive = oci_archive(name, layer, config)
    digest = hashlib.sha256(archive).hexdigest()[:16]
    slug = name.split("/")[-1].replace(":", "-")
    path = cache_root() / "testbed" / "images" / f"{slug}-{digest}.tar"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # A name of this process's own: two test workers may write the same archive.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
        tmp.write_bytes(archive)
        tmp.replace(path)
    return Image(name, path)
