"""The dataset stamp: `kubetrain-dataset.json` at a dataset's root says what the dataset is.

    {"name": "imagenet", "version": "2024-01", "files": {"train/00001.tar": "<sha256>", ...}}

`files` is optional; `kubetrain dataset stamp PATH --name N --version V` writes
it with every regular file's sha256, atomically (a reader sees the old stamp
or the new one), so the preflight can verify what is mounted.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from kubetrain.runtime.contract import DATASET_STAMP

CHUNK = 1 << 20


class StampError(ValueError):
    """A stamp that cannot be read or does not say what it must; the message names the field."""


@dataclass(frozen=True)
class Stamp:
    name: str
    version: str
    files: dict[str, str]  # path relative to the dataset root -> sha256 hex


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return sha256_stream(handle)


def sha256_stream(handle: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def parse_stamp(raw: bytes, where: str) -> Stamp:
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StampError(f"{where} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise StampError(f"{where} must hold a JSON object")
    for field in ("name", "version"):
        if not isinstance(document.get(field), str) or not document[field]:
            raise StampError(f"{where}: {field} must be a non-empty string")
    files = document.get("files", {})
    if not isinstance(files, dict):
        raise StampError(f"{where}: files must be an object of path: sha256")
    for path, digest in files.items():
        if not _inside(path):
            raise StampError(f"{where}: files: {path!r} is not a relative path inside the dataset")
        if not (isinstance(digest, str) and len(digest) == 64 and _is_hex(digest)):
            raise StampError(f"{where}: files: {path!r} needs a sha256 of 64 hex digits")
    return Stamp(document["name"], document["version"], dict(files))


def write_stamp(root: Path, name: str, version: str, *, with_files: bool = True) -> Stamp:
    """Hashes every regular file under `root` (the stamp itself excepted) and writes the stamp."""
    if not name:
        raise StampError("--name must not be empty")
    if not version:
        raise StampError("--version must not be empty")
    if not root.is_dir():
        raise StampError(f"PATH {str(root)!r} is not a directory")
    files: dict[str, str] = {}
    if with_files:
        for directory, subdirs, names in os.walk(root):
            subdirs.sort()
            for file_name in sorted(names):
                path = Path(directory, file_name)
                relative = path.relative_to(root).as_posix()
                if relative == DATASET_STAMP or relative.startswith(".kubetrain-stamp-"):
                    continue
                if path.is_file() and not path.is_symlink():
                    files[relative] = sha256_file(path)
    stamp = Stamp(name, version, files)
    body = json.dumps(
        {"name": name, "version": version, "files": files}, indent=1, sort_keys=True
    ).encode()
    _write_atomically(root / DATASET_STAMP, body)
    return stamp


def _write_atomically(target: Path, body: bytes) -> None:
    staging = target.with_name(f".kubetrain-stamp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with staging.open("wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _inside(path: Any) -> bool:
    if not isinstance(path, str) or not path or "\\" in path:
        return False
    pure = PurePosixPath(path)
    return not pure.is_absolute() and ".." not in pure.parts


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text.lower())
