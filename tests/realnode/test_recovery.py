"""The seed's two recoveries, on real kubelets: a lost node's training resumes from its
last checkpoint on the other node, bit for bit; a dataset of the wrong version fails the
preflight, and with it the Job, at once.

Volumes: the real pool has no dynamic provisioner, so each test binds a static
PersistentVolume of type hostPath on a directory of this machine (ReadWriteMany, no
node affinity) to a claim in the job's namespace. Both nodes run on this machine, so
both mount the same directory: what a shared filesystem is on a real cluster.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, PersistentVolume, PersistentVolumeClaim
from playwright.sync_api import Page, expect

from kubetrain.local_server import CLI
from kubetrain.runtime import checkpoint_files
from kubetrain.testbed.cluster import Testbed
from tests.chromium import sign_in
from tests.e2e.conftest import Server
from tests.e2e.test_lifecycle import assert_valid_path, business_path, get
from tests.kube import create, eventually
from tests.realnode.test_real_pool import job, kubectl, project, submit, wait_for

JWT = re.compile(r"eyJ[\w-]+\.[\w-]+\.[\w-]+")  # a ServiceAccount token's shape

pytestmark = pytest.mark.realnode

STEPS = 200
EVERY = 5
# Seconds per step: attempt 1 is killed ~2 s into a ~70 s run. The slack is for a busy
# CI: once there, attempt 1's step reports reached the server only 45 s late (after the
# reporter's backoff), and a 40 s run had ended before the node could be lost mid-run.
PACE = 0.35
TRAIN = ["--steps", str(STEPS), "--every", str(EVERY)]
# PodGC fails a vanished node's Pods 40-60 s after the Node went, then the
# replacement starts (torch's import on a shared 2-core machine) and finishes.
AFTER_LOSS = 240.0


def claim(kube: Client, namespace: str, name: str, path: Path, mode: str) -> None:
    """A static hostPath PersistentVolume on `path`, pre-bound to the claim `name`."""
    volume = f"{namespace}-{name}"
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": [mode],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": name},
            },
        },
    )
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": [mode],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        namespace,
    )
    eventually(
        lambda: kube.get(PersistentVolumeClaim, name, namespace=namespace).status.phase == "Bound",
        30,
        what=f"claim {name} bound",
    )


@contextmanager
def made_namespace(real_kube: Client, real_testbed: Testbed) -> Iterator[str]:
    """A project's namespace, made before its claims; deleted with its volumes after."""
    name = project()
    kubectl(real_testbed, "create", "namespace", name)
    eventually(
        lambda: "default" in kubectl(real_testbed, "get", "sa", "-n", name, "-o", "name"),
        30,
        what="the default ServiceAccount",
    )
    yield name
    kubectl(real_testbed, "delete", "namespace", name, "--wait=false")
    for volume in real_kube.list(PersistentVolume):
        if str(volume.metadata.name).startswith(f"{name}-"):
            real_kube.delete(PersistentVolume, volume.metadata.name)


@pytest.fixture
def namespace(real_kube: Client, real_testbed: Testbed) -> Iterator[str]:
    with made_namespace(real_kube, real_testbed) as name:
        yield name


