"""`kubetrain why --from-file DUMP... [--job NAME] [-o text|json]`: the diagnosis of a dump.

DUMP is what `kubectl get job,pods,events,nodes,pvc,resourcequota -n NS -o
json` (or `-o yaml`) prints; several files are merged, `-` reads standard
input. It needs no server and no cluster: the same pure `diagnose` the server
runs reads the dump. A file that cannot be read is one line on stderr and exit
status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from kubetrain.domain.diagnosis import ChainState, Diagnosis, JobFacts, diagnose
from kubetrain.domain.manifest import LABEL_NAME
from kubetrain.domain.objects import labels, meta_name, meta_namespace
from kubetrain.domain.snapshot import Snapshot, SnapshotError

# A dump is at most a namespace's objects plus the nodes; far beyond this is not a dump.
MAX_DUMP_BYTES = 512 * 1024 * 1024
NODE_ROWS = 20  # node table rows shown in text; -o json has them all
WIDTH = 100

_MARKS = {
    ChainState.PASSED: "[ok]",
    ChainState.ACTIVE: "[>>]",
    ChainState.BLOCKING: "[!!]",
    ChainState.FAILED: "[xx]",
    ChainState.NOT_REACHED: "[  ]",
}


class WhyError(Exception):
    """A dump or a job name that cannot be used; the message says which and why."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "why",
        help="say why a training job is or is not running",
        description="Say which link of the chain holds a job, why, since when and what to do.",
    )
    parser.add_argument(
        "--from-file",
        dest="files",
        metavar="DUMP",
        nargs="+",
        required=True,
        help="kubectl get job,pods,events,nodes,pvc,resourcequota -o json|yaml output "
        "(several are merged; - is standard input)",
    )
    parser.add_argument("--job", help="the Kubernetes Job in the dump (needed when it has several)")
    parser.add_argument("-n", "--namespace", help="the Job's namespace (when names repeat)")
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="output format"
    )
    parser.set_defaults(func=_why)


def _why(args: argparse.Namespace) -> int:
    try:
        snapshot = load_dumps(args.files)
        job = pick_job(snapshot, args.job, args.namespace)
    except WhyError as exc:
        print(f"kubetrain: error: {exc}", file=sys.stderr)
        return 1
    name, namespace = meta_name(job) or "", meta_namespace(job)
    facts = JobFacts(
        name=labels(job).get(LABEL_NAME) or name,
        k8s_name=name,
        namespace=namespace,
        dispatched=True,
    )
    now = datetime.now(UTC)
    try:
        diagnosis = diagnose(facts, snapshot.for_job(name, namespace), now)
    except Exception as exc:  # a bug, but the user gets a line, not a traceback
        print(f"kubetrain: internal error while diagnosing {name}: {exc!r}", file=sys.stderr)
        return 70
    if args.output == "json":
        print(json.dumps(diagnosis.to_json(facts.name), indent=2, ensure_ascii=False))
    else:
        print(render_text(diagnosis, facts, now))
    return 0


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise WhyError(f"{path}: {size} bytes is larger than a dump can be")
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WhyError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise WhyError(f"{path}: is a directory, expected a dump file") from None
    except UnicodeDecodeError:
        raise WhyError(f"{path}: not a text file (expected JSON or YAML)") from None
    except OSError as exc:
        raise WhyError(f"{path}: {exc.strerror or exc}") from None


