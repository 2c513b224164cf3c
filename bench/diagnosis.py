"""Diagnosis time per job from an in-memory snapshot of 1,000 nodes and 1k-50k Pods.

The big snapshots are made only of recorded objects (tests/fixtures/snapshots):
the 4 Nodes of insufficient-gpu.json copied under new names/uids up to
`--nodes`; the running.json Job, its Pod and their Events copied under new
names/uids/job labels up to N unrelated jobs, each Pod bound to a node round-
robin. The two jobs under diagnosis are kept as recorded: the pending 16-GPU
job of insufficient-gpu.json and the running job of running.json.

With `--gangs 64 256`: per size, two gangs of each size inside the same
snapshot (the background jobs fewer by as many Pods, so the total stays N),
copied from the recorded gangs: a partial gang from gang-partial.json (its
Indexed Job with completions = parallelism = workers, `--pending` ranks copies
of its unschedulable rank, the rest copies of a running rank bound to the GPU
nodes round-robin) and a running gang from gang-running.json (every rank a copy
of a running rank). The ratio to the single-Pod job of the same kind in the
same snapshot is the result: the partial gang against the pending job, the
running gang against the running job (target: within 10x).

Measured per N: (a) `Snapshot.from_list` + `.index` once; (b) per job,
`diagnose(facts, snap.for_job(...), now)` median/p99 over `--reps` runs for the
pending and the running job, diagnosed again as the syncer does (what the
diagnosis before read of each Pod version kept, `glance_of`), and "cold": with
every Pod read afresh, as a job's first diagnosis. Side by side in the same run: the same two
diagnoses on their small recorded dumps (4 nodes), and a loop that touches
each Pod once (the least any per-job scan of the Pods would cost).

Prints a table and writes bench/results/diagnosis.json.

    .venv/bin/python bench/diagnosis.py [--nodes 1000] [--pods 2 1000 10000 50000] [--reps 200]
        [--gangs 64 256] [--pending 4] [--bytecodes]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import RESULTS, percentile, table
from _plots import paired_bars

from kubetrain.domain.diagnosis import JobFacts, diagnose
from kubetrain.domain.diagnosis.reading import forget_pods
from kubetrain.domain.snapshot import Snapshot

SNAPSHOTS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "snapshots"
# After every recording, as in tests/unit/diagnosis_helpers.py.
NOW = datetime(2026, 12, 2, 16, 0, tzinfo=UTC)
TARGET_MS = 5.0
TARGET_NODES, TARGET_PODS = 1000, 10000
GANG_TARGET = 10.0  # a gang's diagnosis within 10x of a single-Pod job's
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SNAPSHOTS / f"{name}.json").read_text())
    return data


def of_kind(data: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [i for i in data["items"] if isinstance(i, dict) and i.get("kind") == kind]


def facts_of(data: dict[str, Any]) -> JobFacts:
    (job,) = of_kind(data, "Job")
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    return JobFacts(name=name, k8s_name=name, namespace=namespace, dispatched=True)


def renamed(obj: dict[str, Any], replace: dict[str, str]) -> dict[str, Any]:
    """`obj` with every occurrence of each key replaced (names, uids, messages alike)."""
    raw = json.dumps(obj)
    for old, new in replace.items():
        raw = raw.replace(old, new)
    out: dict[str, Any] = json.loads(raw)
    return out


def copied_nodes(source: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The recorded Nodes, as recorded, then copies of them under new names/uids."""
    recorded = of_kind(source, "Node")
    nodes = [copy.deepcopy(n) for n in recorded]
    i = 0
    while len(nodes) < count:
        node = recorded[i % len(recorded)]
        name = node["metadata"]["name"]
        nodes.append(
            renamed(
                node,
                {
                    f'"{name}"': f'"{name}-c{i:05d}"',
                    node["metadata"]["uid"]: str(uuid.UUID(int=i + 1)),
                },
            )
        )
        i += 1
    return nodes


def copied_jobs(source: dict[str, Any], count: int, node_names: list[str]) -> list[dict[str, Any]]:
    """`count` copies of the recorded Job + Pod + Events, Pods bound to nodes round-robin."""
    (job,) = of_kind(source, "Job")
    (pod,) = of_kind(source, "Pod")
    events = of_kind(source, "Event")
    job_name, job_uid = job["metadata"]["name"], job["metadata"]["uid"]
    pod_uid, node = pod["metadata"]["uid"], pod["spec"]["nodeName"]
    raw_group = json.dumps([job, pod, *events])
    out: list[dict[str, Any]] = []
    for i in range(count):
        raw = raw_group
        for old, new in (
            (job_name, f"bg-{i:06d}"),  # the Job, its Pod's name prefix, the job-name labels
            (job_uid, str(uuid.UUID(int=(1 << 64) + i))),
            (pod_uid, str(uuid.UUID(int=(2 << 64) + i))),
            (f'"{node}"', f'"{node_names[i % len(node_names)]}"'),
            (f"to {node}", f"to {node_names[i % len(node_names)]}"),
        ):
            raw = raw.replace(old, new)
        out.extend(json.loads(raw))
    return out


