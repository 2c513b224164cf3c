"""Progress reported to the control plane: phase, steps and metrics, checkpoints, resumes.

    from kubetrain.runtime import progress
    progress.step(step, loss=loss.item(), lr=scheduler.get_last_lr()[0])

Events go to POST {KUBETRAIN_STATUS_URL}/api/v1/jobs/{KUBETRAIN_JOB_ID}/reports
with `Authorization: Bearer <token>`, at most MAX_BATCH per request, from a
daemon thread. The token is the Pod's projected ServiceAccount token, read from
KUBETRAIN_STATUS_TOKEN_FILE for every request: the kubelet replaces it before
it expires (at 80 % of its 10 minutes), so a token read once would stop working.
Training never waits for the network and never sees its errors: the queue is
bounded (the oldest step events go first when it is full, and the next batch
says how many were dropped), each request has a timeout, a failed batch is
retried with backoff (jittered, so that the ranks of a gang do not come back
in step after a server restart; never sooner than the server's `Retry-After`),
and the flush at exit is bounded. The token is sent, never written anywhere else.
"""

from __future__ import annotations

import atexit
import collections
import email.utils
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubetrain.runtime import env
from kubetrain.runtime.contract import encode_metric, reports_path
from kubetrain.runtime.env import pod_name
from kubetrain.runtime.redact import Redactor

MAX_BATCH = 100  # the server refuses larger batches
MAX_QUEUE = 1000
MAX_METRICS = 16
MAX_BINDING_VALUE = 256  # characters of a binding value the server takes
REQUEST_TIMEOUT_SECONDS = 2.0
SEND_INTERVAL_SECONDS = 1.0  # steps are batched; phases, checkpoints and resumes go at once
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# A server's Retry-After is honoured up to this long: one that asks for more is
# mistaken, and progress held back longer would read as a stalled job.
MAX_RETRY_AFTER_SECONDS = 60.0
EXIT_FLUSH_SECONDS = 5.0
# `kubetrain run` execs the training command with the last seq it used here, so
# that the events of one Pod keep increasing across the exec.
SEQ_ENV = "KUBETRAIN_PROGRESS_SEQ"


