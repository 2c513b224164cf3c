"""The progress reporter against a real HTTP peer (http.server in a thread)."""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kubetrain.runtime.contract import CHECK_NAMES
from kubetrain.runtime.progress import (
    MAX_BATCH,
    MAX_RETRY_AFTER_SECONDS,
    Reporter,
    reporter_from_env,
    retry_after,
)
from tests.runtime.conftest import base_env, kubetrain

pytestmark = pytest.mark.runtime

TOKEN = "tok-reporter-7c1d"


class Peer:
    """The control plane's reports endpoint, as far as the reporter can tell."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.status = 202
        self.retry_after: str | None = None  # the Retry-After header of a refusal
        self.arrivals: list[float] = []  # when each POST came (time.monotonic)
        self.delay = 0.0
        # Closed, a request waits at the gate until it opens: the server that never answers.
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = 0  # requests at the closed gate now
        self.refused = 0  # requests answered with another status than 202
        self.changed = threading.Condition()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with peer.changed:
                    peer.arrivals.append(time.monotonic())
                    peer.waiting += 1
                    peer.changed.notify_all()
                peer.gate.wait()
                time.sleep(peer.delay)
                status = peer.status
                with peer.changed:
                    peer.waiting -= 1
                    if status == 202:
                        peer.posts.append((self.path, dict(self.headers), body))
                    else:
                        peer.refused += 1
                    peer.changed.notify_all()
                self.send_response(status)
                if status != 202 and peer.retry_after is not None:
                    self.send_header("Retry-After", peer.retry_after)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def events(self) -> list[dict[str, Any]]:
        return [event for _, _, body in self.posts for event in body["events"]]

    def until(self, condition: Callable[[], bool], what: str) -> None:
        """Waits for the handler to make `condition` true (30 s at most: a hang guard)."""
        with self.changed:
            assert self.changed.wait_for(condition, timeout=30), f"the peer never saw {what}"


@pytest.fixture
def peer() -> Iterator[Peer]:
    peer = Peer()
    thread = threading.Thread(target=peer.server.serve_forever, daemon=True)
    thread.start()
    yield peer
    peer.gate.set()
    peer.server.shutdown()
    peer.server.server_close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """The Pod's projected token, as the kubelet writes it."""
    path = tmp_path / "token"
    path.write_text(TOKEN)
    return path


def _reporter(peer: Peer, token_file: Path | None = None, **kwargs: Any) -> Reporter:
    token = str(token_file) if token_file is not None else None
    return Reporter(peer.url, "job-9", token, "job-9-0-abcde", backoff=(0.05,), **kwargs)


def test_events_follow_the_contract(peer, token_file):
    reporter = _reporter(peer, token_file)
    reporter.phase("TRAINING")
    for step in range(1, 251):
        reporter.step(step, loss=1 / step, bad=float("nan"), up=float("-inf"), lr="x")
    reporter.checkpoint(250, 1234, 0.5)
    reporter.resumed(200, "job-9-0-old")
    assert reporter.close(10)
    path, headers, body = peer.posts[0]
    assert path == "/api/v1/jobs/job-9/reports"
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["Content-Type"] == "application/json"
    assert body["pod"] == "job-9-0-abcde"
    assert body["dropped"] == 0
    assert all(len(body["events"]) <= MAX_BATCH for _, _, body in peer.posts)
    events = peer.events()
    assert [e["seq"] for e in events] == list(range(1, 254))
    assert events[0]["type"] == "phase"
    assert events[0]["phase"] == "TRAINING"
    assert events[0]["time"].endswith("Z")
    # A NaN or an infinity is kept, spelled as JSON cannot carry it; a non-number is not.
    assert events[1] == {
        **events[1],
        "type": "step",
        "step": 1,
        "metrics": {"loss": 1.0, "bad": "NaN", "up": "-Infinity"},
    }
    assert events[-2] == {**events[-2], "type": "checkpoint", "step": 250, "sizeBytes": 1234}
    assert events[-1] == {
        **events[-1],
        "type": "resumed",
        "fromStep": 200,
        "fromPod": "job-9-0-old",
    }


