"""`kubetrain why`: the diagnosis of a job, from the server, the cluster, or a dump.

    kubetrain why NAME|ID [-p PROJECT] [-o text|json]        the server's latest diagnosis
    kubetrain why NAME --kubeconfig PATH [-n NAMESPACE]      read the cluster directly
    kubetrain why --from-file DUMP... [--job NAME] [-o json] a kubectl dump

All three print the same human view (or the documented JSON object).

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
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubetrain.cli._errors import CommandError
from kubetrain.cli._output import printable
from kubetrain.domain.diagnosis import ChainState, JobFacts, diagnose
from kubetrain.domain.facts import age
from kubetrain.domain.manifest import LABEL_NAME, LABEL_QUEUE
from kubetrain.domain.objects import labels, meta_name, meta_namespace
from kubetrain.domain.snapshot import Snapshot, SnapshotError
from kubetrain.errors import KubetrainError

if TYPE_CHECKING:
    from kubetrain.cluster.direct import Kube

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
    ChainState.NOT_OBSERVED: "[ ?]",
    ChainState.NOT_NEEDED: "[--]",
}


class WhyError(KubetrainError):
    """A dump or a job name that cannot be used; the message says which and why."""


def _why(args: argparse.Namespace) -> int:
    if args.files:
        if args.kubeconfig:
            raise CommandError("--from-file and --kubeconfig do not go together: choose one")
        if args.ref and args.job and args.ref != args.job:
            raise CommandError(f"two Jobs named: {args.ref!r} and --job {args.job!r}")
        return _from_file(args.files, args.job or args.ref, args.namespace, args.output)
    if not args.ref:
        raise CommandError(
            "name the job (`kubetrain why NAME`), or give a dump with --from-file DUMP"
        )
    if args.job:
        raise CommandError("--job is for --from-file; name the job as the argument instead")
    if args.kubeconfig or args.namespace:
        return _direct(args.ref, args.kubeconfig, args.namespace, args.output)
    return _through_server(args)


def _emit(diagnosis: Mapping[str, Any], facts: JobFacts, output: str, *, title: str | None) -> None:
    if output == "json":
        print(printable(json.dumps(diagnosis, indent=2, ensure_ascii=False)))
    else:
        print(printable(render_text(diagnosis, facts, datetime.now(UTC), title=title)))


def _diagnose_listing(snapshot: Snapshot, job: dict[str, Any], output: str) -> int:
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
    _emit(diagnosis.to_json(facts.name), facts, output, title=None)
    return 0


def _from_file(
    files: Sequence[str], job_name: str | None, namespace: str | None, output: str
) -> int:
    try:
        snapshot = load_dumps(files)
        job = pick_job(snapshot, job_name, namespace)
    except WhyError as exc:
        print(f"kubetrain: error: {exc}", file=sys.stderr)
        return 1
    return _diagnose_listing(snapshot, job, output)


def read_job_listing(kube: Kube, name: str, namespace: str) -> dict[str, Any]:
    """The `kubectl get job,pods,events,nodes,pvc,pv,storageclass,resourcequota,limitrange,
    priorityclass -n NS -o json` view of one Kubernetes Job, plus every Pod bound to a
    node (node usage counts them all) and, where Kueue is installed, its Workloads,
    queues and flavors."""
    from kubetrain.cluster.direct import BOUND_PODS, as_list
    from kubetrain.cluster.errors import ClusterError

    job = kube.job(namespace, name)
    if job is None:
        raise CommandError(
            f"no Kubernetes Job {name!r} in namespace {namespace!r} (kubetrain names its Jobs "
            "kt-<job id>; `kubectl get jobs -n NAMESPACE` lists them)"
        )
    items: list[dict[str, Any]] = [job]
    items += kube.list("pods", namespace, label_selector=f"job-name={name}")
    items += kube.list("events", namespace)
    items += kube.list("nodes")
    items += kube.list("persistentvolumeclaims", namespace)
    items += kube.list("resourcequotas", namespace)
    items += kube.list("limitranges", namespace)
    # Cluster-wide kinds the diagnosis reads (where a claim's volume lives, how a class
    # binds, what a priority is): without read access to one, say so and go on.
    for resource in ("persistentvolumes", "storageclasses", "priorityclasses"):
        try:
            items += kube.list(resource)
        except ClusterError as exc:
            print(f"kubetrain: note: read without {resource}: {exc}", file=sys.stderr)
    seen = {(i.get("metadata") or {}).get("uid") for i in items if i.get("kind") == "Pod"}
    try:
        bound = kube.list("pods", field_selector=BOUND_PODS)
    except ClusterError as exc:  # no cluster-wide read: the node usage is the namespace's only
        print(f"kubetrain: note: node usage counts this namespace only: {exc}", file=sys.stderr)
        bound = kube.list("pods", namespace, field_selector=BOUND_PODS)
    items += [p for p in bound if (p.get("metadata") or {}).get("uid") not in seen]
    items += _kueue_objects(kube, job, namespace)
    return as_list(items)


def _kueue_objects(kube: Kube, job: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    """Kueue's Workloads, queues and flavors where Kueue is installed: every Workload
    and LocalQueue of the cluster (a job's place in its ClusterQueue is among all of
    them), or the namespace's alone where the kubeconfig may read no more."""
    from kubetrain.cluster.direct import KUEUE_GROUP
    from kubetrain.cluster.errors import ClusterError

    queued = LABEL_QUEUE in ((job.get("metadata") or {}).get("labels") or {})
    try:
        version = kube.served_version(KUEUE_GROUP)
    except ClusterError as exc:
        if queued:
            print(f"kubetrain: note: read without Kueue's objects: {exc}", file=sys.stderr)
        return []
    if version is None:
        if queued:
            print(
                f"kubetrain: note: the Job names a Kueue queue, but the cluster serves no "
                f"{KUEUE_GROUP} API (Kueue is not installed)",
                file=sys.stderr,
            )
        return []
    items: list[dict[str, Any]] = []
    for resource in ("workloads", "localqueues"):
        try:
            items += kube.list(resource, version=version)
        except ClusterError as exc:
            print(f"kubetrain: note: {resource} of this namespace only: {exc}", file=sys.stderr)
            items += kube.list(resource, namespace, version=version)
    for resource in ("clusterqueues", "resourceflavors"):
        try:
            items += kube.list(resource, version=version)
        except ClusterError as exc:
            print(f"kubetrain: note: read without {resource}: {exc}", file=sys.stderr)
    return items


