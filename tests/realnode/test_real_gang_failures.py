"""A gang's failures on real kubelets, where a Pod told to stop takes its grace period:

* a gang whose GPUs are not there fails its preflight on every rank: the job is
  FAILED/PREFLIGHT_FAILED after one attempt, no retry spent, though `retries: 2`
  would allow two more (each taking every GPU of the gang again);
* a gang whose rank 1 fails once ends SUCCEEDED on attempt 2, and no Pod of attempt 2
  is ever alive alongside one of attempt 1 (sampled all along): attempt 1's rank 0
  ignores SIGTERM, as a rank stuck in a collective does, and lingers for seconds after
  its Job failed; attempt 2's Job is made only once it has ended;
* a gang training data-parallel (torch's gloo) whose rank 1's process is SIGKILLed
  mid-training restarts whole from its last checkpoint: attempt 2's ranks meet only each
  other, never beside attempt 1, and its final weights are those of the same training
  never interrupted, bit for bit.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from kubetrain.domain.manifest import COMPLETION_INDEX, LABEL_ATTEMPT, LABEL_JOB_ID, MASTER_PORT
from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server
from tests.e2e.test_lifecycle import get
from tests.realnode.test_real_pool import job, project, submit, wait_for
from tests.realnode.test_recovery import claim, made_namespace

pytestmark = pytest.mark.realnode

SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}}

# Attempt 1: rank 1 fails after a moment; rank 0 ignores SIGTERM and lingers. Attempt 2:
# both exit 0. Rank 0 listens on the rendezvous port, so rank 1's preflight passes.
FAILS_ONCE = f"""\
import os, signal, socket, sys, time
attempt, rank = os.environ["KUBETRAIN_ATTEMPT"], int(os.environ["PET_NODE_RANK"])
if rank == 0:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", {MASTER_PORT}))
    listener.listen()
print(f"attempt {{attempt}} rank {{rank}} runs", flush=True)
if attempt == "1":
    if rank == 1:
        time.sleep(3)
        sys.exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(15)
time.sleep(2)
"""


def test_a_gang_whose_gpus_are_not_there_fails_after_one_attempt_with_no_retry_spent(
    real_server: Server,
):
    p = project()
    body = job(
        "no-gpus",
        p,
        workers=2,
        retries=2,
        resources={**SMALL, "gpus": 1},
        args=["python", "-c", "print('training')"],
    )
    job_id = submit(real_server, body)
    done = wait_for(real_server, p, job_id, "FAILED", "PREFLIGHT_FAILED", timeout=120)
    assert (done["attempt"], done["retries_used"]) == (1, 0)
    attempts = get(real_server, p, job_id, "/attempts")["items"]
    assert {a["attempt"] for a in attempts} == {1}
    diagnosis = get(real_server, p, job_id, "/diagnosis")
    # The rank and the check named.
    assert re.search(
        r"Rank [01] \(Pod [^)]+\) failed first: preflight failed: gpu-visible",
        diagnosis["explanation"],
    ), diagnosis["explanation"]


def _alive_attempts(kube: Client, namespace: str, job_id: str) -> set[str]:
    """The attempts of the job's Pods that have not ended."""
    return {
        (pod.metadata.labels or {}).get(LABEL_ATTEMPT, "?")
        for pod in kube.list(Pod, namespace=namespace, labels={LABEL_JOB_ID: job_id})
        if pod.metadata is not None
        and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed"))
    }


