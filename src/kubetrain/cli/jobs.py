"""`kubetrain submit | get jobs | get job | history | cancel`: training jobs, through the API.

A job is named on the command line by its id or by its name (the newest job
of that name in the project). `submit` checks the file here first, so a bad
file is refused with the field named before any request is made.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kubetrain.cli._client import CommandError, connect, project_of
from kubetrain.cli._output import age, emit, printable, short_time, table
from kubetrain.domain.facts import checkpoint_words, count, dropped_words, phase_fact


def _read(filename: str) -> str:
    try:
        if filename == "-":
            return sys.stdin.read()
        return Path(filename).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read {filename}: {exc}") from None


def _submit(args: argparse.Namespace) -> int:
    # Here: the TrainingJob models (pydantic) are for submit alone, not the reads.
    from kubetrain.domain.spec import SpecError, parse_training_job_yaml

    text = _read(args.filename)
    with connect(args) as client:
        try:
            job = parse_training_job_yaml(text, project=client.project)
        except SpecError as exc:
            lines = [f"{args.filename} is not a valid TrainingJob:"]
            lines += [
                f"  {problem.field or '(the document)'}: {problem.message}"
                for problem in exc.problems
            ]
            raise CommandError("\n".join(lines)) from None
        reply = client.submit_checked(
            job, idempotency_key=args.idempotency_key, dry_run=args.dry_run
        )
    project = job.metadata.project
    submitted = reply.body
    if args.dry_run:
        if args.output != "text":
            emit(submitted, args.output)
        else:
            print(forecast_text(submitted))
        return 0
    if args.output != "text":
        emit(submitted, args.output)
    elif reply.status == 200:
        print(
            f"job {submitted['name']} ({submitted['id']}) was submitted before with this key: "
            f"{submitted['business_status']}"
        )
    else:
        print(f"job {submitted['name']} submitted: {submitted['id']} in project {project}")
    return 0


def forecast_text(answer: dict[str, Any]) -> str:
    """A dry run's answer in words: the verdict, why, what to do, where or behind whom."""
    job, forecast = answer.get("job") or {}, answer.get("forecast") or {}
    diagnosis = forecast.get("diagnosis") or {}
    lines = [
        f"job {job.get('name')} (dry run, nothing submitted): {forecast.get('verdict')}",
        f"  reason:  {diagnosis.get('reason')} ({diagnosis.get('link')}; "
        f"waitable: {diagnosis.get('waitable')})",
        f"  why:     {printable(str(diagnosis.get('explanation') or '-'))}",
        f"  do:      {printable(str(diagnosis.get('action') or '-'))}",
    ]
    for placement in forecast.get("placements") or []:
        lines.append(f"  worker {placement.get('rank')}: node {placement.get('node')}")
    queue = forecast.get("queue")
    if queue:
        ahead = ", ".join(str(a) for a in queue.get("ahead") or []) or "nobody"
        lines.append(
            f"  queue:   ClusterQueue {queue.get('cluster_queue')}, position "
            f"{queue.get('position')} (ahead: {ahead})"
        )
    for holder in forecast.get("held_by") or []:
        holds = ", ".join(f"{k}={v}" for k, v in (holder.get("holds") or {}).items())
        until = holder.get("ends_by") or "no end set (no maxRuntime)"
        lines.append(
            f"  held by: {holder.get('job')} in {holder.get('namespace')} ({holds}) until {until}"
        )
    return "\n".join(lines)


# -- get -----------------------------------------------------------------------