def test_a_down_server_never_blocks_training_and_drops_are_counted(peer):
    # How fast a step returns is bench/progress.py's; here, that none waits for the network.
    peer.status = 503
    peer.gate.clear()  # the server takes the first batch and answers nothing
    # A request timeout longer than the test: the first batch stays out until let go.
    reporter = _reporter(peer, max_queue=50, timeout=60)
    reporter.phase("TRAINING")
    peer.until(lambda: peer.waiting == 1, "the first batch")

    def steps() -> None:
        for step in range(1, 1001):
            reporter.step(step, loss=0.5)

    stepping = threading.Thread(target=steps)
    stepping.start()
    stepping.join(30)  # a hang guard: the only request is still out
    assert not stepping.is_alive(), "a step waited for the server"
    assert (peer.waiting, peer.refused, peer.posts) == (1, 0, [])
    assert reporter.dropped == 1000 - 50  # the newest 50 steps queued, the phase out
    peer.gate.set()  # the server answers 503 until it is back
    peer.until(lambda: peer.refused >= 2, "a retried batch")
    peer.status = 202  # back: the backlog goes, with the count of drops
    assert reporter.close(10)
    events = peer.events()
    assert events[0]["type"] == "phase"  # the oldest *step* events went first
    assert events[-1]["step"] == 1000
    assert sum(body["dropped"] for _, _, body in peer.posts) == 1001 - len(events)


def test_a_server_that_asks_to_wait_is_not_asked_again_sooner(peer):
    # The backoff alone would retry within 0.05 s; the server's Retry-After says 1 s.
    peer.status = 503
    peer.retry_after = "1"
    reporter = _reporter(peer)
    reporter.phase("TRAINING")
    peer.until(lambda: peer.refused >= 2, "the retried batch")
    peer.status = 202
    assert reporter.close(10)
    assert peer.arrivals[1] - peer.arrivals[0] >= 1.0
    assert [e["phase"] for e in peer.events()] == ["TRAINING"]


def test_the_reporters_retries_leave_the_trainings_random_sequence_alone(peer):
    """A checkpoint saves and restores `random`'s state for a resume bit for bit
    (runtime/checkpoint.py): the jitter of the reporter's retries, drawn in its thread
    at moments no one foresees, comes from a generator of its own."""
    random.seed(1234)
    expected = random.Random(1234)  # noqa: S311 - the training's sequence, not a secret
    peer.status = 503
    reporter = _reporter(peer)
    reporter.phase("TRAINING")
    peer.until(lambda: peer.refused >= 3, "retried batches")
    assert random.random() == expected.random()  # noqa: S311
    peer.status = 202
    assert reporter.close(10)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("7", 7.0),
        (" 0 ", 0.0),
        ("86400", MAX_RETRY_AFTER_SECONDS),  # a server asking for a day is capped
        ("Sun, 06 Dec 2026 10:00:30 GMT", 30.0),  # an HTTP-date, 30 s after `now`
        ("Sun, 06 Dec 2026 09:59:00 GMT", 0.0),  # already past
        ("-5", None),
        ("soon", None),
        ("1.5", None),  # delay-seconds is a whole number
    ],
)
def test_retry_after_reads_both_forms_of_rfc_9110(header, seconds):
    now = 1796551200.0  # 2026-12-06T10:00:00Z
    assert retry_after(header, now) == seconds


def test_a_slow_server_times_out_and_the_flush_is_bounded(peer):
    # How long close() takes against its bound is bench/progress.py's; here, that it
    # gives up on a server that never answers, and says so.
    peer.gate.clear()
    reporter = _reporter(peer, timeout=0.2)
    reporter.step(1, loss=1.0)
    closing = threading.Thread(target=lambda: outcome.append(reporter.close(0.5)))
    outcome: list[bool] = []
    closing.start()
    closing.join(30)  # a hang guard: the server still holds the request
    assert not closing.is_alive(), "close() waited past its bound"
    assert outcome == [False]
    assert peer.posts == []
    assert reporter.close(0.5) is False  # a later call returns at once, still unsent
    reporter.step(2, loss=0.5)  # after close: dropped, never queued
    assert reporter.last_seq == 1


def test_kubetrain_run_reports_preflight_and_training_and_the_command_goes_on_counting(
    peer, token_file
):
    env = base_env(
        KUBETRAIN_JOB_ID="job-9",
        KUBETRAIN_STATUS_URL=peer.url,
        KUBETRAIN_STATUS_TOKEN_FILE=str(token_file),
        KUBETRAIN_POD_NAME="job-9-0-abcde",
    )
    script = "from kubetrain.runtime import progress; progress.step(1, loss=0.25)"
    done = kubetrain("run", "--", sys.executable, "-c", script, env=env)
    assert done.returncode == 0, done.stderr
    events = peer.events()
    # PREFLIGHT, then each check as it starts (a gang's rank waiting in one is named).
    checks = [(n, "phase", "PREFLIGHT", name) for n, name in enumerate(CHECK_NAMES, 2)]
    after = len(CHECK_NAMES) + 2
    assert [(e["seq"], e["type"], e.get("phase"), e.get("check")) for e in events] == [
        (1, "phase", "PREFLIGHT", None),
        *checks,
        (after, "phase", "TRAINING", None),
        (after + 1, "step", None, None),
    ]
    assert TOKEN not in done.stdout + done.stderr