def test_a_gang_whose_rank_1_fails_once_succeeds_on_attempt_2_never_beside_attempt_1(
    real_server: Server, real_kube: Client
):
    p = project()
    body = job("fails-once", p, workers=2, retries=1, resources=SMALL)
    body["spec"]["args"] = ["python", "-c", FAILS_ONCE]
    job_id = submit(real_server, body)
    samples: list[set[str]] = []
    state: dict[str, Any] = {}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        samples.append(_alive_attempts(real_kube, p, job_id))
        with real_server.client() as http:
            state = http.get(f"/api/v1/projects/{p}/jobs/{job_id}").json()
        if state["business_status"] in ("SUCCEEDED", "FAILED"):
            break
        time.sleep(0.2)
    assert (state["business_status"], state["reason"]) == ("SUCCEEDED", "COMPLETED"), state
    assert (state["attempt"], state["retries_used"]) == (2, 1)
    # Both attempts were seen alive, never together.
    assert any("1" in s for s in samples)
    assert any("2" in s for s in samples)
    overlapping = [s for s in samples if len(s) > 1]
    assert not overlapping, overlapping
    rows = get(real_server, p, job_id, "/history")["items"]
    (waited,) = [r for r in rows if r["raw_reason"] == "PreviousAttemptEnded"]
    assert waited["attempt"] == 1
    # It waited for the lingering rank 0 of attempt 1.
    assert waited["detail"]["pods"], waited
    assert any("-0-" in pod for pod in waited["detail"]["pods"]), waited


# Data-parallel training of a tiny model over the gang (torch's gloo on CPU, gradients
# averaged by all_reduce), STEP_SECONDS a step: each step's batch is a function of the
# step and the rank, rank 0 checkpoints model and optimizer every 4 steps (written whole,
# then renamed), and a rank that starts goes on from the newest checkpoint. Rank 0 says
# which attempt each rank that joined it belongs to, and the final weights' sha256.
DDP = """\
import datetime, hashlib, os, time
import torch
import torch.distributed as dist

torch.manual_seed(0)
torch.set_num_threads(1)
attempt = os.environ["KUBETRAIN_ATTEMPT"]
rank, world = int(os.environ["PET_NODE_RANK"]), int(os.environ["PET_NNODES"])
steps, every, pace = 12, 4, float(os.environ.get("STEP_SECONDS", "0"))
dist.init_process_group(
    "gloo",
    init_method=f"tcp://{os.environ['PET_MASTER_ADDR']}:{os.environ['PET_MASTER_PORT']}",
    rank=rank,
    world_size=world,
    timeout=datetime.timedelta(seconds=120),
)
joined = [None] * world
dist.all_gather_object(joined, attempt)
if rank == 0:
    print(f"attempt {attempt}: ranks joined from attempts {joined}", flush=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
path = os.path.join(os.environ["KUBETRAIN_CHECKPOINT_DIR"], "gang.pt")
start = 0
if os.path.exists(path):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
print(f"attempt {attempt} rank {rank} starts at step {start}", flush=True)
data = torch.Generator().manual_seed(1234)
inputs = torch.randn(steps, world, 16, 8, generator=data)
truth = torch.randn(8, 1, generator=data)
for step in range(start, steps):
    time.sleep(pace)
    x = inputs[step, rank]
    loss = ((model(x) - x @ truth) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    if rank == 0 and (step + 1) % every == 0:
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()
if rank == 0:
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    print("final weights sha256", hashlib.sha256(weights).hexdigest(), flush=True)
dist.destroy_process_group()
"""