def copied_gang(
    source: dict[str, Any],
    name: str,
    workers: int,
    pending: set[int],
    node_names: list[str],
    salt: int,
) -> list[dict[str, Any]]:
    """The recorded gang's Job as a gang of `workers` named `name`: the ranks in
    `pending` copies of its unschedulable rank, the others copies of a running rank
    bound to `node_names` round-robin, each with its events and the Job's
    SuccessfulCreate event; new names, uids and completion indexes."""
    (job,) = of_kind(source, "Job")
    pods = of_kind(source, "Pod")
    events = of_kind(source, "Event")
    job_name, job_uid = job["metadata"]["name"], job["metadata"]["uid"]
    running = next(p for p in pods if p["status"].get("phase") == "Running")
    unplaced = next((p for p in pods if not p["spec"].get("nodeName")), None)
    if pending and unplaced is None:
        raise SystemExit(f"{name}: the recorded gang has no pending rank to copy")
    created = next(
        e
        for e in events
        if e["involvedObject"]["kind"] == "Job" and e["reason"] == "SuccessfulCreate"
    )
    uids = iter(uuid.UUID(int=(salt << 64) + i) for i in range(1 << 30))
    new_job_uid = str(next(uids))
    job_copy = renamed(job, {job_uid: new_job_uid, f'"{job_name}"': f'"{name}"'})
    job_copy["spec"]["completions"] = job_copy["spec"]["parallelism"] = workers
    job_copy["status"]["active"] = workers
    out: list[dict[str, Any]] = [job_copy]
    for rank in range(workers):
        template = unplaced if rank in pending else running
        assert template is not None
        old = template["metadata"]["name"]
        old_rank = template["metadata"]["annotations"][COMPLETION_INDEX]
        new = f"{name}-{rank}-c{rank:04d}"
        group = [template, *(e for e in events if e["involvedObject"]["name"] == old)]
        replace = {
            old: new,  # the Pod, its events' names, involvedObject and messages
            f'"{job_name}-{old_rank}-"': f'"{name}-{rank}-"',  # generateName
            f'"{job_name}-{old_rank}"': f'"{name}-{rank}"',  # hostname
            f'"{job_name}"': f'"{name}"',
            job_uid: new_job_uid,
            template["metadata"]["uid"]: str(next(uids)),
        }
        for event in group[1:]:
            replace[event["metadata"]["uid"]] = str(next(uids))
        node = template["spec"].get("nodeName")
        if node:
            bound = node_names[(salt + rank) % len(node_names)]
            replace[f'"{node}"'] = f'"{bound}"'
            replace[f"to {node}"] = f"to {bound}"
        pod, *pod_events = renamed({"group": group}, replace)["group"]
        pod["metadata"]["annotations"][COMPLETION_INDEX] = str(rank)
        pod["metadata"]["labels"][COMPLETION_INDEX] = str(rank)
        made = renamed(
            created,
            {
                created["metadata"]["name"]: f"{name}.{rank:016x}",
                created["metadata"]["uid"]: str(next(uids)),
                job_uid: new_job_uid,
                f'"{job_name}"': f'"{name}"',
            },
        )
        made["message"] = f"Created pod: {new}"
        out += [pod, *pod_events, made]
    return out


def gang_facts(name: str, source: dict[str, Any]) -> JobFacts:
    namespace = of_kind(source, "Job")[0]["metadata"]["namespace"]
    return JobFacts(name=name, k8s_name=name, namespace=namespace, dispatched=True)


def timed(
    call: Callable[[], object], reps: int, before: Callable[[], object] | None = None
) -> tuple[list[float], list[float]]:
    """Each call's wall time and CPU time (ms), `before` run ahead of each, untimed."""
    call()  # warm-up
    samples, cpu = [], []
    for _ in range(reps):
        if before is not None:
            before()
        began, began_cpu = time.perf_counter(), time.process_time()
        call()
        cpu.append((time.process_time() - began_cpu) * 1000)
        samples.append((time.perf_counter() - began) * 1000)
    return samples, cpu


