"""The on-disk layout of checkpoints, readable without torch (the preflight scans it).

    ROOT/step-000000001200/state.pt        torch.save of model, optimizer, scheduler, RNG, extra
    ROOT/step-000000001200/MANIFEST.json   written last: step, files (size, sha256), binding, pod
    ROOT/.staging-...                      a save in flight, or one killed mid-way (swept)

A checkpoint directory is renamed into place only once complete, and its
manifest is the only proof of validity: a directory without one, or whose
files differ from it in size or checksum, is skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetrain.runtime.stamp import sha256_file

MANIFEST = "MANIFEST.json"
FORMAT = 1
STAGING_PREFIX = ".staging-"
_STEP_DIR = re.compile(r"step-(\d{12})")


def step_dir_name(step: int) -> str:
    return f"step-{step:012d}"


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
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return Found(path, step, f"manifest is not format {FORMAT}")
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
        if checksums and sha256_file(path / name) != expected.get("sha256"):
            return Found(path, step, f"{name} does not match its sha256")
    return Found(path, step, None, manifest)
