"""Runtime tier fixtures: directories on a mounted filesystem, `kubetrain run` in a process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
# The checkpoint and output checks want a volume, not the root filesystem: a
# tmpfs is one (tmp_path is on the root filesystem on most machines).
MOUNTED = Path("/dev/shm")


@pytest.fixture
def volume() -> Iterator[Path]:
    """A fresh directory on a filesystem other than the root's."""
    assert os.stat(MOUNTED).st_dev != os.stat("/").st_dev, f"{MOUNTED} must be a tmpfs"
    path = MOUNTED / f"kubetrain-test-{uuid.uuid4().hex[:10]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def base_env(**extra: str) -> dict[str, str]:
    """A container-like environment: none of this machine's KUBETRAIN_* or GPU variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("KUBETRAIN_", "NVIDIA_", "CUDA_"))
    }
    env["PYTHONPATH"] = str(SRC)
    env.update(extra)
    return env


def kubetrain(
    *args: str, env: Mapping[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m kubetrain.runtime ARGS`: what the console script hands `run` to."""
    return subprocess.run(
        [sys.executable, "-m", "kubetrain.runtime", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The gpu tier runs only when a `-m` expression names it: CI has no GPU. Left out, its
    tests are reported as deselected (never as passed or skipped); asked for on a machine
    without a GPU, they fail."""
    if "gpu" in (config.getoption("markexpr") or ""):
        return
    left_out = [item for item in items if item.get_closest_marker("gpu")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