def summary(measured: tuple[list[float], list[float]]) -> dict[str, float]:
    """Median and p99 of the wall times; the median of the CPU times, which time spent
    waiting for a core on a shared machine does not inflate."""
    samples, cpu = measured
    return {
        "median_ms": round(statistics.median(samples), 3),
        "p99_ms": round(percentile(samples, 99), 3),
        "cpu_median_ms": round(statistics.median(cpu), 3),
    }


def bytecodes(call: Callable[[], object]) -> int:
    """Python bytecodes one call executes (after a warm-up): the same whatever the load,
    though it leaves out what C code does inside one bytecode (dict lookups, sorts)."""
    call()
    count = 0

    def trace(frame: Any, event: str, arg: object) -> Any:
        nonlocal count
        frame.f_trace_opcodes = True
        count += event == "opcode"
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


COUNT_BYTECODES = False  # --bytecodes


def per_job(snap: Snapshot, job: JobFacts, reps: int, cold: bool = False) -> dict[str, Any]:
    """The job's diagnosis, timed: as the syncer makes it again, its Pods' readings
    kept from the diagnosis before (`glance_of`); with `cold`, also with every Pod read
    afresh (what was kept let go before each, outside the time), as a first diagnosis."""

    def one() -> object:
        return diagnose(job, snap.for_job(job.k8s_name, job.namespace), NOW)

    result = diagnose(job, snap.for_job(job.k8s_name, job.namespace), NOW)
    samples = timed(one, reps)
    measured: dict[str, Any] = {
        **summary(samples),
        "reason": str(result.to_json(job.name).get("reason")),
    }
    if COUNT_BYTECODES:
        measured["bytecodes"] = bytecodes(one)
    if cold:
        uids = [p["metadata"]["uid"] for p in snap.for_job(job.k8s_name, job.namespace).pods]

        def afresh_one() -> None:
            forget_pods(uids)
            one()

        measured["cold"] = summary(timed(one, reps, before=lambda: forget_pods(uids)))
        if COUNT_BYTECODES:
            # Less the letting go itself, counted alone the same way.
            both = bytecodes(afresh_one)
            measured["cold"]["bytecodes"] = both - bytecodes(lambda: forget_pods(uids))
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=TARGET_NODES)
    parser.add_argument("--pods", type=int, nargs="+", default=[2, 1000, TARGET_PODS, 50000])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument(
        "--gangs", type=int, nargs="*", default=[64, 256], help="gang sizes (none: no gangs)"
    )
    parser.add_argument("--pending", type=int, default=4, help="pending ranks per partial gang")
    parser.add_argument(
        "--bytecodes",
        action="store_true",
        help="also count the Python bytecodes of one diagnosis each (load-independent)",
    )
    args = parser.parse_args()
    global COUNT_BYTECODES
    COUNT_BYTECODES = args.bytecodes
    if args.gangs and (min(args.gangs) < 2 or not 0 < args.pending < min(args.gangs)):
        parser.error("--gangs: sizes of at least 2; --pending: at least 1, fewer than a gang")
    pending_dump, running_dump = load("insufficient-gpu"), load("running")
    partial_dump, formed_dump = load("gang-partial"), load("gang-running")
    pending, running = facts_of(pending_dump), facts_of(running_dump)
    report: dict[str, Any] = {
        "nodes": args.nodes,
        "reps": args.reps,
        "target_ms": TARGET_MS,
        "gangs": args.gangs,
        "pending_ranks": args.pending,
        "gang_target_ratio": GANG_TARGET,
    }

    # Baseline: the recorded dumps themselves (4 nodes, 1 Pod each).
    report["recorded"] = {
        "pending": per_job(Snapshot.from_list(pending_dump), pending, args.reps),
        "running": per_job(Snapshot.from_list(running_dump), running, args.reps),
    }

    nodes = copied_nodes(pending_dump, args.nodes)
    node_names = [n["metadata"]["name"] for n in nodes]
    keep = [i for i in pending_dump["items"] if i.get("kind") != "Node"]
    keep += [i for i in running_dump["items"] if i.get("kind") != "Node"]
    report["sizes"] = {}
    gpu_nodes = [
        n["metadata"]["name"] for n in nodes if "nvidia.com/gpu" in n["status"]["allocatable"]
    ]
    gangs: list[tuple[str, str, JobFacts, list[dict[str, Any]]]] = []  # size, kind, facts, objects
    for i, workers in enumerate(args.gangs):
        # Pending ranks spread over the gang; the lowest blocks it, as rank 1 in the recording.
        step = workers // args.pending
        waiting = {1 + k * step for k in range(args.pending)}
        for kind, dump, ranks in (
            ("partial", partial_dump, waiting),
            ("running", formed_dump, set()),
        ):
            name = f"gang-{kind}-{workers}"
            salt = 16 + 2 * i + (kind == "running")
            objects = copied_gang(dump, name, workers, ranks, gpu_nodes, salt)
            gangs.append((str(workers), kind, gang_facts(name, dump), objects))
    gang_pods = sum(int(size) for size, *_ in gangs)
    for pods in args.pods:
        with_gangs = pods >= 2 + gang_pods
        extra = [o for *_, objects in gangs for o in objects] if with_gangs else []
        # + the 2 kept Pods and the gangs' ranks
        background = copied_jobs(running_dump, pods - 2 - gang_pods * with_gangs, node_names)
        data = {"apiVersion": "v1", "kind": "List", "items": [*nodes, *keep, *extra, *background]}
        builds = []
        for _ in range(3):
            began = time.perf_counter()
            snap = Snapshot.from_list(data)
            _ = snap.index
            builds.append((time.perf_counter() - began) * 1000)
        assert len(snap.pods) == pods, (len(snap.pods), pods)
        assert len(snap.nodes) == args.nodes, len(snap.nodes)

        def touch(snap: Snapshot = snap) -> None:
            for pod in snap.pods:
                _ = pod["metadata"]["name"]

        report["sizes"][str(pods)] = {
            "objects": len(data["items"]),
            "build_index_ms": round(statistics.median(builds), 1),
            "touch_each_pod": summary(timed(touch, args.reps)),
            "pending": per_job(snap, pending, args.reps, cold=True),
            "running": per_job(snap, running, args.reps, cold=True),
        }
        if with_gangs:
            measured = report["sizes"][str(pods)]
            measured["gangs"] = {}
            for size, kind, facts, _ in gangs:
                one = per_job(snap, facts, args.reps, cold=True)
                single = measured["pending" if kind == "partial" else "running"]
                for mine, theirs in ((one, single), (one["cold"], single["cold"])):
                    mine["ratio"] = round(mine["median_ms"] / theirs["median_ms"], 2)
                    mine["cpu_ratio"] = round(mine["cpu_median_ms"] / theirs["cpu_median_ms"], 2)
                measured["gangs"].setdefault(size, {})[kind] = one
        print(f"measured {pods} Pods", flush=True)

    rows: list[list[object]] = []
    rec = report["recorded"]
    rows.append(["recorded dump: 4 nodes, 1 Pod (baseline)", "-", "-", *_cells(rec)])
    for pods, r in report["sizes"].items():
        rows.append(
            [
                f"{args.nodes} nodes, {int(pods):,} Pods",
                r["build_index_ms"],
                r["touch_each_pod"]["median_ms"],
                *_cells(r),
            ]
        )
    print(f"{args.reps} repetitions; ms; per job = diagnose(facts, snap.for_job(...), now)")
    print(
        table(
            [
                "snapshot",
                "build+index",
                "touch pods",
                "pend p50",
                "pend p99",
                "run p50",
                "run p99",
            ],
            rows,
            [44, 12, 12, 10, 10, 10, 10],
        )
    )
    print(
        f"reasons: pending {rec['pending']['reason']}, running {rec['running']['reason']} "
        "(recorded); "
        + "; ".join(
            f"{p}: {r['pending']['reason']}, {r['running']['reason']}"
            for p, r in report["sizes"].items()
        )
    )
    dump_p50 = rec["pending"]["median_ms"]
    print(
        "pending job / the 4-node dump's, medians: "
        + "; ".join(
            f"{int(p):,} Pods {r['pending']['median_ms'] / dump_p50:.2f}x"
            for p, r in report["sizes"].items()
        )
    )
    target = report["sizes"].get(str(TARGET_PODS))
    if target is not None and args.nodes == TARGET_NODES:
        worst = max(target["pending"]["median_ms"], target["running"]["median_ms"])
        verdict = "met" if worst < TARGET_MS else "MISSED"
        print(
            f"{TARGET_NODES} nodes / {TARGET_PODS} Pods: worst median {worst:.2f} ms, "
            f"target < {TARGET_MS} ms: {verdict}"
        )
    gang_rows: list[list[object]] = []
    for pods, r in report["sizes"].items():
        for size, g in r.get("gangs", {}).items():
            part, run = g["partial"], g["running"]
            gang_rows.append(
                [
                    f"{int(pods):,} Pods: {size} workers",
                    part["median_ms"],
                    f"{part['ratio']:.1f}x",
                    f"{part['cpu_ratio']:.1f}x",
                    f"{part['cold']['cpu_ratio']:.1f}x",
                    run["median_ms"],
                    f"{run['ratio']:.1f}x",
                    f"{run['cpu_ratio']:.1f}x",
                    f"{run['cold']['cpu_ratio']:.1f}x",
                ]
            )
    if gang_rows:
        print(
            f"gangs ({args.pending} ranks pending in the partial one); ratio = gang p50 / the "
            "single-Pod job's p50 in the same snapshot (partial : pending, running : running), "
            "diagnosed again as the syncer does (each Pod's reading kept from the diagnosis "
            "before); cpu = the same ratio of the CPU times' medians; cold = the CPU ratio "
            "with every Pod read afresh"
        )
        print(
            table(
                [
                    "snapshot",
                    "part p50",
                    "ratio",
                    "cpu",
                    "cold",
                    "run p50",
                    "ratio",
                    "cpu",
                    "cold",
                ],
                gang_rows,
                [30, 10, 8, 8, 8, 10, 8, 8, 8],
            )
        )
        print(
            "gang reasons: "
            + "; ".join(
                f"{p} Pods/{size}: {g['partial']['reason']}, {g['running']['reason']}"
                for p, r in report["sizes"].items()
                for size, g in r.get("gangs", {}).items()
            )
        )
        if target is not None and "gangs" in target:
            worst_ratio = max(
                g[kind]["ratio"]
                for g in target["gangs"].values()
                for kind in ("partial", "running")
            )
            verdict = "met" if worst_ratio <= GANG_TARGET else "MISSED"
            print(
                f"{TARGET_PODS} Pods: worst gang ratio {worst_ratio:.1f}x, "
                f"target <= {GANG_TARGET:.0f}x: {verdict}"
            )
            cpu = max(
                g[kind]["cpu_ratio"]
                for g in target["gangs"].values()
                for kind in ("partial", "running")
            )
            cold = max(
                g[kind]["cold"]["cpu_ratio"]
                for g in target["gangs"].values()
                for kind in ("partial", "running")
            )
            print(
                f"  by CPU time: worst gang ratio {cpu:.1f}x; every Pod read afresh (a first "
                f"diagnosis): {cold:.1f}x"
            )
    if args.bytecodes:
        print("bytecodes per diagnosis (ratio to the baseline of the same kind):")
        base = report["recorded"]
        for pods, r in report["sizes"].items():
            pend, run = r["pending"]["bytecodes"], r["running"]["bytecodes"]
            dump = base["pending"]["bytecodes"]
            line = f"  {int(pods):,} Pods: pending {pend:,} ({pend / dump:.2f}x the 4-node dump)"
            line += f", running {run:,}"
            for size, g in r.get("gangs", {}).items():
                line += (
                    f"; {size} workers: partial {g['partial']['bytecodes']:,}"
                    f" ({g['partial']['bytecodes'] / pend:.1f}x pending), running"
                    f" {g['running']['bytecodes']:,} ({g['running']['bytecodes'] / run:.1f}x)"
                )
                cold_pend = r["pending"]["cold"]["bytecodes"]
                cold_run = r["running"]["cold"]["bytecodes"]
                cold_part = g["partial"]["cold"]["bytecodes"]
                cold_gang = g["running"]["cold"]["bytecodes"]
                line += (
                    f"; read afresh: partial {cold_part:,} ({cold_part / cold_pend:.1f}x),"
                    f" running {cold_gang:,} ({cold_gang / cold_run:.1f}x)"
                )
            print(line)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "diagnosis.json"
    path.write_text(json.dumps(report, indent=2))
    sizes = list(report["sizes"])
    baseline = report["recorded"]["pending"]["median_ms"]
    paired_bars(
        RESULTS / "diagnosis.svg",
        "A pending job's diagnosis vs the 4-node dump (same run)",
        [f"{int(p):,} Pods" for p in sizes],
        ("pending job", [report["sizes"][p]["pending"]["median_ms"] for p in sizes]),
        ("recorded dump (4 nodes, 1 Pod)", [baseline] * len(sizes)),
        "median ms per diagnosis (log scale)",
        log=True,
    )
    print(f"wrote {path} and {RESULTS / 'diagnosis.svg'}")


def _cells(r: dict[str, Any]) -> list[object]:
    return [
        r["pending"]["median_ms"],
        r["pending"]["p99_ms"],
        r["running"]["median_ms"],
        r["running"]["p99_ms"],
    ]


if __name__ == "__main__":
    main()
