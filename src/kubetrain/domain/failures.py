"""How kubetrain treats a worker's failure: the preflight's exit code, and the one table
of a gang's failure classes, from which both the gang Job's podFailurePolicy
(domain/manifest.py) and kubetrain's restart rule (domain/diagnosis/gang.py) are made.

A single Pod's Job says the same with Kubernetes' own means: a disruption is `Ignore`d
(the Job controller replaces the Pod without counting it), the preflight's code is
`FailJob`, any other failure counts against `backoffLimit`. A gang's attempt is one Job
(`backoffLimit: 0`) that every class fails at once (`FailJob`), so that the Job
controller terminates the other ranks; what follows is kubetrain's, by this table.

A gang under Kueue restarts in place (domain/manifest.py): one Job for every attempt, so
that its Workload keeps its admission and its place. Its Job must not fail on a
restartable class, so the rules differ (`in_place`): a disruption is `Ignore`d, the
trainer's failure `Count`ed against a `backoffLimit` kubetrain sets per attempt (out of
reach while retries remain, reached by the next failure on the last attempt), and the
preflight's code still fails the Job at once. kubetrain sees the failed rank and
restarts the gang by the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kubetrain.domain.states import ReasonCode

R = ReasonCode

# The exit code our preflight ends with when the container cannot train (no
# GPU visible, wrong dataset version). 86 is outside the codes shells and
# runtimes use (1, 2, 126-128, 128+signal) and those Python itself exits with;
# a training program that exits 86 of its own also fails the Job at once.
PREFLIGHT_EXIT_CODE = 86


class GangAction(StrEnum):
    """What kubetrain does once a rank's failure failed the gang's attempt."""

    FAIL = "fail the job, no retry spent"  # the next attempt would fail the same way
    RESTART = "restart the whole gang, no retry spent"  # not the job's fault
    RETRY = "restart the whole gang, one retry spent"  # while retries remain; else fail


@dataclass(frozen=True)
class GangFailure:
    """One failure class: how it shows on the rank's Pod, its podFailurePolicy rule (every
    rule is `FailJob`; `in_place` is the action for a gang restarted in place), the
    reason codes the diagnosis reads it as, and the action."""

    name: str
    rule: dict[str, Any]  # the podFailurePolicy rule, less its action
    reasons: frozenset[ReasonCode]
    action: GangAction
    in_place: str  # the rule's action when the gang restarts in place (under Kueue)


def _exits(operator: str, values: list[int], container: str) -> dict[str, Any]:
    return {"onExitCodes": {"containerName": container, "operator": operator, "values": values}}


def gang_failures(container: str) -> tuple[GangFailure, ...]:
    """The table, in the podFailurePolicy's order (its first matching rule wins; the
    Job's failure message names the rule's index). `container` is the trainer's."""
    return (
        GangFailure(
            "disruption (DisruptionTarget: preempted, evicted, node lost)",
            {"onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            frozenset({R.NODE_LOST, R.PREEMPTED, R.EVICTED}),
            GangAction.RESTART,
            "Ignore",
        ),
        GangFailure(
            f"preflight failed (exit {PREFLIGHT_EXIT_CODE})",
            _exits("In", [PREFLIGHT_EXIT_CODE], container),
            frozenset({R.PREFLIGHT_FAILED}),
            GangAction.FAIL,
            "FailJob",
        ),
        GangFailure(
            "the trainer failed (any other non-zero exit, OOM kill)",
            _exits("NotIn", [0, PREFLIGHT_EXIT_CODE], container),
            frozenset({R.EXIT_NONZERO, R.OOM_KILLED}),
            GangAction.RETRY,
            "Count",
        ),
    )


def gang_action(reason: ReasonCode | None, container: str) -> GangAction:
    """The action for a failed rank whose cause reads `reason`; a cause the table does not
    name (none known, a kubelet's refusal) spends a retry, as the user's own failure."""
    for failure in gang_failures(container):
        if reason in failure.reasons:
            return failure.action
    return GangAction.RETRY