def _direct(name: str, kubeconfig: str | None, namespace: str | None, output: str) -> int:
    from kubetrain.cluster.direct import Kube

    with Kube(kubeconfig) as kube:
        namespace = namespace or kube.namespace
        listing = read_job_listing(kube, name, namespace)
    try:
        snapshot = Snapshot.from_list(listing)
    except SnapshotError as exc:
        raise CommandError(f"the cluster's objects cannot be read: {exc}") from None
    job = snapshot.job(name, namespace)
    if job is None:  # pragma: no cover - it was just read
        raise CommandError(f"no Kubernetes Job {name!r} in namespace {namespace!r}")
    return _diagnose_listing(snapshot, job, output)


def _through_server(args: argparse.Namespace) -> int:
    from kubetrain.cli._client import connect, project_of

    with connect(args) as client:
        project = project_of(client)
        found = client.find(args.ref, project)
        diagnosis = client.why(found["id"], project).raw
    k8s_name = found.get("kubernetes_job") or found.get("name") or args.ref
    facts = JobFacts(
        name=str(found.get("name") or args.ref),
        k8s_name=str(k8s_name),
        namespace=str(found.get("namespace") or "?"),
        dispatched=True,
    )
    title = f"{facts.name} ({found.get('id')}, project {project}"
    title += f", Kubernetes Job {k8s_name})" if found.get("kubernetes_job") else ")"
    _emit(diagnosis, facts, args.output, title=title)
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
    import yaml  # here: a JSON dump, the common case, needs no YAML parser

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
        skipped = "".join(f"; skipped {note}" for note in snapshot.skipped)
        raise WhyError(
            f"the dump holds no Job{where} (did the kubectl command include `job`?){skipped}"
        )
    if not chosen:
        raise WhyError(f"no Job named {name!r} in the dump; it holds {listed}")
    if len(chosen) > 1:
        hint = "--namespace" if name is not None else "--job NAME"
        raise WhyError(f"the dump holds several Jobs ({listed}); choose one with {hint}")
    return chosen[0]


def _ago(since: datetime, now: datetime) -> str:
    """As the job page says it (kubetrain.domain.facts): "3h 5m ago"."""
    return f"{age(since, now)} ago"


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


