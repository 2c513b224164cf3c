"""A gang of two workers under a real torchrun (gloo, CPU, loopback), driven through the
PET_ variables as Kubeflow Trainer's torch runtime sets them: `kubetrain run` (its
rendezvous check among the others) execs torchrun, which rendezvouses; the ranks save
sharded checkpoints; every rank is SIGKILLed at random moments, some mid-save, and the
gang restarted each time ends bit for bit where an uninterrupted gang does."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch

from kubetrain.runtime.checkpoint import CheckpointManager, IncompatibleCheckpoint
from kubetrain.testbed.processes import pick_free_ports
from tests.runtime import tiny_training
from tests.runtime.conftest import SRC, base_env

pytestmark = pytest.mark.runtime

REPO = SRC.parent
SCRIPT = Path(__file__).with_name("tiny_gang.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
WORKERS = 2
STEPS = 300
KILL_ROUNDS = 3  # each kills both ranks, one after the other: 6 SIGKILLs


def _start_gang(
    root: Path, logs: Path, *, blocking: bool, workers: int = WORKERS
) -> list[subprocess.Popen[bytes]]:
    """One `kubetrain run -- torchrun` per worker, as each worker's container runs it; the
    ranks are `workers` workers of WORKERS // workers processes."""
    port = str(pick_free_ports(1)[0])
    pods = []
    for rank in range(workers):
        env = base_env(
            PYTHONPATH=f"{SRC}{os.pathsep}{REPO}",
            OMP_NUM_THREADS="1",
            KUBETRAIN_WORKERS=str(workers),
            KUBETRAIN_WORKER_INDEX=str(rank),
            KUBETRAIN_RENDEZVOUS_TIMEOUT_SECONDS="60",
            PET_NNODES=str(workers),
            PET_NPROC_PER_NODE=str(WORKERS // workers),
            PET_NODE_RANK=str(rank),
            PET_MASTER_ADDR="localhost",  # a name: the check resolves it, as cluster DNS would
            PET_MASTER_PORT=port,
        )
        mode = "blocking" if blocking else "async"
        command = [sys.executable, "-m", "kubetrain.runtime", "run", "--", str(TORCHRUN)]
        with (logs / f"worker-{rank}.log").open("ab") as log:
            pods.append(
                subprocess.Popen(
                    [*command, str(SCRIPT), str(root), str(STEPS), mode],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Pod: killed as a group
                )
            )
    return pods


def _kill(pod: subprocess.Popen[bytes], root: Path, rank: int) -> None:
    """The whole Pod: torchrun's process group, and the rank it started in a session of its own."""
    worker = int((root / "pids" / f"rank-{rank}").read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(worker, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pod.pid, signal.SIGKILL)
    pod.wait(10)


def _wait_for(
    condition: Callable[[], bool], pods: list[subprocess.Popen[bytes]], what: str
) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert all(p.poll() is None for p in pods), f"a worker ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within 60 s"
        time.sleep(0.0005)


def _log(root: Path, rank: int) -> tuple[list[int], dict[int, str]]:
    """The steps each start resumed from, and the loss of every step (the last one logged)."""
    resumed: list[int] = []
    losses: dict[int, set[str]] = {}
    path = root / f"losses-{rank}"
    for line in path.read_text().splitlines() if path.exists() else []:
        first, second = line.split()
        if first == "resumed":
            resumed.append(int(second))
        else:
            losses.setdefault(int(first), set()).add(second)
    assert all(len(seen) == 1 for seen in losses.values()), "a replayed step had another loss"
    return resumed, {step: seen.pop() for step, seen in losses.items()}


def _steps_logged(root: Path) -> int:
    path = root / "losses-0"
    return sum(not line.startswith("resumed") for line in path.read_text().splitlines())


def _all_exist(paths: list[Path]) -> bool:
    return all(path.exists() for path in paths)


def _saving(root: Path, stale: set[Path]) -> bool:
    return bool(set(root.glob(".staging-*")) - stale)


def _logged_at_least(root: Path, steps: int) -> bool:
    return _steps_logged(root) >= steps


def _run_to_the_end(root: Path, logs: Path, *, blocking: bool, workers: int = WORKERS) -> None:
    pods = _start_gang(root, logs, blocking=blocking, workers=workers)
    for pod in pods:
        assert pod.wait(120) == 0, (logs / "worker-0.log").read_text()[-3000:]


@pytest.mark.timeout(300)
def test_a_gang_killed_rank_by_rank_resumes_bit_for_bit(tmp_path, volume):
    logs = tmp_path / "logs"
    logs.mkdir()
    reference = volume / "reference"
    reference.mkdir()
    # One worker of two processes: the same two ranks, one torchrun fewer to start.
    _run_to_the_end(reference, tmp_path, blocking=True, workers=1)

    killed = tmp_path / "killed"
    killed.mkdir()
    chance = random.Random(20)  # noqa: S311 - kill timings, not secrets
    mid_save = 0
    for attempt in range(KILL_ROUNDS):
        stale = set(killed.glob(".staging-*"))  # a killed save's; rank 0 sweeps it at start
        (killed / "pids").mkdir(exist_ok=True)
        for pid_file in (killed / "pids").iterdir():
            pid_file.unlink()
        pods = _start_gang(killed, logs, blocking=attempt % 2 == 0)
        pids = [killed / "pids" / f"rank-{rank}" for rank in range(WORKERS)]
        _wait_for(partial(_all_exist, pids), pods, "training")
        if attempt % 2 == 0:  # the moment a save is under way
            _wait_for(partial(_saving, killed, stale), pods, "save")
        else:  # a few steps in, wherever that falls
            wanted = _steps_logged(killed) + chance.randint(1, 12)
            _wait_for(partial(_logged_at_least, killed, wanted), pods, "steps")
            time.sleep(chance.uniform(0, 0.01))
        first = chance.randrange(WORKERS)  # one rank dies; the other soon after, as a gang does
        _kill(pods[first], killed, first)
        time.sleep(chance.uniform(0, 0.02))
        _kill(pods[1 - first], killed, 1 - first)
        mid_save += _saving(killed, stale)
    _run_to_the_end(killed, logs, blocking=False)
    for rank in range(WORKERS):  # every start of each worker went through the check
        checks = [
            line
            for line in (logs / f"worker-{rank}.log").read_text().splitlines()
            if line.startswith("kubetrain preflight: rendezvous-reachable ")
        ]
        assert len(checks) == KILL_ROUNDS + 1
        assert all(" passed " in line for line in checks), checks

    assert mid_save >= 1, "no kill landed mid-save"
    starts = [_log(killed, rank)[0] for rank in range(WORKERS)]
    assert starts[0] == starts[1], "the ranks resumed from different checkpoints"
    assert len(starts[0]) == KILL_ROUNDS + 1
    assert starts[0] == sorted(starts[0]), "a restart went back to an older checkpoint"
    assert starts[0][-1] > 0
    for rank in range(WORKERS):
        # Every step, however often it was replayed, had the uninterrupted gang's loss.
        assert _log(killed, rank)[1] == _log(reference, rank)[1]
    final = torch.load(killed / "final.pt", weights_only=True)
    want = torch.load(reference / "final.pt", weights_only=True)
    assert final.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(final[name], tensor), name

    # One process cannot take the place of the gang of two.
    model, optimizer, scheduler = tiny_training.build()
    alone = CheckpointManager(killed, binding=tiny_training.BINDING)
    with pytest.raises(IncompatibleCheckpoint, match="saved by 2 ranks, this run has 1 process"):
        alone.resume(model=model, optimizer=optimizer, scheduler=scheduler)
    alone.close()