def uninterrupted(tmp: Path) -> list[str]:
    """The same training, never interrupted, in this machine's environment (the one the
    trainer image mounts): its output lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETRAIN_", "PET_"))}
    env["KUBETRAIN_CHECKPOINT_DIR"] = str(tmp / "uninterrupted")
    done = subprocess.run(
        [sys.executable, "-m", "kubetrain.testbed.tiny_training", *TRAIN],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def assert_never_queued_once_running(path: list[tuple[str, str]]) -> None:
    """A real kubelet writes a container's end before the Pod's phase: that moment is
    the attempt finishing, not a job back in the queue."""
    running = next(i for i, (state, _) in enumerate(path) if state == "RUNNING")
    assert all(state != "QUEUED" for state, _ in path[running:]), path


@dataclass(frozen=True)
class Resumed:
    """The node-loss resume run, once its job SUCCEEDED on the other node."""

    project: str
    job_id: str
    checkpoints: Path  # the claim's directory on this machine
    newest: checkpoint_files.Found  # attempt 1's newest valid checkpoint when its node went
    lost: str  # attempt 1's node
    done: dict[str, Any]  # the job, SUCCEEDED
    attempts: list[dict[str, Any]]  # read while the lost node was still gone
    reference: list[str]  # the same training's output, never interrupted


@pytest.fixture(scope="module")
def resumed(
    real_server: Server,
    real_kube: Client,
    real_testbed: Testbed,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Resumed]:
    """Attempt 1 trains on one real node; after its second checkpoint the node is lost;
    the job resumes on the other node and succeeds. Run once for the checks after it."""
    tmp_path = tmp_path_factory.mktemp("resume")
    with made_namespace(real_kube, real_testbed) as p:
        checkpoints = tmp_path / "checkpoints"
        checkpoints.mkdir()
        claim(real_kube, p, "checkpoints", checkpoints, "ReadWriteMany")
        body = job(
            "resume",
            p,
            args=[
                "python",
                "-m",
                "kubetrain.testbed.tiny_training",
                *TRAIN,
                "--step-seconds",
                str(PACE),
            ],
            resources={"requests": {"cpu": "1", "memory": "1Gi"}},
            checkpoints={"claim": "checkpoints"},
            retries=0,
        )
        job_id = submit(real_server, body)
        began = time.monotonic()

        seen: dict[str, Any] = {}

        def checkpointed() -> dict[str, Any] | None:
            # The files themselves, and the steps up to them reported: the node must be
            # lost mid-run, with what attempt 1 did on record (the job page draws it; in
            # CI once, a node lost before any report of attempt 1 had arrived left the
            # chart no step before the resume to mark it on).
            doc: dict[str, Any] = get(real_server, p, job_id)
            seen.update({k: doc.get(k) for k in ("business_status", "reason", "message", "node")})
            on_disk = [f.step for f in checkpoint_files.scan(checkpoints) if not f.problem]
            reported = (doc.get("progress") or {}).get("step") or 0
            seen.update(checkpoints=on_disk, reported=reported)
            ready = max(on_disk, default=0) >= 2 * EVERY and reported >= 2 * EVERY
            return doc if doc.get("node") and ready else None

        first = eventually(
            checkpointed, 180, interval=0.1, what=lambda: f"attempt 1's second checkpoint ({seen})"
        )
        lost = str(first["node"])
        killed = time.monotonic()
        real_testbed.stop_real_node(lost)
        try:
            # What attempt 1 left: the newest checkpoint whose files all hold.
            valid = [f for f in checkpoint_files.scan(checkpoints, checksums=True) if not f.problem]
            newest = valid[0]
            assert 2 * EVERY <= newest.step < STEPS, [f.step for f in valid]
            real_kube.delete(Node, lost)
            reference = uninterrupted(tmp_path)  # while Pod garbage collection waits
            wait_for(real_server, p, job_id, "QUEUED", "NODE_LOST", timeout=60)
            node_lost = time.monotonic() - killed
            done = wait_for(real_server, p, job_id, "SUCCEEDED", "COMPLETED", timeout=AFTER_LOSS)
            succeeded = time.monotonic() - killed
            # Read while the node is still gone: attempt 1's last word is that it is.
            attempts = get(real_server, p, job_id, "/attempts")["items"]
        finally:
            real_testbed.start_real_node(lost)
        print(
            f"attempt 1 checkpointed step {newest.step} {killed - began:.0f} s after the submit; "
            f"NODE_LOST {node_lost:.0f} s after the kill, SUCCEEDED {succeeded:.0f} s after"
        )
        yield Resumed(p, job_id, checkpoints, newest, lost, done, attempts, reference)


def test_a_lost_node_s_training_resumes_on_the_other_node_bit_for_bit(
    resumed: Resumed, real_server: Server, real_kube: Client, real_testbed: Testbed
) -> None:
    p, job_id, checkpoints = resumed.project, resumed.job_id, resumed.checkpoints
    newest, lost, done, attempts = resumed.newest, resumed.lost, resumed.done, resumed.attempts
    reference = resumed.reference

    # Kubernetes replaced the Pod on the other node, and kept the retry: retries is 0.
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    one, two = attempts
    assert one["node"] == lost
    assert two["node"] not in (None, lost)
    assert one["raw_reason"] in ("DeletionByPodGC", "NotFound"), attempts
    k8s: Any = real_kube.get(Job, f"kt-{job_id}", namespace=p)
    assert not k8s.status.failed, k8s.status

    # kubetrain: NODE_LOST while attempt 1 was lost, then attempt 2 trained on.
    path = business_path(real_server, p, job_id)
    assert_valid_path(path)
    at = path.index(("QUEUED", "NODE_LOST"))
    assert ("RUNNING", "TRAINING") in path[:at]
    assert ("RUNNING", "TRAINING") in path[at:]
    assert path[-1] == ("SUCCEEDED", "COMPLETED")
    assert_never_queued_once_running(path[at:])
    history = get(real_server, p, job_id, "/history")["items"]
    node_lost_row = next(r for r in history if r["to_reason"] == "NODE_LOST")
    assert node_lost_row["attempt"] == 1, node_lost_row
    resumes = done["progress"]["resumes"]
    assert [(r["attempt"], r["from_step"], r["from_attempt"]) for r in resumes] == [
        (2, newest.step, 1)
    ], resumes
    assert resumes[0]["pod"] == two["pod"]
    assert resumes[0]["from_pod"] == one["pod"]
    # What was allowed to differ: the node did; the binding the runtime checked did not.
    verdicts = {c["field"]: c["verdict"] for c in resumes[0]["compared"]}
    assert verdicts["node"] == "differs, allowed", resumes[0]["compared"]
    assert verdicts["code version"] == verdicts["params digest"] == "same", verdicts
    assert verdicts["world size"] == "same"
    assert "differs, not allowed" not in verdicts.values()
    shown = real_server.cli("get", "job", job_id, "--project", p)
    assert shown.returncode == 0, shown.stderr
    assert f"attempt 2 from step {newest.step} of attempt 1" in shown.stdout, shown.stdout
    assert "SUCCEEDED" in shown.stdout

    # The new Pod's preflight passed, and it resumed from the last valid checkpoint.
    logs = kubectl(real_testbed, "logs", "-n", p, two["pod"]).splitlines()
    for check in ("checkpoint-readable", "status-reachable"):
        assert any(f"kubetrain preflight: {check} passed" in line for line in logs), logs
    assert f"resumed from step {newest.step} (written by {one['pod']})" in logs
    # From there on, the same losses, step by step, and the same final weights.
    trained = [line for line in logs if line.startswith(("step ", "final weights"))]
    expected = [line for line in reference if line.startswith(("step ", "final weights"))]
    assert trained == expected[newest.step :]
    assert trained[-1].startswith("final weights sha256 ")

    # The same binding: the final checkpoint is bound as attempt 1's was, and says
    # where it resumed from.
    final = checkpoint_files.scan(checkpoints, checksums=True)[0]
    assert (final.step, final.problem) == (STEPS, None)
    assert final.binding == newest.binding
    assert final.manifest["pod"] == two["pod"]
    assert final.manifest["resumedFrom"] == {
        "fromStep": newest.step,
        "fromPod": one["pod"],
        "allowedMismatch": [],
    }


@pytest.mark.browser
def test_the_job_page_draws_the_resumed_run_with_its_checkpoints_resume_and_lineage(
    resumed: Resumed, real_server: Server, page: Page, artifacts: Path
) -> None:
    """The same run's job page in real headless Chromium, read from the rendered DOM: a
    chart with axes and round ticks, the checkpoints folded, the resume marked."""
    p, job_id, newest = resumed.project, resumed.job_id, resumed.newest
    one, two = resumed.attempts
    series = get(real_server, p, job_id, "/progress?limit=2000")
    claimed = sorted({s["step"] for s in series["steps"]})  # the steps the job reported
    sign_in(page, real_server.url, real_server.create_token(p, "viewer", "web-viewer"))
    page.goto(f"{real_server.url}/ui/projects/{p}/jobs/{job_id}")
    expect(page.locator("h1")).to_have_text("resume")
    shown: dict[str, Any] = page.evaluate(READ_PROGRESS_CARD)
    screenshot = artifacts / "resume-job-page.png"
    page.screenshot(path=str(screenshot), full_page=True)
    page.locator("#chart").screenshot(path=str(artifacts / "resume-job-chart.png"))
    print(f"screenshot: {screenshot}")

    # The loss curve: one point per step reported, by step; attempt 1's steps up to its
    # checkpoint and every step attempt 2 trained from the step it resumed from.
    chart = shown["chart"]
    assert chart["title"] == "loss by step"
    points = [tuple(float(v) for v in xy.split(",")) for xy in chart["points"].split()]
    assert len(points) == len(claimed), (len(points), claimed)
    assert set(range(1, 2 * EVERY + 1)) | set(range(newest.step + 1, STEPS + 1)) <= set(claimed)
    xs = [x for x, _ in points]
    assert xs == sorted(set(xs)), xs  # never back: a step trained again is drawn once
    x_at = dict(zip(claimed, xs, strict=True))
    per_step = (xs[-1] - xs[0]) / (claimed[-1] - claimed[0])  # the step axis is linear

    def x_of(step: int) -> float:
        # A step may have no point of its own: attempt 1 can save a checkpoint and lose
        # its node before that step's report arrives (attempt 2 resumes from it).
        return float(x_at.get(step, xs[0] + (step - claimed[0]) * per_step))

    # Axes people read: titles, round tick labels on both, laid out without overlap; the
    # loss on a log scale where it spans more than two decades (this run's does).
    losses = [s["metrics"]["loss"] for s in series["steps"]]
    log = max(losses) > 100 * min(losses)
    assert chart["scale"] == ("log" if log else "linear"), (min(losses), max(losses))
    assert chart["axis_titles"] == ["loss (log scale)" if log else "loss", "step"], chart
    assert chart["x_labels"] == ["0", "50", "100", "150", "200"], chart["x_labels"]
    y_values = [float(label.replace(",", "")) for label in chart["y_labels"]]
    assert len(y_values) >= 3, chart["y_labels"]
    if log:  # powers of ten
        assert all(abs(math.log10(v) - round(math.log10(v))) < 1e-9 for v in y_values), y_values
    else:  # evenly spaced
        gaps = {round(b - a, 9) for a, b in itertools.pairwise(y_values)}
        assert len(gaps) == 1, y_values
    assert y_values[0] <= min(losses), (y_values, losses)
    assert y_values[-1] >= max(losses), (y_values, losses)
    for boxes in (chart["x_label_boxes"], chart["y_label_boxes"]):
        assert all(box["width"] > 0 for box in boxes), boxes  # drawn, not clipped away
    lefts = sorted(chart["x_label_boxes"], key=lambda box: box["left"])
    assert all(a["right"] < b["left"] for a, b in itertools.pairwise(lefts)), lefts
    assert f"steps {claimed[0]} to {STEPS}" in chart["desc"], chart["desc"]
    assert chart["labelledby"] == "chart-main-title chart-main-desc"
    # The learning rate the run reports, on a small chart of its own.
    assert shown["rate_titles"][0].startswith("learning rate"), shown["rate_titles"]

    # Checkpoints are short ticks on the step axis, each where its step falls; the last
    # one and the step resumed from are marked apart.
    saved = sorted({int(row[0].split()[0]) for row in shown["rows"]})
    ticks = chart["checkpoints"]
    assert [t["step"] for t in ticks] == saved, (ticks, saved)
    assert all(abs(t["x"] - x_of(t["step"])) < 0.06 for t in ticks), ticks
    assert all(t["height"] <= 8 for t in ticks), ticks  # not full-height lines
    assert [r["step"] for r in chart["resumes"]] == [newest.step], chart["resumes"]
    assert abs(chart["resumes"][0]["x"] - x_of(newest.step)) < 0.06, chart["resumes"]
    assert chart["resume_label"] == f"resumed from step {newest.step}"
    assert chart["last_checkpoint"] == STEPS
    every = set(range(EVERY, STEPS + 1, EVERY))
    attempt_2 = set(range(newest.step + EVERY, STEPS + 1, EVERY))
    assert set(range(EVERY, 2 * EVERY + 1, EVERY)) | attempt_2 <= set(saved) <= every, saved

    # Folded: at most ten rows open, the newest first and the one attempt 2 resumed from
    # among them; the rest behind "Show all N", which opens them all.
    rows, opened = shown["rows"], shown["open"]
    assert len(opened) <= 10, opened
    assert len(rows) > len(opened), (len(rows), len(opened))
    assert shown["summary"].startswith(f"Show all {len(rows)} checkpoints"), shown["summary"]
    final = opened[0]
    assert (final[0], final[3]) == (str(STEPS), f"attempt 2 · {two['pod']}"), final
    start = [row for row in opened if row[0].startswith(f"{newest.step} ")]
    assert len(start) == 1, opened
    assert start[0][0] == f"{newest.step} a resume started here", start
    assert start[0][3] == f"attempt 1 · {one['pod']}", start
    page.locator("#more-checkpoints summary").click()
    assert page.evaluate(VISIBLE_ROWS) == len(rows)
    # The live refresh (every 5 s) re-renders the card and keeps the reader's disclosure open.
    page.wait_for_function("() => document.querySelector('[data-live]').dataset.refreshed")
    expect(page.locator("#more-checkpoints")).to_have_attribute("open", "")
    assert page.evaluate(VISIBLE_ROWS) == len(rows)
    # A tiny model's checkpoints are a few KiB: sized as such, never "0.0 MiB".
    assert all(row[1].endswith(" KiB") for row in rows), rows

    # The lineage: attempt 2 resumed from attempt 1's step, on another node, allowed.
    resumes = [dd for dt, dd in shown["facts"] if dt == "Resumed"]
    assert len(resumes) == 1, shown["facts"]
    assert resumes[0].startswith(f"attempt 2 from step {newest.step} of attempt 1"), resumes
    # Each line the API's lineage says, the node's first: it differed, which is allowed.
    compared = resumed.done["progress"]["resumes"][0]["compared"]
    assert [text for _, text in shown["lineage"]] == [c["says"] for c in compared]
    assert shown["lineage"][0] == [
        "verdict-differs-allowed",
        f"node: {resumed.lost} -> {two['node']} (allowed)",
    ], shown["lineage"]
    facts = dict(shown["facts"])
    assert facts["Last checkpoint"] == (
        f"step {STEPS}, {final[1]} in {final[2]}; {len(rows)} checkpoints saved"
    ), facts
    # The job is over: its runtime's last phase is what it reported, not what it is.
    assert facts["Last phase reported"] == f"TRAINING by {two['pod']}", facts
    assert "Phase" not in facts

    # `kubetrain get job` says the same facts in the same words (one renderer).
    cli = real_server.cli("get", "job", job_id, "--project", p)
    assert cli.returncode == 0, cli.stderr
    said = {
        label.strip(): value.strip()
        for label, _, value in (line.partition(":") for line in cli.stdout.splitlines())
    }
    assert said["Last checkpoint"] == facts["Last checkpoint"], cli.stdout
    assert said["Last phase reported"] == facts["Last phase reported"], cli.stdout
    assert "Phase" not in said, cli.stdout


VISIBLE_ROWS = """() => [...document.querySelectorAll('table.checkpoints tbody tr')]
  .filter((tr) => tr.checkVisibility()).length"""
# The progress card as the browser rendered it; rows inside a closed <details> are not
# visible (checkVisibility), so `open` is what a reader sees before asking for more.
READ_PROGRESS_CARD = """() => {
  const card = document.querySelector('#progress');
  const text = (e) => e.textContent.replace(/\\s+/g, ' ').trim();
  const cells = (tr) => [...tr.querySelectorAll('td')].map(text);
  const box = (e) => { const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, width: r.width}; };
  const svg = card.querySelector('#chart-main');
  const rate = card.querySelector('#chart-rate');
  const rows = [...card.querySelectorAll('table.checkpoints tbody tr')];
  const last = svg.querySelector('.mark-last-checkpoint');
  return {
    facts: [...card.querySelectorAll('dl.facts dt')].map(
      (dt) => [text(dt), text(dt.nextElementSibling)]),
    lineage: [...card.querySelectorAll('ul.lineage li')].map(
      (li) => [li.getAttribute('class'), text(li)]),
    chart: {
      title: text(svg.querySelector('title')),
      desc: text(svg.querySelector('desc')),
      labelledby: svg.getAttribute('aria-labelledby'),
      scale: svg.dataset.scale,
      points: svg.querySelector('polyline').getAttribute('points'),
      axis_titles: [...svg.querySelectorAll('text.axis-title')].map(text),
      x_labels: [...svg.querySelectorAll('.axis-x text.tick-label')].map(text),
      y_labels: [...svg.querySelectorAll('.axis-y text.tick-label')].map(text),
      x_label_boxes: [...svg.querySelectorAll('.axis-x text.tick-label')].map(box),
      y_label_boxes: [...svg.querySelectorAll('.axis-y text.tick-label')].map(box),
      checkpoints: [...svg.querySelectorAll('line.mark-checkpoint')].map((l) => ({
        step: +l.dataset.step, x: +l.getAttribute('x1'),
        height: +l.getAttribute('y2') - +l.getAttribute('y1')})),
      resumes: [...svg.querySelectorAll('line.mark-resume')].map(
        (l) => ({step: +l.dataset.step, x: +l.getAttribute('x1')})),
      resume_label: text(svg.querySelector('.mark-resume-label')),
      last_checkpoint: last ? +last.dataset.step : null,
    },
    rate_titles: rate ? [...rate.querySelectorAll('text.axis-title')].map(text) : [],
    rows: rows.map(cells),
    open: rows.filter((tr) => tr.checkVisibility()).map(cells),
    summary: text(card.querySelector('#more-checkpoints summary')),
  };
}"""


def test_a_dataset_of_another_version_fails_the_preflight_and_the_job_at_once(
    real_server: Server, real_kube: Client, real_testbed: Testbed, namespace: str, tmp_path: Path
) -> None:
    p = namespace
    dataset = tmp_path / "dataset"
    (dataset / "train").mkdir(parents=True)
    (dataset / "train" / "part-0").write_bytes(b"0123456789" * 100)
    stamped = subprocess.run(
        [*CLI, "dataset", "stamp", str(dataset), "--name", "tiny", "--version", "v1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert stamped.returncode == 0, stamped.stderr
    claim(real_kube, p, "dataset", dataset, "ReadOnlyMany")
    # A credential the training would use: it must show up nowhere.
    secret = f"hf_{uuid.uuid4().hex}"
    kubectl(
        real_testbed,
        "create",
        "secret",
        "generic",
        "hub",
        "-n",
        p,
        f"--from-literal=token={secret}",
    )
    body = job(
        "stale",
        p,
        args=["python", "-c", "print('training on the wrong data')"],
        dataset={"name": "tiny", "version": "v2", "claim": "dataset"},
        env=[{"name": "HF_TOKEN", "secretRef": {"name": "hub", "key": "token"}}],
        retries=3,
    )
    job_id = submit(real_server, body)
    done = wait_for(real_server, p, job_id, "FAILED", "PREFLIGHT_FAILED")
    message = done["raw_message"]
    assert message.startswith("preflight failed: dataset-version: "), message
    assert "the volume holds dataset tiny@v1, the job asks for tiny@v2" in message, message

    path = business_path(real_server, p, job_id)
    assert_valid_path(path)
    assert_never_queued_once_running(path)

    # The podFailurePolicy failed the Job at once: one Pod, no retry used.
    attempts = get(real_server, p, job_id, "/attempts")["items"]
    assert len(attempts) == 1, attempts
    assert attempts[0]["exit_code"] == 86
    assert attempts[0]["termination_message"] == message

    def job_failed() -> Any:
        k8s: Any = real_kube.get(Job, f"kt-{job_id}", namespace=p)
        return next((c for c in k8s.status.conditions or [] if c.type == "Failed"), None)

    failed = eventually(job_failed, 30, what="the Job's Failed condition")
    assert failed.reason == "PodFailurePolicy", failed

    # No credential anywhere: the Pod's output, what kubetrain says, the CLI. The
    # Pod's own is the ServiceAccount token the kubelet projected (a JWT), in no
    # environment variable and in no Secret.
    outputs = [
        kubectl(real_testbed, "logs", "-n", p, attempts[0]["pod"]),
        message,
        str(get(real_server, p, job_id)),
        str(get(real_server, p, job_id, "/history")),
        real_server.cli("get", "job", job_id, "--project", p).stdout,
    ]
    for output in outputs:
        assert secret not in output
        assert not JWT.search(output), output
    assert "training on the wrong data" not in outputs[0]
