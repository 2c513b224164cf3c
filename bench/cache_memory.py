"""What the watch cache keeps per job: while it is tracked, and once it is finished and let go.

In this process, no testbed: N copies of a recorded finished job (the Job, its
Pod and their Events of tests/fixtures/snapshots/succeeded.json, under new
names and uids, every time n seconds later in copy n, with kubetrain's job-id
label) are handed to `ClusterCache`'s handlers the way its reflectors hand them
(each made as the reflector keeps it, kept in its reflector, then the handler
called), and Python's allocations are counted with tracemalloc: after all N are
in (tracked), and after `forget` let each go as the syncer does once the job is
recorded (finished). Baseline in the same run: the same objects' JSON, the
bytes the API server sent for them. The first `--warmup` copies are left out
(one-time growth: interned strings, dict resizes).

    .venv/bin/python bench/cache_memory.py [--jobs 2000] [--warmup 100]
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import tracemalloc
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from _common import RESULTS

from kubetrain.cluster.cache import ClusterCache
from kubetrain.domain.manifest import LABEL_JOB_ID

SNAPSHOTS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "snapshots"
RESOURCE = {"Job": "jobs", "Pod": "pods", "Event": "events"}


class Copies:
    """The recorded finished job under new names and uids, copy by copy."""

    def __init__(self) -> None:
        self.raw = (SNAPSHOTS / "succeeded.json").read_text()
        data = json.loads(self.raw)
        items = [i for i in data["items"] if i["kind"] in RESOURCE]
        self.uids = sorted({i["metadata"]["uid"] for i in items})
        self.job = next(i for i in items if i["kind"] == "Job")["metadata"]["name"]
        self.wire = sum(len(json.dumps(i, separators=(",", ":"))) for i in items)

    def copy(self, n: int) -> list[dict[str, Any]]:
        text = self.raw
        for k, uid in enumerate(self.uids):
            text = text.replace(uid, str(uuid.UUID(int=(n << 16) + k)))
        text = text.replace(self.job, f"{self.job}-{n:06d}")
        # Each copy n seconds later: jobs do not share their times.
        text = _TIME.sub(lambda m: _later(m[0], n), text)
        items = [i for i in json.loads(text)["items"] if i["kind"] in RESOURCE]
        for item in items:
            if item["kind"] in ("Job", "Pod"):
                item["metadata"].setdefault("labels", {})[LABEL_JOB_ID] = f"job-{n:06d}"
        return items


_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def _later(stamp: str, seconds: int) -> str:
    moment = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ") + timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def deliver(cache: ClusterCache, items: list[dict[str, Any]]) -> None:
    # Jobs and Pods before their events, as the cache's watches start.
    for item in sorted(items, key=lambda i: i["kind"] == "Event"):
        reflector = cache.reflectors[RESOURCE[item["kind"]]]
        obj = reflector._whole(item) if hasattr(reflector, "_whole") else item  # as decoded
        reflector.items[obj["metadata"]["uid"]] = reflector._kept(obj)
        assert reflector.on_event is not None
        reflector.on_event("ADDED", obj)


def names(items: list[dict[str, Any]]) -> tuple[str, str, list[str]]:
    """What `forget` is given: the Job's namespace and name, its Pods' names."""
    job = next(i for i in items if i["kind"] == "Job")
    pods = [i["metadata"]["name"] for i in items if i["kind"] == "Pod"]
    return job["metadata"]["namespace"], job["metadata"]["name"], pods


def allocated() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()
    copies = Copies()
    cache = ClusterCache(http=None)  # type: ignore[arg-type]  # no watch is started
    tracemalloc.start()
    for n in range(args.warmup):
        items = copies.copy(n)
        deliver(cache, items)
        cache.forget(*names(items))
    # What forget is given, made beforehand so that it is not counted.
    given = [names(copies.copy(n)) for n in range(args.warmup, args.warmup + args.jobs)]
    del items
    before = allocated()
    for n in range(args.warmup, args.warmup + args.jobs):
        deliver(cache, copies.copy(n))  # only the cache holds the objects afterwards
    tracked = allocated()
    for ns, job, pods in given:
        cache.forget(ns, job, pods)
    finished = allocated()
    tracemalloc.stop()
    report = {
        "jobs": args.jobs,
        "objects_per_job": len(copies.copy(0)),
        "wire_bytes_per_job": copies.wire,
        "tracked_bytes_per_job": round((tracked - before) / args.jobs),
        "finished_bytes_per_job": round((finished - before) / args.jobs),
    }
    wire = report["wire_bytes_per_job"]
    print(f"{args.jobs} jobs of {report['objects_per_job']} objects (a Job, its Pod, their Events)")
    print(f"  their JSON from the API server (baseline): {wire:,} bytes per job")
    print(
        f"  kept while tracked: {report['tracked_bytes_per_job']:,} bytes per job"
        f" ({report['tracked_bytes_per_job'] / wire:.2f}x the JSON)"
    )
    print(
        f"  kept once finished and let go: {report['finished_bytes_per_job']:,} bytes per job"
        f" ({report['finished_bytes_per_job'] / wire:.2f}x the JSON)"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "cache_memory.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
