"""The README's two commands do all the set-up: `make test` and `make demo` install
the Debian packages the tests need before anything else (dry run of the real Makefile)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("target", ["test", "demo", "lint"])
def test_the_readme_targets_install_the_system_packages_first(target: str):
    # -B: as on a fresh machine, where nothing is up to date yet
    plan = subprocess.run(
        ["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    before_venv = plan[: plan.index("-m venv")]
    assert "dpkg-query" in before_venv
    assert "apt-get install" in before_venv
    for needed in ("postgresql", "chromium", "python3-venv"):
        assert needed in before_venv


def test_ci_runs_the_readme_commands_not_its_own_set_up():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    assert "apt-get" not in ci
