"""A gang (an Indexed Job of N workers), rank by rank: running only when every rank runs,
otherwise held by the first rank that does not, with who is placed and who waits
(GANG_PARTIAL), and whether waiting can help judged for the whole gang; and once an
attempt's Job failed, whether the whole gang starts again as the next attempt.

Each rank's current Pod is its newest; what holds it is read as for a single Pod
(pending.py, attempts.py), its words prefixed with the rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubetrain.domain.diagnosis.attempts import _attempt_cause, _lost_node
from kubetrain.domain.diagnosis.pending import _pending, restarting_sidecars
from kubetrain.domain.diagnosis.quota import _quota
from kubetrain.domain.diagnosis.reading import (
    GangAttempt,
    PodGlance,
    _Finding,
    _gone,
    _Reader,
)
from kubetrain.domain.diagnosis.result import GangRestart, PodReport
from kubetrain.domain.failures import GangAction, gang_action, gang_failures
from kubetrain.domain.manifest import CONTAINER_NAME
from kubetrain.domain.nodes import is_gpu_resource, pod_requests
from kubetrain.domain.objects import as_list, get, meta_name, text, timestamp
from kubetrain.domain.quantity import format_quantity
from kubetrain.domain.states import BusinessState, Link, ReasonCode

R = ReasonCode
S = BusinessState

# Findings about where a Pod may go: the ones whose waiting the whole gang decides.
_SCHEDULING = frozenset(
    {
        R.INSUFFICIENT_GPU,
        R.INSUFFICIENT_CPU,
        R.INSUFFICIENT_MEMORY,
        R.INSUFFICIENT_RESOURCE,
        R.NO_GPU_NODES,
        R.UNTOLERATED_TAINT,
        R.NODE_SELECTOR_MISMATCH,
        R.NODE_NOT_READY,
        R.PLACEMENT_RULES,
        R.VOLUME_NODE_CONFLICT,
    }
)


# What ends a worker's Pod without its trainer failing (the DisruptionTarget condition).
DISRUPTIONS = next(
    f.reasons for f in gang_failures(CONTAINER_NAME) if f.action is GangAction.RESTART
)


@dataclass
class GangState:
    state: BusinessState
    findings: list[_Finding]
    stage: Link


def _ranks(reader: _Reader) -> dict[int, Mapping[str, Any]]:
    """Each rank's newest Pod."""
    newest: dict[int, Mapping[str, Any]] = {}
    if reader.workers == 1:
        return newest
    for seen, pod in zip(reader.seen, reader.pods, strict=True):  # oldest first
        rank = seen.rank if seen.rank is not None else reader.rank_of_glance(seen)
        if rank is not None:
            newest[rank] = pod
    return newest


def _gpus(pod: object) -> Decimal:
    return sum(
        (v for r, v in pod_requests(get(pod, "spec")).items() if is_gpu_resource(r)), Decimal(0)
    )


def _gpus_held(pods: Iterable[PodGlance]) -> Decimal:
    """The GPUs `pods` request together, each Pod's kept with its glance. A gang's ranks
    share one template: their requests are parsed once per distinct set of what
    `pod_requests` reads."""
    per_spec: dict[str, Decimal] = {}
    total = Decimal(0)
    for pod in pods:
        if pod.gpus is None:
            spec = pod.spec
            key = repr(
                (
                    [get(c, "resources") for c in as_list(spec, "containers")],
                    [
                        (get(c, "resources"), get(c, "restartPolicy"))
                        for c in as_list(spec, "initContainers")
                    ],
                    get(spec, "overhead"),
                )
            )
            if key not in per_spec:
                per_spec[key] = _gpus({"spec": spec})
            pod.gpus = per_spec[key]
        total += pod.gpus
    return total