def _parse(path: str, content: str) -> list[object]:
    if not content.strip():
        raise WhyError(f"{path}: the file is empty")
    stripped = content.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            return [json.loads(content)]
        except json.JSONDecodeError as exc:
            if stripped.startswith("["):
                raise WhyError(f"{path}: not valid JSON: {exc}") from None
            # A YAML flow mapping can start with "{" too; let YAML try.
            json_error = exc
        except RecursionError:
            raise WhyError(f"{path}: nested too deeply to be a Kubernetes dump") from None
    else:
        json_error = None
    try:
        return [doc for doc in yaml.safe_load_all(content) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        if json_error is not None:
            raise WhyError(f"{path}: not valid JSON: {json_error}") from None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise WhyError(f"{path}: not valid JSON or YAML{where}: {problem}") from None
    except RecursionError:
        raise WhyError(f"{path}: nested too deeply to be a Kubernetes dump") from None


def load_dumps(paths: Sequence[str]) -> Snapshot:
    """One snapshot from dump files (JSON or YAML, one or more documents each)."""
    documents: list[object] = []
    for path in paths:
        documents.extend(_parse(path, _read(path)))
    if not documents:
        raise WhyError("the files hold no Kubernetes objects")
    try:
        return Snapshot.from_lists(documents)
    except SnapshotError as exc:
        where = paths[0] if len(paths) == 1 else ", ".join(paths)
        raise WhyError(f"{where}: {exc}") from None


def pick_job(snapshot: Snapshot, name: str | None, namespace: str | None) -> dict[str, Any]:
    jobs = [j for j in snapshot.jobs if namespace is None or meta_namespace(j) == namespace]
    if name is not None:
        chosen = [j for j in jobs if meta_name(j) == name] or [
            j for j in jobs if labels(j).get(LABEL_NAME) == name
        ]
    else:
        chosen = jobs
    listed = ", ".join(sorted(f"{meta_namespace(j)}/{meta_name(j)}" for j in jobs)[:10])
    if not jobs:
        where = f" in namespace {namespace}" if namespace else ""
        raise WhyError(f"the dump holds no Job{where} (did the kubectl command include `job`?)")
    if not chosen:
        raise WhyError(f"no Job named {name!r} in the dump; it holds {listed}")
    if len(chosen) > 1:
        hint = "--namespace" if name is not None else "--job NAME"
        raise WhyError(f"the dump holds several Jobs ({listed}); choose one with {hint}")
    return chosen[0]


def _ago(since: datetime, now: datetime) -> str:
    seconds = (now - since).total_seconds()
    if seconds < 60:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"  # pragma: no cover


def _wrap(label: str, body: str, indent: int = 10) -> list[str]:
    lines = textwrap.wrap(
        body,
        width=WIDTH,
        initial_indent=f"  {label:<{indent - 2}}",
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [f"  {label}"]


def render_text(diagnosis: Diagnosis, job: JobFacts, now: datetime) -> str:
    """The human view: chain, reason, explanation, action, raw, since, nodes."""
    d = diagnosis
    title = job.name if job.name == job.k8s_name else f"{job.name} (Kubernetes Job {job.k8s_name})"
    waiting = {True: "waiting can help", False: "waiting will not help", None: None}[d.waitable]
    head = f"{d.state} · {d.reason}" + (f" · {waiting}" if waiting else "")
    out = [f"Job {title} in namespace {job.namespace}", "", f"  {head}", "", "  Chain"]
    for mark in d.chain:
        out.append(f"    {_MARKS[mark.state]} {mark.link:<14} {mark.state.value.replace('-', ' ')}")
    out.append("")
    out += _wrap("Why", d.explanation)
    out += _wrap("Do", f"{d.action} (who acts: {d.actor})" if d.actor.value != "none" else d.action)
    if d.since is not None:
        out += _wrap("Since", f"{d.since.strftime('%Y-%m-%dT%H:%M:%SZ')} ({_ago(d.since, now)})")
    if d.raw_reason or d.raw_message:
        raw = ": ".join(x for x in (d.raw_reason, d.raw_message) if x)
        out += _wrap("Raw", raw)
    if len(d.blockers) > 1 or (d.blockers and d.blockers[0].nodes is not None):
        out += ["", "  Blockers"]
        for b in d.blockers:
            where = f"{b.nodes} node{'s' * (b.nodes != 1)}, " if b.nodes is not None else ""
            out += _wrap("", f"{b.reason} ({where}{b.link}): {b.detail}", indent=6)
    if d.nodes:
        fitting = sum(1 for n in d.nodes if n.fits)
        out += ["", f"  Nodes ({len(d.nodes)}; {fitting} could take it now)"]
        rows = [("NODE", "FITS", "WHY")]
        for node in d.nodes[:NODE_ROWS]:
            fits = "yes" if node.fits else ("later" if node.waitable else "no")
            rows.append((node.name, fits, "; ".join(node.why) or "-"))
        width = max(len(r[0]) for r in rows)
        for row in rows:
            out.append(f"    {row[0]:<{width}}  {row[1]:<5}  {row[2]}")
        if len(d.nodes) > NODE_ROWS:
            out.append(f"    … and {len(d.nodes) - NODE_ROWS} more (-o json lists all)")
    if d.constraints:
        out += ["", "  Constraints (each alone: nodes that meet it / rule it out)"]
        for c in d.constraints:
            never = f", {c.never} never" if c.never else ""
            out.append(f"    {c.matched:>5} / {c.ruled_out:<5} {c.constraint}{never}")
    if d.attempts:
        out += ["", "  Attempts"]
        for a in d.attempts:
            state = a.phase or "gone"
            extra = [a.container_state or "", a.raw_reason or ""]
            if a.exit_code is not None:
                extra.append(f"exit {a.exit_code}")
            shown = " ".join(x for x in extra if x)
            out.append(
                f"    #{a.number} {a.pod_name}  {state}  node {a.node or '-'}  {shown}".rstrip()
            )
    if d.notes:
        out += ["", "  Notes"]
        for note in d.notes:
            out += _wrap("-", note, indent=6)
    return "\n".join(line.rstrip() for line in out)
