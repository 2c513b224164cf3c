"""Webhook latency beside slow receivers: commit -> arrival of another project's events.

In one process, on a fresh database: --slow webhooks of project `slow` point at
receivers on loopback that trickle their answers (a byte every half second,
never done before the 10 s deadline), and one webhook of project `fast` at a
receiver that answers 204 at once. Jobs are submitted to both projects, one
every --every seconds; the notifier runs its own loop (interval 1 s, the
default) in a thread. Measured per `fast` job: its CREATED row's commit (taken
right after the submitting transaction returns) to the receiver's arrival, on
this host's monotonic clock. Prints p50/p99/max and writes
bench/results/webhooks-DATABASE.json. Loopback is opened to webhooks here, as
the setting `webhook_allowed_networks` would.

    .venv/bin/python bench/webhooks.py [--jobs 100] [--slow 20] [--every 0.1]
        [--database sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.pg

from _common import RESULTS, percentile, table

from kubetrain.control.notifier import Notifier
from kubetrain.delivery import webhook_poster
from kubetrain.domain.networks import networks
from kubetrain.store import Database, submit_job
from kubetrain.store.webhooks import create_webhook

SPEC: dict[str, Any] = {
    "apiVersion": "kubetrain.io/v1",
    "kind": "TrainingJob",
    "metadata": {"name": "bench"},
    "spec": {"image": "registry.example/trainer:1", "command": ["python", "train.py"]},
}


def receiver(
    trickle: bool, stop: threading.Event, arrived: dict[str, float]
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if not trickle:
                job = json.loads(body)["data"]["job"]["id"]
                arrived.setdefault(job, time.monotonic())
                self.send_response(204)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-length", "100")
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(100):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    if stop.wait(0.5):
                        return

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--slow", type=int, default=20)
    parser.add_argument("--every", type=float, default=0.1)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    args = parser.parse_args()

    stop = threading.Event()
    arrived: dict[str, float] = {}
    committed: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        if args.database == "sqlite":
            url = f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/bench.db"
        else:
            from tests.pg import PostgresServer

            postgres = PostgresServer.start()
            stack.callback(postgres.stop)
            url = postgres.create_database()
        db = Database(url)
        db.upgrade()
        stack.callback(db.dispose)
        fast = receiver(False, stop, arrived)
        slow = [receiver(True, stop, arrived) for _ in range(args.slow)]
        stack.callback(stop.set)
        with db.transaction() as session:
            for project, server in [*(("slow", s) for s in slow), ("fast", fast)]:
                url = f"http://127.0.0.1:{server.server_address[1]}/"
                create_webhook(session, project=project, url=url, events=[], created_by="bench")

        def notify() -> None:
            async def run() -> None:
                async with webhook_poster(allowed_networks=networks(["127.0.0.0/8"])) as post:
                    loop = asyncio.create_task(Notifier(db, post).run())
                    await asyncio.to_thread(stop.wait)
                    loop.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await loop

            asyncio.run(run())

        thread = threading.Thread(target=notify, daemon=True)
        thread.start()
        digest = "0" * 64  # no idempotency key: the digest is compared with nothing
        for index in range(args.jobs):
            for project in ("slow", "fast"):
                with db.transaction() as session:
                    job = submit_job(
                        session,
                        project=project,
                        name=f"bench-{index}",
                        owner="bench",
                        namespace=project,
                        spec=SPEC,
                        digest=digest,
                    ).job
                if project == "fast":
                    committed[job.id] = time.monotonic()
            time.sleep(args.every)
        deadline = time.monotonic() + 30
        while len(arrived) < len(committed) and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        thread.join(30)

    latencies = [arrived[job] - at for job, at in committed.items() if job in arrived]
    result = {
        "database": args.database,
        "jobs": args.jobs,
        "slow_receivers": args.slow,
        "delivered": len(latencies),
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "max_s": max(latencies, default=float("nan")),
    }
    print(
        table(
            ["fast project's events", "delivered", "p50 s", "p99 s", "max s"],
            [
                [
                    f"beside {args.slow} trickling receivers",
                    f"{len(latencies)}/{len(committed)}",
                    result["p50_s"],
                    result["p99_s"],
                    result["max_s"],
                ]
            ],
            [40, 10, 8, 8, 8],
        )
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"webhooks-{args.database}.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if len(latencies) == len(committed) else 1


if __name__ == "__main__":
    sys.exit(main())