def _listing(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def gang_active(reader: _Reader) -> GangState:
    """An active (not finished, not suspended) gang's state."""
    workers = reader.workers
    newest = _ranks(reader)
    runs: dict[int, Mapping[str, Any]] = {}
    done: dict[int, Mapping[str, Any]] = {}
    glances, known = reader.glances, reader.nodes_by_name
    for rank, pod in newest.items():
        seen = glances[id(pod)]
        node = seen.node
        if seen.running and not seen.deleting:
            if node and known and node not in known:  # as `reader.node_gone`
                # Running on a deleted node: the gang cannot go on. Pod GC fails the Pod
                # within a minute, and then its Job: the gang restarts.
                finding = _lost_node(reader, pod, node or "")
                finding.detail = f"rank {rank}: {finding.detail}"
                if reader.gang_attempt is not None:
                    finding.detail = (
                        f"rank {rank}: its node {node} no longer exists; once its Pod is "
                        f"failed the whole gang restarts as attempt "
                        f"{reader.gang_attempt.number + 1}"
                    )
                return GangState(S.QUEUED, [finding], Link.TRAINING)
            runs[rank] = pod
        elif seen.phase == "Succeeded":
            done[rank] = pod
    if runs and len(runs) + len(done) == workers:
        gang = _all_run(reader, runs, done)
        # A rank's native sidecar that keeps failing comes first, as for one Pod.
        for rank, pod in sorted(runs.items(), reverse=True):
            if not glances[id(pod)].spec.get("initContainers"):
                continue  # most Pods: no sidecars (as `restarting_sidecars` reads it)
            for finding in reversed(restarting_sidecars(reader, pod)):
                finding.detail = f"rank {rank}: {finding.detail}"
                gang.findings.insert(0, finding)
        return gang
    if not runs and len(done) == workers:
        return GangState(
            S.RUNNING,
            [_Finding(R.TRAINING, "every rank exited 0; the Job is completing")],
            Link.TRAINING,
        )
    blocking = min(r for r in range(workers) if r not in runs and r not in done)
    findings, stage = _rank_waits(reader, blocking, newest.get(blocking))
    placed = {
        rank: pod
        for rank, pod in newest.items()
        if rank != blocking and (seen := glances[id(pod)]).node and not seen.gone
    }
    primary = findings[0]
    waitable = _gang_waitable(reader, primary)
    if placed:
        ranks = sorted(placed)
        nodes = ", ".join(dict.fromkeys(glances[id(placed[r])].node or "?" for r in ranks))
        gpus = _gpus_held(glances[id(placed[r])] for r in ranks)
        holding = f", holding {format_quantity(gpus)} GPUs idle" if gpus else ""
        waiting = [r for r in range(workers) if r not in placed and r not in done]
        verb = "waits" if len(waiting) == 1 else "wait"
        partial = _Finding(
            R.GANG_PARTIAL,
            f"{len(placed)} of {workers} workers placed (rank{'s' * (len(ranks) > 1)} "
            f"{_listing(ranks)} on {nodes}{holding}); rank{'s' * (len(waiting) > 1)} "
            f"{_listing(waiting)} {verb}: {primary.detail}",
            waitable=primary.waitable if waitable is None else waitable,
            since=primary.since,
            raw_reason=primary.raw_reason,
            raw_message=primary.raw_message,
        )
        findings.insert(1, partial)
    if waitable is not None:
        primary.waitable = waitable
    for finding in findings:
        if finding.reason is not R.GANG_PARTIAL and finding.current:
            finding.detail = (
                f"rank {blocking}: {finding.detail}" if finding.detail else (f"rank {blocking}")
            )
    return GangState(S.QUEUED, findings, stage)


def _all_run(
    reader: _Reader, runs: dict[int, Mapping[str, Any]], done: dict[int, Mapping[str, Any]]
) -> GangState:
    ranks = sorted(runs)
    glances = reader.glances
    nodes = ", ".join(dict.fromkeys(glances[id(runs[r])].node or "?" for r in ranks))
    where = f"rank{'s' * (len(ranks) > 1)} {_listing(ranks)} on {nodes}"
    if done:
        where += f"; rank{'s' * (len(done) > 1)} {_listing(sorted(done))} exited 0"
    return _by_least_advanced(reader, runs, where)


def _rendezvous(
    reader: _Reader, runs: dict[int, Mapping[str, Any]], where: str, said: str
) -> GangState:
    # The gang formed when its last rank started; not every rank has said it trains since.
    started = [
        reader.glances[id(p)].started_at or timestamp(p, "status", "startTime")
        for p in runs.values()
    ]
    since = max((s for s in started if s is not None), default=None)
    return GangState(
        S.RUNNING,
        [
            _Finding(
                R.RENDEZVOUS, f"all {reader.workers} workers run ({where}); {said}", since=since
            )
        ],
        Link.TRAINING,
    )


def _in_preflight(rank: int, report: PodReport) -> str:
    check = f" check {report.check}" if report.check else ""
    return f"rank {rank} in its preflight{check}"


def _by_least_advanced(
    reader: _Reader, runs: dict[int, Mapping[str, Any]], where: str
) -> GangState:
    """Every rank reports its own phase: the gang is as far as its least advanced rank.
    TRAINING once every running rank said so (a rank that exited 0 has trained);
    PREFLIGHT while every rank that said anything is in its preflight; otherwise the
    ranks are still meeting (RENDEZVOUS), and the ones behind are named, with the
    preflight check each runs (rendezvous-reachable waits for rank 0's port). Without
    the ranks' own reports, rank 0's (`reported_phase`) is the only one known, and
    the others count as not reported: a dump, which holds no report, says the same."""
    reports, glances = reader.reports, reader.glances
    phases: dict[int, PodReport | None] = {}
    training: list[int] = []
    preflight: list[tuple[int, PodReport]] = []
    silent: list[int] = []
    for rank, pod in sorted(runs.items()):  # one pass: a gang has hundreds of ranks
        phases[rank] = rep = reports.get(glances[id(pod)].name or "")
        if rep is None:
            silent.append(rank)
        elif rep.phase == "TRAINING":
            training.append(rank)
        elif rep.phase == "PREFLIGHT":
            preflight.append((rank, rep))
    if len(training) == len(runs):
        since = max((rep.since for rep in phases.values() if rep and rep.since), default=None)
        return GangState(
            S.RUNNING,
            [_Finding(R.TRAINING, f"{reader.workers} workers: {where}", since=since)],
            Link.TRAINING,
        )
    behind = [_in_preflight(r, rep) for r, rep in preflight]
    if silent:
        behind.append(
            f"rank{'s' * (len(silent) > 1)} {_listing(silent)} "
            f"{'have' if len(silent) > 1 else 'has'} not reported yet"
        )
    if preflight and not training:
        since = min((rep.since for _, rep in preflight if rep.since), default=None)
        return GangState(
            S.RUNNING,
            [_Finding(R.PREFLIGHT, f"preflight checks: {where}; {'; '.join(behind)}", since=since)],
            Link.PREFLIGHT,
        )
    if training:
        ahead = f"rank{'s' * (len(training) > 1)} {_listing(training)} reported TRAINING"
        return _rendezvous(reader, runs, where, f"{'; '.join(behind)}; {ahead}")
    return _rendezvous(reader, runs, where, "no rank has reported TRAINING yet")


def first_failed_rank(
    reader: _Reader, job_message: str | None
) -> tuple[int, Mapping[str, Any], _Finding] | None:
    """The rank whose failure ended the gang: the Pod the Job's failure names (its
    podFailurePolicy message), else the one that finished first with a cause."""
    failed = []
    for pod in reader.pods:
        cause = _attempt_cause(pod)
        rank = reader.rank_of(pod)
        if cause is not None and rank is not None:
            named = bool(job_message) and f"/{meta_name(pod)} " in (job_message or "")
            failed.append((not named, cause.since is None, cause.since, rank, pod, cause))
    if not failed:
        return None
    failed.sort(key=lambda f: (f[0], f[1], f[2] or 0, f[3]))
    _, _, _, rank, pod, cause = failed[0]
    return rank, pod, cause


def _rank_waits(
    reader: _Reader, rank: int, pod: Mapping[str, Any] | None
) -> tuple[list[_Finding], Link]:
    """What holds one rank: its live Pod's blocker, or why its last Pod ended."""
    if pod is not None and not _gone(pod):
        return _pending(reader, pod)
    if pod is not None:
        cause = _attempt_cause(pod)
        if cause is not None:
            cause.current = False
            # The Job controller replaces the Pod, or the gang restarts: it comes by itself.
            cause.waitable = True
            return [cause], Link.SCHEDULER
    quota = _quota(reader)
    if quota:
        return quota, Link.QUOTA
    return [
        _Finding(
            R.SCHEDULING,
            "the Job controller has not created this rank's Pod yet",
            since=timestamp(reader.k8s_job, "metadata", "creationTimestamp"),
        )
    ], Link.QUOTA


def _gang_waitable(reader: _Reader, primary: _Finding) -> bool | None:
    """False when the nodes the gang may use could never hold all its workers at once
    (their allocatable, not what is free now); None when this is not about placement."""
    fit = reader.fit
    if fit is None or primary.reason not in _SCHEDULING or primary.waitable is False:
        return None
    workers = reader.workers
    pod = next(iter(_ranks(reader).values()), None)
    need = {r: v for r, v in pod_requests(get(pod, "spec")).items() if r != "pods" and v > 0}
    usable = {row.name for row in fit.nodes if row.closeness <= 1}
    slots: list[int] = []
    # Nodes of one pool share one allocatable mapping (NodeState.of): divide once per pool.
    per_pool: dict[int, int] = {}
    for node in reader.index.nodes:
        if node.name not in usable:
            continue
        held = per_pool.get(id(node.allocatable))
        if held is None:
            held = per_pool[id(node.allocatable)] = min(
                (int(node.allocatable.get(r, Decimal(0)) // v) for r, v in need.items()),
                default=1,
            )
        if held > 0:
            slots.append(held)
    if sum(slots) >= workers:
        return None  # the rank's own answer stands
    gpus = sum((v for r, v in need.items() if is_gpu_resource(r)), Decimal(0))
    unit = f"{format_quantity(gpus)} free GPUs" if gpus else "room for one worker"
    if max(slots, default=0) <= 1:
        said = (
            f"the gang needs {workers} nodes with {unit}; the cluster has {len(slots)} such "
            f"node{'s' * (len(slots) != 1)}"
        )
    else:
        said = (
            f"the gang needs room for {workers} workers at once; the nodes it may use hold "
            f"{sum(slots)}"
        )
    primary.detail = f"{primary.detail}; {said}" if primary.detail else said
    most = sum(slots)
    primary.action = (
        f"Run at most {most} worker{'s' * (most != 1)} (`workers: {most}`), or ask for less "
        "per worker so that more fit on a node; waiting will not help."
        if most
        else "Ask for less per worker; waiting will not help."
    )
    return False


def next_attempt(gang: GangAttempt, *, disrupted: bool) -> GangRestart | None:
    """After attempt `gang` failed: the next attempt, or None when the job fails.

    JobSet's rule: a disruption (node lost, preempted) restarts the gang without
    counting against `retries` (RestartJobSetAndIgnoreMaxRestarts); a worker's failure
    restarts it while retries remain (RestartJobSet), counting one."""
    if disrupted:
        return GangRestart(gang.number + 1, False, gang.retries_used, gang.job_uid)
    if gang.retries_used < gang.retries:
        return GangRestart(gang.number + 1, True, gang.retries_used + 1, gang.job_uid)
    return None


def gang_restart(
    reader: _Reader, cause: _Finding | None, job_finding: _Finding | None, job_message: str | None
) -> tuple[_Finding, GangRestart] | None:
    """A failed attempt of a gang kubetrain restarts: what the job says while the next
    attempt is made (QUEUED with the ended attempt's cause, "retrying: attempt N"), and
    the restart; None when the job fails instead (or is not such a gang)."""
    gang = reader.gang_attempt
    if gang is None or reader.job.cancel_requested:
        return None
    # The podFailurePolicy's message names the rule: a rank gone with its Pod still tells.
    disrupted = (cause is not None and cause.reason in DISRUPTIONS) or (
        "condition DisruptionTarget" in (job_message or "")
    )
    if not disrupted and gang_action(cause.reason if cause else None, CONTAINER_NAME) is (
        GangAction.FAIL
    ):
        return None  # a failed preflight: the next attempt would fail the same way
    restart = next_attempt(gang, disrupted=disrupted)
    if restart is None:
        return None
    ended = cause or job_finding
    if disrupted and (cause is None or cause.reason not in DISRUPTIONS):
        # The disrupted Pod is gone already (Pod GC deletes it); the Job's word stays.
        ended = _Finding(
            R.NODE_LOST, job_message or "", raw_reason="PodFailurePolicy", raw_message=job_message
        )
    if restart.counted:
        why = f"{restart.retries_used} of {gang.retries} retries used"
    else:
        why = "a disruption, not counted against retries"
    said = f": {ended.detail}" if ended is not None and ended.detail else ""
    finding = _Finding(
        ended.reason if ended is not None else R.NODE_LOST if disrupted else R.EXIT_NONZERO,
        f"retrying: attempt {restart.attempt} of the whole gang starts ({why}); "
        f"attempt {gang.number} ended{said}",
        waitable=True,
        raw_reason=ended.raw_reason if ended is not None else None,
        raw_message=ended.raw_message if ended is not None else None,
        since=ended.since if ended is not None else None,
    )
    return finding, restart


def ended_in_place(
    reader: _Reader,
) -> tuple[BusinessState, list[_Finding], GangRestart | None] | None:
    """A gang restarted in place whose current attempt lost a rank, while its Job lives on
    (a disruption is `Ignore`d, the trainer's failure counted short of the limit): the
    attempt ended, as a failed Job ends one elsewhere. A rank's Pod that ended Failed, or
    a rank with a second Pod in this attempt (the Job controller replaced one that Pod GC
    deleted before it was seen), ends it. Then the whole gang restarts by the table
    (`gang_restart`), or the job fails: QUEUED with the restart, FAILED, or None while
    no rank has ended."""
    if not reader.in_place or reader.gang_attempt is None:
        return None
    seen: set[int] = set()
    replaced = False
    for pod in reader.pods:
        rank = reader.rank_of(pod)
        replaced = replaced or rank in seen
        if rank is not None:
            seen.add(rank)
    failed = any(text(p, "status", "phase") == "Failed" for p in reader.pods)
    if not failed and not replaced:
        return None
    first = first_failed_rank(reader, None)
    cause: _Finding | None = None
    if first is not None:
        rank, ended, cause = first
        cause.detail = f"rank {rank} (Pod {meta_name(ended)}) failed first: {cause.detail}"
    restarting = gang_restart(reader, cause, None, None)
    if restarting is not None:
        finding, restart = restarting
        return S.QUEUED, [finding], restart
    if cause is None:
        cause = _Finding(R.EXIT_NONZERO, "a rank's Pod ended and was replaced")
    # The Job controller is about to fail the Job (the limit reached, or the preflight's
    # FailJob): failed already, never back to the queue for that moment.
    return S.FAILED, [cause], None
