"""The API's submissions, written by one thread a batch at a time (group commit).

Each submission used to take its own worker thread (Starlette's `run_in_threadpool`:
anyio's limiter, cancel scope and hand-over, ~10-14 % of a submission's server CPU)
and its own transaction (a pool checkout, SQLite's writer lock, BEGIN and COMMIT:
another ~10 %), and on SQLite eight API threads then queued on the writer lock
anyway (docs/benchmarks.md, "Group commit"). Here a request queues its validated
submission and awaits a future; one writer thread takes everything queued, writes
it in one transaction (`store.submit_many_and_commit`: the outcomes are those of the
same submissions one after another, one failing submission fails only itself), and
settles the batch's futures with one `call_soon_threadsafe` per event loop. A lone
submission is written at once, so nothing waits for a batch to fill.

The transaction is the store's `driver_transaction`, so the thread takes SQLite's
writer lock like every other writer of the process (the control loops' batches wait
at most one batch). The thread starts with the first submission, leaves after
`IDLE_EXIT_S` without any (an app that is never shut down, as in tests, leaves no
thread behind), and `close()` (the app's lifespan, at shutdown) lets it write what
is queued and stop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import defaultdict
from contextlib import suppress

from kubetrain.store import Database, NewSubmission, Submission
from kubetrain.store.jobs import submit_many_and_commit

log = logging.getLogger("kubetrain.api")

# Submissions per transaction at most: the other writers of a SQLite file wait for
# one batch (~0.1 ms a submission), and one batch's outcomes settle together.
MAX_BATCH = 64
IDLE_EXIT_S = 5.0

_Outcome = Submission | Exception
_Queued = tuple[NewSubmission, asyncio.AbstractEventLoop, "asyncio.Future[Submission]"]
_Settled = tuple["asyncio.Future[Submission]", _Outcome]


class SubmissionWriter:
    """The queue of submissions of one API (one `Database`) and its writer thread."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._queue: queue.SimpleQueue[_Queued | None] = queue.SimpleQueue()  # None: stop
        self._lock = threading.Lock()  # over `_thread`'s start and end
        self._thread: threading.Thread | None = None

    async def submit(self, submission: NewSubmission) -> Submission:
        """Write the submission with whatever else is queued; its outcome, or its error
        (`IdempotencyConflict`, SQLAlchemy's) raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Submission] = loop.create_future()
        self._queue.put((submission, loop, future))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kubetrain-submissions", daemon=True
                )
                self._thread.start()
        return await future

    def close(self) -> None:
        """Write what is queued, then stop the thread (a later submission starts it again)."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            self._queue.put(None)
        thread.join()

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                first = None
            stop = first is None  # idle, or told to stop
            batch = [] if first is None else [first]
            while batch and len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True  # the batch is written first
                else:
                    batch.append(more)
            if batch:
                self._write(batch)
            if stop:
                with self._lock:
                    # Leave unless a submission came meanwhile (it was queued before its
                    # sender looked at `_thread`, under this lock).
                    if self._queue.empty():
                        self._thread = None
                        return

    def _write(self, batch: list[_Queued]) -> None:
        try:
            outcomes: list[_Outcome] = submit_many_and_commit(
                self._db, [submission for submission, _, _ in batch]
            )
        except Exception as exc:  # not the store's outcome: a bug; fail the batch, not hang
            log.exception("writing a batch of %d submissions failed", len(batch))
            outcomes = [exc] * len(batch)
        settle: defaultdict[asyncio.AbstractEventLoop, list[_Settled]] = defaultdict(list)
        for (_, loop, future), outcome in zip(batch, outcomes, strict=True):
            settle[loop].append((future, outcome))
        for loop, pairs in settle.items():
            with suppress(RuntimeError):  # a closed loop: nobody waits for these
                loop.call_soon_threadsafe(_settle, pairs)


def _settle(pairs: list[_Settled]) -> None:
    """On the requests' event loop: each future's outcome (but a cancelled request's)."""
    for future, outcome in pairs:
        if future.done():
            continue
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
