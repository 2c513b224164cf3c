"""The on-disk layout of checkpoints, readable without torch (the preflight scans it).

    ROOT/step-000000001200/state.pt        torch.save of model, optimizer, scheduler, RNG, extra
    ROOT/step-000000001200/MANIFEST.json   written last: step, files (size, checksum), binding, pod
    ROOT/.staging-...                      a save in flight, or one killed mid-way (swept)

A gang's checkpoint (torch.distributed, world size N > 1) holds one shard per
rank in place of state.pt, rank-00000.pt ... rank-<N-1>.pt, each that rank's
own state; its manifest lists them all and binds the world size
(`binding.world_size`; absent: 1).

A checkpoint directory is renamed into place only once complete, and its
manifest is the only proof of validity: a directory without one, or whose
files differ from it in size or checksum, is skipped.

Manifest formats (both are read):

    1  files: {"state.pt": {"size": N, "sha256": HEX}}
    2  files: {"state.pt": {"size": N, "algorithm": "crc32", "checksum": "%08x"}}

Format 2 checksums with CRC-32: zlib computes it at ~6 GB/s here, on a second
thread while the bytes are written (`checkpoint_stream`), so a save costs no
pass of its own over the tensors, and it verifies at twice sha256's speed.
It is there to catch accidental damage (truncation is caught by the size
first; CRC-32 catches every burst of up to 32 flipped bits and misses random
damage with odds of 2^-32); it is not a seal against someone who can write
the volume, who could rewrite the manifest as well, whatever its hash
(loading is weights_only for that).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetrain.runtime.stamp import sha256_file

MANIFEST = "MANIFEST.json"
FORMAT = 2  # what is written
READABLE_FORMATS = (1, 2)
CHECKSUM = "crc32"
READ_CHUNK = 8 << 20
STAGING_PREFIX = ".staging-"
_STEP_DIR = re.compile(r"step-(\d{12})")


def step_dir_name(step: int) -> str:
    return f"step-{step:012d}"


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


@dataclass
class Found:
    """One committed checkpoint directory, and why it cannot be used (None: it can)."""

    path: Path
    step: int
    problem: str | None
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def binding(self) -> dict[str, Any]:
        binding = self.manifest.get("binding")
        return binding if isinstance(binding, dict) else {}

    @property
    def world_size(self) -> int:
        """How many ranks saved it: one shard each (1: a single process, state.pt)."""
        size = self.binding.get("world_size", 1)
        return size if isinstance(size, int) else 0


def scan(root: Path, *, checksums: bool = False) -> list[Found]:
    """Committed checkpoints under `root`, newest first, each verified (sizes; checksums too)."""
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.fullmatch(entry.name)
        if match and entry.is_dir():
            found.append(verify(entry, int(match[1]), checksums=checksums))
    return sorted(found, key=lambda f: f.step, reverse=True)


def verify(path: Path, step: int, *, checksums: bool) -> Found:
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
    except FileNotFoundError:
        return Found(path, step, "no manifest (partial)")
    except (OSError, ValueError) as exc:
        return Found(path, step, f"manifest unreadable: {exc}")
    if not isinstance(manifest, dict) or manifest.get("format") not in READABLE_FORMATS:
        formats = " or ".join(str(f) for f in READABLE_FORMATS)
        return Found(path, step, f"manifest is not format {formats}")
    if manifest.get("step") != step:
        return Found(path, step, f"manifest says step {manifest.get('step')}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return Found(path, step, "manifest lists no files")
    for name, expected in files.items():
        if "/" in name or not isinstance(expected, dict):
            return Found(path, step, f"manifest entry {name!r} is malformed")
        try:
            size = (path / name).stat().st_size
        except OSError:
            return Found(path, step, f"{name} is missing")
        if size != expected.get("size"):
            said = expected.get("size")
            return Found(path, step, f"{name} has {size} bytes, the manifest says {said}")
        algorithm, digest = _checksum(manifest["format"], expected)
        if algorithm not in CHECKSUMS or not isinstance(digest, str):
            return Found(path, step, f"manifest entry {name!r} has no known checksum")
        if checksums and CHECKSUMS[algorithm](path / name) != digest:
            return Found(path, step, f"{name} does not match its {algorithm}")
    return Found(path, step, None, manifest)


def checksum_problem(found: Found, name: str) -> str | None:
    """Why one file of a checkpoint verified by size fails its checksum (None: it passes).
    Each rank of a gang checks its own shard: every byte is read once, by one rank."""
    entry = found.manifest.get("files", {}).get(name)
    if not isinstance(entry, dict):
        return f"{name} is not in its manifest"
    algorithm, digest = _checksum(found.manifest["format"], entry)
    if CHECKSUMS[algorithm](found.path / name) != digest:
        return f"{name} does not match its {algorithm}"
    return None


def file_entry(size: int, crc32: int) -> dict[str, Any]:
    """A format-2 manifest entry for a file."""
    return {"size": size, "algorithm": CHECKSUM, "checksum": f"{crc32:08x}"}


def crc32_file(path: Path) -> str:
    crc = 0
    with path.open("rb", buffering=0) as handle:
        while chunk := handle.read(READ_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


CHECKSUMS = {"crc32": crc32_file, "sha256": sha256_file}


def _checksum(version: int, entry: dict[str, Any]) -> tuple[Any, Any]:
    if version == 1:
        return "sha256", entry.get("sha256")
    return entry.get("algorithm"), entry.get("checksum")