def _parse_iso(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _list(data: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = data.get(key)
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def render_text(
    diagnosis: Mapping[str, Any], job: JobFacts, now: datetime, *, title: str | None = None
) -> str:
    """The human view of a diagnosis in its documented JSON form (docs/diagnosis.md):
    chain, reason, explanation, action, raw, since, nodes. The server's stored
    diagnosis and a local one read alike; a field missing is left out."""
    d = diagnosis
    if title is None:
        title = (
            job.name if job.name == job.k8s_name else f"{job.name} (Kubernetes Job {job.k8s_name})"
        )
    waitable = d.get("waitable")
    waiting = {True: "waiting can help", False: "waiting will not help"}.get(waitable is True)
    waiting = waiting if isinstance(waitable, bool) else None
    head = f"{d.get('business_status', '?')} · {d.get('reason', '?')}"
    head += f" · {waiting}" if waiting else ""
    out = [f"Job {title} in namespace {job.namespace}", "", f"  {head}", "", "  Chain"]
    marks = {str(state): mark for state, mark in _MARKS.items()}
    for mark in _list(d, "chain"):
        state = str(mark.get("state", ""))
        link = str(mark.get("link", "?"))
        out.append(f"    {marks.get(state, '[??]')} {link:<14} {state.replace('-', ' ')}")
    out.append("")
    out += _wrap("Why", str(d.get("explanation") or "-"))
    action, actor = str(d.get("action") or "-"), d.get("actor")
    out += _wrap("Do", f"{action} (who acts: {actor})" if actor and actor != "none" else action)
    since = _parse_iso(d.get("since"))
    if since is not None:
        out += _wrap("Since", f"{since.strftime('%Y-%m-%dT%H:%M:%SZ')} ({_ago(since, now)})")
    raw_reason, raw_message = d.get("raw_reason"), d.get("raw_message")
    if raw_reason or raw_message:
        out += _wrap("Raw", ": ".join(str(x) for x in (raw_reason, raw_message) if x))
    blockers = _list(d, "blockers")
    if len(blockers) > 1 or (blockers and blockers[0].get("nodes") is not None):
        out += ["", "  Blockers"]
        for b in blockers:
            count = b.get("nodes")
            where = f"{count} node{'s' * (count != 1)}, " if isinstance(count, int) else ""
            out += _wrap(
                "", f"{b.get('reason')} ({where}{b.get('link')}): {b.get('detail')}", indent=6
            )
    nodes = _list(d, "nodes")
    if nodes:
        fitting = sum(1 for n in nodes if n.get("fits"))
        out += ["", f"  Nodes ({len(nodes)}; {fitting} could take it now)"]
        rows = [("NODE", "FITS", "WHY")]
        for node in nodes[:NODE_ROWS]:
            fits = "yes" if node.get("fits") else ("later" if node.get("waitable") else "no")
            why = node.get("why")
            shown = "; ".join(str(w) for w in why) if isinstance(why, list) else ""
            rows.append((str(node.get("name", "?")), fits, shown or "-"))
        width = max(len(r[0]) for r in rows)
        for row in rows:
            out.append(f"    {row[0]:<{width}}  {row[1]:<5}  {row[2]}")
        if len(nodes) > NODE_ROWS:
            out.append(f"    … and {len(nodes) - NODE_ROWS} more (-o json lists all)")
    constraints = _list(d, "constraints")
    if constraints:
        out += ["", "  Constraints (each alone: nodes that meet it / rule it out)"]
        for c in constraints:
            never = f", {c['never']} never" if c.get("never") else ""
            out.append(
                f"    {c.get('matched', '?')!s:>5} / {c.get('ruled_out', '?')!s:<5} "
                f"{c.get('constraint', '?')}{never}"
            )
    attempts = _list(d, "attempts")
    if attempts:
        out += ["", "  Attempts"]
        for a in attempts:
            state = a.get("phase") or "gone"
            extra = [str(a.get("container_state") or ""), str(a.get("raw_reason") or "")]
            if a.get("exit_code") is not None:
                extra.append(f"exit {a['exit_code']}")
            shown = " ".join(x for x in extra if x)
            out.append(
                f"    #{a.get('number', '?')} {a.get('pod', '?')}  {state}  "
                f"node {a.get('node') or '-'}  {shown}".rstrip()
            )
    notes = d.get("notes")
    if isinstance(notes, list) and notes:
        out += ["", "  Notes"]
        for note in notes:
            out += _wrap("-", str(note), indent=6)
    return "\n".join(line.rstrip() for line in out)