def test_checkpoints_and_resumes_are_reported_by_the_manager(peer, tmp_path, monkeypatch):
    from kubetrain.runtime.checkpoint import CheckpointManager
    from tests.runtime import tiny_training

    monkeypatch.setenv("KUBETRAIN_POD_NAME", "job-9-0-first")
    model, optimizer, _ = tiny_training.build()
    bound = {"dataset_version": "v3", "code_version": "c1"}
    writer = _reporter(peer)
    first = CheckpointManager(tmp_path, binding=bound, reporter=writer)
    first.save(7, model=model, optimizer=optimizer)
    assert writer.close(10)  # its checkpoint reaches the peer before the resume
    monkeypatch.setenv("KUBETRAIN_POD_NAME", "job-9-0-second")
    reporter = _reporter(peer)
    second = CheckpointManager(tmp_path, binding=bound | {"code_version": "c2"}, reporter=reporter)
    assert second.resume(model=model, allow_mismatch=["code_version"]) == 7
    assert reporter.close(10)
    saved, resumed = peer.events()
    assert saved["type"] == "checkpoint"
    assert saved["step"] == 7
    assert saved["sizeBytes"] > 0
    # what the checkpoint is bound to, for the job page's checkpoint table
    assert saved["binding"] == bound | {"params_sha256": None}
    assert resumed["type"] == "resumed"
    assert (resumed["fromStep"], resumed["fromPod"]) == (7, "job-9-0-first")
    # the checkpoint's binding and the run's, for the lineage's "what differed"
    unset = {"params_sha256": None}
    assert resumed["checkpointBinding"] == {"dataset_version": "v3", "code_version": "c1"} | unset
    assert resumed["binding"] == {"dataset_version": "v3", "code_version": "c2"} | unset
    assert resumed["allowedMismatch"] == ["code_version"]


GANG = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-9-0.job-9"}


@pytest.mark.parametrize(
    ("extra", "rank"), [({}, None), (GANG, 1), ({**GANG, "KUBETRAIN_WORKER_INDEX": "1"}, 1)]
)
def test_a_gang_worker_reports_its_rank_and_a_single_worker_the_body_of_before(peer, extra, rank):
    environ = {"KUBETRAIN_JOB_ID": "job-9", "KUBETRAIN_STATUS_URL": peer.url, **extra}
    reporter = reporter_from_env({**environ, "KUBETRAIN_POD_NAME": "job-9-1-abcde"})
    assert reporter is not None
    reporter.step(3, loss=0.5)
    assert reporter.close(10)
    (_, _, body), *_ = peer.posts
    if rank is None:  # what servers before gangs accept: nothing more
        assert set(body) == {"pod", "dropped", "events"}
    else:
        assert body["rank"] == rank
    assert body["pod"] == "job-9-1-abcde"


def test_only_the_first_process_of_a_pod_reports(peer):
    """torchrun's other local processes would send the same pod and seq numbers."""
    environ = {"KUBETRAIN_JOB_ID": "job-9", "KUBETRAIN_STATUS_URL": peer.url, **GANG}
    assert reporter_from_env({**environ, "LOCAL_RANK": "1"}) is None
    assert reporter_from_env({**environ, "LOCAL_RANK": "0"}) is not None


def test_the_token_is_read_afresh_for_each_report_as_the_kubelet_renews_it(peer, token_file):
    reporter = _reporter(peer, token_file)
    reporter.phase("TRAINING")
    assert reporter.flush(10)
    # The kubelet swaps in a renewed token (it replaces the file whole).
    renewed = token_file.with_name("..renewed")
    renewed.write_text("tok-renewed-91ab\n")
    renewed.replace(token_file)
    reporter.checkpoint(10, 1, 0.1)
    assert reporter.close(10)
    assert [headers["Authorization"] for _, headers, _ in peer.posts] == [
        f"Bearer {TOKEN}",
        "Bearer tok-renewed-91ab",
    ]


def test_a_missing_token_file_is_retried_not_dropped(peer, tmp_path):
    path = tmp_path / "token"
    reporter = _reporter(peer, path)
    reporter.phase("TRAINING")
    assert not reporter.flush(0.3)  # nothing to send with yet
    path.write_text(TOKEN)
    assert reporter.close(10)
    assert [e["type"] for e in peer.events()] == ["phase"]