def _uninterrupted_ddp(tmp: Path) -> str:
    """The same training, never interrupted, by two processes on this machine (whose
    environment the trainer image mounts): rank 0's final weights line."""
    tmp.mkdir()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETRAIN_", "PET_"))}
    env |= {
        "KUBETRAIN_ATTEMPT": "1",
        "KUBETRAIN_CHECKPOINT_DIR": str(tmp),
        "PET_NNODES": "2",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", DDP],
            env={**env, "PET_NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [r.communicate(timeout=180) for r in ranks]
    assert [r.returncode for r in ranks] == [0, 0], [err for _, err in outputs]
    (line,) = [x for x in outputs[0][0].splitlines() if x.startswith("final weights")]
    return line


def _sigkill(pod: str) -> list[int]:
    """SIGKILL the training process of Pod `pod` from this machine, where the real nodes'
    containers run (the kernel keeps a container's own init from signalling itself): the
    processes whose environment names the Pod (KUBETRAIN_POD_NAME)."""
    mark = f"KUBETRAIN_POD_NAME={pod}".encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue
        killed.append(int(entry.name))
    return killed


def test_a_gang_whose_rank_is_sigkilled_resumes_from_its_checkpoint_bit_for_bit(
    real_server: Server, real_kube: Client, real_testbed: Testbed, tmp_path: Path
):
    """A rank's process SIGKILLed mid-training: the whole gang restarts (retries: 1) as
    attempt 2, never beside attempt 1 (sampled every 0.2 s), whose ranks meet each other
    only and go on from the last checkpoint; the final weights are those of the same
    training never interrupted, bit for bit."""
    with made_namespace(real_kube, real_testbed) as p:
        checkpoints = tmp_path / "checkpoints"
        checkpoints.mkdir()
        checkpoints.chmod(0o777)
        claim(real_kube, p, "checkpoints", checkpoints, "ReadWriteMany")
        body = job(
            "sigkilled",
            p,
            workers=2,
            retries=1,
            resources={"requests": {"cpu": "500m", "memory": "1Gi"}},
            checkpoints={"claim": "checkpoints"},
            env=[{"name": "STEP_SECONDS", "value": "1"}],
        )
        body["spec"]["args"] = ["python", "-c", DDP]
        # Before the submission: on a loaded machine the reference run took longer than
        # the gang's whole training, which ended before its rank could be killed.
        reference = _uninterrupted_ddp(tmp_path / "uninterrupted")
        job_id = submit(real_server, body)
        samples: list[set[str]] = []
        state: dict[str, Any] = {}
        killed: list[int] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            samples.append(_alive_attempts(real_kube, p, job_id))
            if not killed and (checkpoints / "gang.pt").exists():
                # Attempt 1 checkpointed step 4 and trains on: kill rank 1's process.
                (rank_1,) = [
                    pod.metadata.name
                    for pod in real_kube.list(
                        Pod, namespace=p, labels={LABEL_JOB_ID: job_id, LABEL_ATTEMPT: "1"}
                    )
                    if (pod.metadata.annotations or {}).get(COMPLETION_INDEX) == "1"
                ]
                killed = _sigkill(rank_1)
                assert killed, f"{rank_1}: no process of it to kill (did it end already?)"
            with real_server.client() as http:
                state = http.get(f"/api/v1/projects/{p}/jobs/{job_id}").json()
            if state["business_status"] in ("SUCCEEDED", "FAILED"):
                break
            time.sleep(0.2)
        ranks: dict[tuple[str | None, str | None], Any] = {
            (
                (pod.metadata.labels or {}).get(LABEL_ATTEMPT),
                (pod.metadata.annotations or {}).get(COMPLETION_INDEX),
            ): pod
            for pod in real_kube.list(Pod, namespace=p, labels={LABEL_JOB_ID: job_id})
        }
        logs = {k: "".join(real_kube.log(v.metadata.name, namespace=p)) for k, v in ranks.items()}
        assert (state["business_status"], state["reason"]) == ("SUCCEEDED", "COMPLETED"), logs
        assert (state["attempt"], state["retries_used"]) == (2, 1), logs
        overlapping = [s for s in samples if len(s) > 1]
        assert not overlapping, overlapping
        # Attempt 1 ended by its rank 1's process killed (SIGKILL: 128 + 9); its Pods went
        # with its Job, the attempts kubetrain recorded say so.
        ended = {
            (a["attempt"], a["rank"]): a for a in get(real_server, p, job_id, "/attempts")["items"]
        }
        assert ended[1, 1]["exit_code"] == 137, ended
        lines = logs["2", "0"].splitlines()
        # Attempt 2's ranks met each other only, and went on from the last checkpoint.
        assert "attempt 2: ranks joined from attempts ['2', '2']" in lines, lines
        assert "attempt 2 rank 0 starts at step 4" in lines, lines
        (final,) = [x for x in lines if x.startswith("final weights")]
        assert final == reference