class Reporter:
    """One job's reporter. All public methods return at once and never raise."""

    def __init__(
        self,
        base_url: str,
        job_id: str,
        token_file: str | None,
        pod: str | None,
        *,
        max_queue: int = MAX_QUEUE,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
        interval: float = SEND_INTERVAL_SECONDS,
        backoff: tuple[float, ...] = BACKOFF_SECONDS,
        redact: Callable[[str], str] | None = None,
        first_seq: int = 1,
        rank: int | None = None,
    ) -> None:
        self._url = base_url.rstrip("/") + reports_path(job_id)
        self._token_file = token_file
        self._pod = pod
        self._rank = rank  # the worker's index in a gang; None (left out) for a single worker
        self._max_queue = max_queue
        self._timeout = timeout
        self._interval = interval
        self._backoff = backoff
        self._redact = redact or Redactor({})
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._inflight = 0  # events taken by the sender, not yet acknowledged
        self._seq = first_seq - 1
        self._dropped = 0
        self._urgent = False
        self._closed = False
        self._warned: set[str] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.sent = 0  # events the server accepted

    # what training calls ---------------------------------------------------

    def phase(self, name: str, check: str | None = None) -> None:
        """`check`: in PREFLIGHT, the check about to run (the job's diagnosis names the
        check a gang's rank is still in)."""
        event = {"type": "phase", "phase": str(name)}
        if check is not None:
            event["check"] = str(check)
        self._put(event, urgent=True)

    def step(self, step: int, **metrics: float) -> None:
        try:
            event = {"type": "step", "step": int(step), "metrics": self._metrics(metrics)}
        except (TypeError, ValueError) as exc:
            self._warn_once("step", f"step not reported: {exc}")
            return
        self._put(event, urgent=False)

    def checkpoint(
        self,
        step: int,
        size_bytes: int,
        seconds: float,
        *,
        binding: Mapping[str, Any] | None = None,
    ) -> None:
        """`binding`: what the checkpoint is bound to (dataset, code, params), for the
        job page's checkpoint table."""
        try:
            event: dict[str, Any] = {
                "type": "checkpoint",
                "step": int(step),
                "sizeBytes": int(size_bytes),
                "durationSeconds": round(float(seconds), 6),
            }
            if binding is not None:
                event["binding"] = _binding(binding)
        except (TypeError, ValueError) as exc:
            self._warn_once("checkpoint", f"checkpoint not reported: {exc}")
            return
        self._put(event, urgent=True)

    def resumed(
        self,
        from_step: int,
        from_pod: str | None,
        *,
        checkpoint_binding: Mapping[str, Any] | None = None,
        binding: Mapping[str, Any] | None = None,
        allowed: Sequence[str] = (),
    ) -> None:
        """`checkpoint_binding` and `binding`: what the checkpoint was bound to and what
        this run is; `allowed`: the fields that differed and the run let differ. The
        server shows them as the lineage's "what differed"."""
        try:
            event: dict[str, Any] = {
                "type": "resumed",
                "fromStep": int(from_step),
                "fromPod": from_pod,
            }
            if checkpoint_binding is not None and binding is not None:
                event["checkpointBinding"] = _binding(checkpoint_binding)
                event["binding"] = _binding(binding)
                event["allowedMismatch"] = [str(name) for name in allowed]
        except (TypeError, ValueError) as exc:
            self._warn_once("resumed", f"resume not reported: {exc}")
            return
        self._put(event, urgent=True)

    @property
    def last_seq(self) -> int:
        with self._cond:
            return self._seq

    def flush(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for everything queued to be sent; True if it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
            while self._queue or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = EXIT_FLUSH_SECONDS) -> bool:
        """Flushes for at most `timeout` seconds, then stops; later calls return at once."""
        with self._cond:
            if self._closed:
                return not (self._queue or self._inflight)
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        return done

    @property
    def dropped(self) -> int:
        """Events dropped and not yet reported as dropped."""
        with self._cond:
            return self._dropped

    # the sender ------------------------------------------------------------

    def _metrics(self, metrics: Mapping[str, Any]) -> dict[str, float | str]:
        clean: dict[str, float | str] = {}
        for key, value in metrics.items():
            if len(clean) == MAX_METRICS:
                self._warn_once("metrics", f"only {MAX_METRICS} metrics per step are reported")
                break
            try:
                number = float(value)
            except (TypeError, ValueError):
                self._warn_once("metric-type", f"metric {key!r} is not a number; not reported")
                continue
            # A NaN or infinite loss is the news (a diverged run): kept, spelled for JSON.
            clean[str(key)] = encode_metric(number)
        return clean

    def _put(self, event: dict[str, Any], *, urgent: bool) -> None:
        try:
            with self._cond:
                if self._closed:
                    return
                self._seq += 1
                event = {"seq": self._seq, "time": _now(), **event}
                self._queue.append(event)
                self._trim()
                self._urgent = self._urgent or urgent
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="kubetrain-progress", daemon=True
                    )
                    self._thread.start()
                self._cond.notify_all()
        except Exception as exc:  # reporting never breaks training
            self._warn_once("put", f"progress event not queued: {exc}")

    def _trim(self) -> None:
        # The batch in flight is not counted: the newest events must not be the ones that go
        # while it is out. A failed batch comes back and is trimmed with the rest.
        while len(self._queue) > self._max_queue:
            oldest_step = next((e for e in self._queue if e["type"] == "step"), None)
            self._queue.remove(oldest_step if oldest_step is not None else self._queue[0])
            self._dropped += 1

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                if not self._queue:
                    if self._closed:
                        return
                    self._cond.wait()
                    continue
                if not self._urgent and len(self._queue) < MAX_BATCH:
                    self._cond.wait(self._interval)
                batch = [self._queue.popleft() for _ in range(min(MAX_BATCH, len(self._queue)))]
                self._inflight = len(batch)
                dropped = self._dropped
                self._urgent = False
            outcome, retry_after = self._send(batch, dropped)
            with self._cond:
                self._inflight = 0
                if outcome == "sent":
                    self._dropped -= dropped
                    self.sent += len(batch)
                    failures = 0
                elif outcome == "refused":
                    self._dropped += len(batch)
                else:  # retry: back in front, newest events keep their order behind it
                    self._queue.extendleft(reversed(batch))
                    self._trim()
                self._cond.notify_all()
                if outcome == "retry":
                    delay = _jittered(self._backoff[min(failures, len(self._backoff) - 1)])
                    if retry_after is not None:
                        delay = max(delay, retry_after)
                    failures += 1
                    if not self._closed:
                        self._cond.wait(delay)

    def _send(self, batch: list[dict[str, Any]], dropped: int) -> tuple[str, float | None]:
        """The outcome: sent, refused (never to be sent again) or retry, with the
        server's Retry-After in seconds where it gave one."""
        document: dict[str, Any] = {"pod": self._pod, "dropped": dropped, "events": batch}
        if self._rank is not None:
            document["rank"] = self._rank
        body = json.dumps(document).encode()
        headers = {"Content-Type": "application/json"}
        if self._token_file:
            try:
                token = _read_token(self._token_file)
            except OSError as exc:  # not there yet, or being replaced: try again later
                self._warn_once("token", f"progress not reported: the token file: {exc.strerror}")
                return "retry", None
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self._url, data=body, headers=headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=self._timeout):  # noqa: S310
                return "sent", None
        except urllib.error.HTTPError as exc:
            self._warn_once(f"http-{exc.code}", f"progress report answered {exc.code}")
            if exc.code in (408, 429) or exc.code >= 500:
                return "retry", retry_after(exc.headers.get("Retry-After") if exc.headers else None)
            # The server will not take these events as they are: retrying cannot help.
            return "refused", None
        except Exception as exc:  # any network trouble: try again later
            self._warn_once("network", f"progress report failed: {exc}")
            return "retry", None

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            print(self._redact(f"kubetrain: {message}"), file=sys.stderr)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (RFC 9110 10.2.3: delay-seconds or an HTTP-date) in seconds
    from `now`, at most MAX_RETRY_AFTER_SECONDS; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # an HTTP-date is GMT; one without a zone is not one
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


