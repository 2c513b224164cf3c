"""kubetrain.runtime needs only the standard library: its imports, runs without site-packages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubetrain.domain import manifest
from kubetrain.runtime import contract
from tests.runtime.conftest import SRC, base_env

pytestmark = pytest.mark.runtime

SERVER_SIDE = (
    "fastapi",
    "sqlalchemy",
    "lightkube",
    "pydantic",
    "httpx",
    "yaml",
    "kubetrain.domain",
)
RUNTIME_MODULES = [
    f"kubetrain.runtime.{path.stem}"
    for path in sorted((SRC / "kubetrain" / "runtime").glob("*.py"))
    if path.stem not in ("__init__", "__main__")
] + ["kubetrain.cli.main"]


def test_the_contract_agrees_with_the_manifest():
    assert contract.PREFLIGHT_EXIT_CODE == manifest.PREFLIGHT_EXIT_CODE == 86
    assert contract.TERMINATION_LOG_DEFAULT == manifest.TERMINATION_LOG


def test_importing_the_runtime_pulls_in_nothing_of_the_server_side():
    script = (
        "import importlib, json, sys\n"
        f"for name in {RUNTIME_MODULES!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=base_env(), capture_output=True, text=True, check=True
    )
    loaded = json.loads(done.stdout)
    assert "kubetrain.runtime.checkpoint" in loaded
    leaked = [m for m in loaded if m.split(".")[0] in SERVER_SIDE or m.startswith(SERVER_SIDE)]
    assert leaked == []
    assert "torch" not in loaded  # torch is imported when a checkpoint is saved, not before


def _bare(tmp_path: Path) -> Path:
    """src/kubetrain with nothing else: what `pip install --no-deps` puts in an image."""
    shutil.copytree(SRC / "kubetrain", tmp_path / "kubetrain")
    return tmp_path


@pytest.mark.parametrize(
    "entry",
    [
        ["-m", "kubetrain.runtime"],
        ["-c", "import sys; from kubetrain.cli.main import main; sys.exit(main())"],
    ],
    ids=["python -m kubetrain.runtime", "the kubetrain console script"],
)
def test_run_and_stamp_work_with_only_the_standard_library(tmp_path, entry):
    root = _bare(tmp_path / "site")
    data = tmp_path / "data"
    data.mkdir()
    (data / "x").write_text("x")
    # -S: no site-packages; -E -s: no PYTHONPATH, no user site; the bare copy (cwd) is the path.
    python = [sys.executable, "-S", "-E", "-s"]
    env = {"PATH": os.environ["PATH"], "KUBETRAIN_EXPECTED_GPUS": "0"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*python, *entry, *args], cwd=root, env=env, capture_output=True, text=True, check=False
        )

    stamped = run("dataset", "stamp", str(data), "--name", "d", "--version", "1")
    assert stamped.returncode == 0, stamped.stderr
    assert json.loads((data / "kubetrain-dataset.json").read_text())["name"] == "d"
    ran = run("run", "--", sys.executable, "-c", "print('trained')")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "trained\n"
    # and the bare copy really is bare: the server side does not import there
    broken = subprocess.run(
        [*python, "-c", "import kubetrain.api.app"], cwd=root, env=env, capture_output=True
    )
    assert broken.returncode != 0


def test_dataset_stamp_names_the_bad_argument(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetrain.runtime",
            "dataset",
            "stamp",
            str(tmp_path / "no"),
            "--name",
            "d",
            "--version",
            "1",
        ],
        env=base_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("kubetrain: error: PATH ")
    assert "Traceback" not in done.stderr