def _get_jobs(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise CommandError("--limit must be 1 or more")
    with connect(args) as client:
        project = project_of(client)
        jobs = client.list_jobs(
            project, limit=args.limit, state=args.state, reason=args.reason, name=args.name
        )
    if args.output in ("json", "yaml"):
        emit(jobs, args.output)
        return 0
    headers = ["NAME", "STATE", "REASON", "GPUS", "NODE", "AGE"]
    rows: list[list[Any]] = [
        [j["name"], j["business_status"], j["reason"], gpus(j), j["node"], age(j["created_at"])]
        for j in jobs
    ]
    if args.output == "wide":
        headers += ["ATTEMPT", "EXIT", "ID", "RAW REASON"]
        for row, j in zip(rows, jobs, strict=True):
            row += [j["attempt"] or None, j["exit_code"], j["id"], j["raw_reason"]]
    if not jobs:
        print(f"no jobs in project {project}", file=sys.stderr)
        return 0
    table(headers, rows)
    return 0


def _get_job(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.get(args.job, project_of(client)).raw
    if args.output != "text":
        emit(job, args.output)
        return 0
    print(describe(job))
    return 0


def gpus(job: dict[str, Any]) -> str:
    """A job's GPUs as the dashboard shows them: "8", or per worker for a gang ("2x8")."""
    workers, each = job.get("workers", 1), job.get("gpus", 0)
    return f"{workers}x{each}" if workers > 1 else str(each)


def describe(job: dict[str, Any]) -> str:
    """A job in plain words: what it is doing, why, and who must act."""
    why = job["reason_detail"]
    action = why["action"]
    diagnosis = job.get("diagnosis") or {}
    if diagnosis.get("reason") == job["reason"] and diagnosis.get("action"):
        # The diagnosis knows this job's numbers ("ask for at most 8 GPUs per node;
        # waiting will not help"), where the catalog can only speak in general.
        action = diagnosis["action"]
    lines = [
        ("Name", job["name"]),
        ("ID", job["id"]),
        ("Project", f"{job['project']} (namespace {job['namespace']})"),
        ("State", job["business_status"]),
        ("GPUs", _size_words(job)),
        ("Reason", f"{job['reason']} (link: {why['link']})"),
        ("", why["explanation"]),
        ("Next step", f"{action} [{why['actor']}]"),
    ]
    if job.get("message"):
        lines.append(("Message", job["message"]))
    if job.get("raw_reason") or job.get("raw_message"):
        raw = ": ".join(part for part in (job.get("raw_reason"), job.get("raw_message")) if part)
        lines.append(("Kubernetes", raw))
    runtime = job.get("runtime")
    if runtime:
        where = f"pod {runtime['pod']}" + (f" on {runtime['node']}" if runtime["node"] else "")
        if runtime.get("rank") is not None:
            where = f"rank {runtime['rank']}, {where}"
        lines.append(("Attempt", f"{runtime['attempt']}: {where}, phase {runtime['phase'] or '-'}"))
        if runtime.get("container_state"):
            lines.append(("Container", runtime["container_state"]))
        if runtime.get("exit_code") is not None:
            lines.append(("Exit code", str(runtime["exit_code"])))
        if runtime.get("termination_message"):
            lines.append(("Termination", runtime["termination_message"]))
    else:
        lines.append(("Attempt", "none yet"))
    lines += _progress_lines(job.get("progress"), running=job["business_status"] == "RUNNING")
    if job.get("cancel_requested"):
        lines.append(("Cancel", "requested"))
    lines.append(("Created", f"{job['created_at']} ({age(job['created_at'])} ago)"))
    if job.get("finished_at"):
        lines.append(("Finished", job["finished_at"]))
    width = max(len(label) for label, _ in lines) + 2
    return "\n".join(
        (f"{label}:" if label else "").ljust(width) + printable(value) for label, value in lines
    )


def _progress_lines(progress: dict[str, Any] | None, *, running: bool) -> list[tuple[str, str]]:
    """What the job's runtime reported: the RUNNING sub-phase (a finished job's last
    phase reported), step, last checkpoint and how many, resumes."""
    if not progress:
        return []
    lines = []
    if progress.get("phase"):
        said = phase_fact(progress["phase"], progress["pod"], running=running)
        since = progress.get("phase_since")
        # How long a phase has lasted is news only while it is the job's.
        lasted = f" ({age(since)})" if since and said.current else ""
        lines.append((said.label, f"{said}{lasted}"))
    if progress.get("step") is not None:
        metrics = ", ".join(
            # NaN and the infinities come spelled ("NaN", "Infinity"): said as they are.
            f"{k} {v}" if isinstance(v, str) else f"{k} {v:g}"
            for k, v in sorted((progress.get("metrics") or {}).items())
        )
        ago = f", {age(progress['step_at'])} ago" if progress.get("step_at") else ""
        lines.append(("Step", f"{progress['step']}" + (f" ({metrics})" if metrics else "") + ago))
    checkpoint = progress.get("checkpoint")
    if checkpoint:
        lines.append(("Last checkpoint", checkpoint_words(checkpoint, progress.get("checkpoints"))))
    for resume in progress.get("resumes") or []:
        here = f"attempt {resume['attempt']}" if resume.get("attempt") else resume["pod"]
        origin = (
            f"attempt {resume['from_attempt']}"
            if resume.get("from_attempt")
            else (resume.get("from_pod") or "an earlier run")
        )
        lines.append(("Resumed", f"{here} from step {resume['from_step']} of {origin}"))
        # What differed between the checkpoint and this attempt, and whether it may.
        lines += [("", f"  {compared['says']}") for compared in resume.get("compared") or []]
    if progress.get("dropped"):
        lines.append(("Reports", dropped_words(progress["dropped"])))
    return lines


def _size_words(job: dict[str, Any]) -> str:
    workers, each = job.get("workers", 1), job.get("gpus", 0)
    if workers == 1:
        return str(each)
    used = job.get("retries_used") or 0
    counted = f"; {count(used, 'failed attempt')} counted against retries" if used else ""
    return f"{workers * each} ({workers} workers of {each}){counted}"


# -- history, cancel -----------------------------------------------------------


def _change(row: dict[str, Any]) -> str:
    if row["kind"] == "business":
        before = f"{row['from_state']}/{row['from_reason']}" if row["from_state"] else "(new)"
        return f"{before} -> {row['to_state']}/{row['to_reason']}"
    pod = f"pod {row['from_state'] or '-'} -> {row['to_state'] or '-'}"
    rank = f", rank {row['rank']}" if row.get("rank") is not None else ""
    return pod + (f" (attempt {row['attempt']}{rank})" if row.get("attempt") else "")


def _history(args: argparse.Namespace) -> int:
    with connect(args) as client:
        items = [entry.raw for entry in client.history(args.job, project_of(client))]
    if args.output != "table":
        emit(items, args.output)
        return 0
    rows = [
        [
            short_time(row["at"]),
            row["source"],
            _change(row),
            ": ".join(part for part in (row["raw_reason"], row["raw_message"]) if part),
        ]
        for row in items
    ]
    table(["TIME (UTC)", "SOURCE", "CHANGE", "KUBERNETES SAID"], rows)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with connect(args) as client:
        project = project_of(client)
        found = client.find(args.job, project)
        job = client.cancel(found["id"], project).raw
    if found["business_status"] == "CANCELLED":
        print(f"job {job['name']} ({job['id']}) was already cancelled")
    else:
        print(f"job {job['name']} ({job['id']}) cancelled")
    return 0