# The reporter's own generator: it runs in the training process, whose `random` state a
# checkpoint saves and restores (runtime/checkpoint.py) for a resume bit for bit; drawn
# from that one, a retry at an unforeseeable moment moved the training's sequence.
_JITTER = random.Random()  # noqa: S311 - spreading, not secrecy


def _jittered(delay: float) -> float:
    """Half the delay, plus up to as much again at random ("equal jitter")."""
    return delay / 2 + _JITTER.uniform(0, delay / 2)


def _binding(binding: Mapping[str, Any]) -> dict[str, Any]:
    """The fields the server takes: strings (cut to its limit), the world size a number."""
    out: dict[str, Any] = {}
    for name in ("dataset_version", "code_version", "params_sha256"):
        value = binding.get(name)
        out[name] = None if value is None else str(value)[:MAX_BINDING_VALUE]
    size = binding.get("world_size")
    if isinstance(size, int) and not isinstance(size, bool):
        out["world_size"] = size
    return out


def _read_token(path: str) -> str:
    """The token as the kubelet wrote it last (it swaps the file whole, atomically)."""
    with open(path, encoding="ascii") as file:
        return file.read().strip()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def reporter_from_env(environ: Mapping[str, str]) -> Reporter | None:
    """The job's reporter when the manifest set a status URL and a job id, else None.

    None too in the processes torchrun starts beside the first one of a Pod
    (LOCAL_RANK 1, 2, ...): they would report the same steps under the same pod and
    seq numbers, and the server keeps one event per (pod, seq). A Pod reports once,
    for its worker; in a gang, with that worker's rank."""
    url = environ.get("KUBETRAIN_STATUS_URL")
    job_id = environ.get("KUBETRAIN_JOB_ID")
    if not url or not job_id or environ.get("LOCAL_RANK", "0").strip() not in ("0", ""):
        return None
    try:
        gang = env.gang(environ)
    except ValueError:  # the preflight fails on it; the reporter never raises
        gang = None
    return Reporter(
        url,
        job_id,
        environ.get("KUBETRAIN_STATUS_TOKEN_FILE") or None,
        pod_name(environ),
        redact=Redactor(environ),
        first_seq=_first_seq(environ),
        rank=gang.rank if gang is not None else None,
    )


def _first_seq(environ: Mapping[str, str]) -> int:
    try:
        return max(1, int(environ.get(SEQ_ENV, "0")) + 1)
    except ValueError:
        return 1


_default: Reporter | None = None
_default_made = False
_default_lock = threading.Lock()


def default_reporter() -> Reporter | None:
    """This process's reporter, made from the environment on first use (None when not set)."""
    global _default, _default_made
    with _default_lock:
        if not _default_made:
            _default = reporter_from_env(os.environ)
            _default_made = True
            if _default is not None:
                atexit.register(_default.close)
        return _default


def phase(name: str) -> None:
    if (reporter := default_reporter()) is not None:
        reporter.phase(name)


def step(step: int, **metrics: float) -> None:
    """Reports a training step and up to 16 scalar metrics; returns at once."""
    if (reporter := default_reporter()) is not None:
        reporter.step(step, **metrics)


def flush(timeout: float = EXIT_FLUSH_SECONDS) -> bool:
    reporter = default_reporter()
    return True if reporter is None else reporter.flush(timeout)
