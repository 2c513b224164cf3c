"""What every diagnosis promises, over every recorded fixture, with and without the
runtime's reports (none; every Pod in its preflight, naming a check; every Pod training;
the first training and the others in their preflight):

* a QUEUED verdict says whether waiting helps: `waitable` is true or false, never null;
* one link holds the job: a QUEUED or RUNNING job whose primary reason is a problem
  marks exactly one link blocking, one that is progressing marks none and exactly one
  active;
* a finished job never shows its last phase as current: no link active, no reason of a
  job in progress, no waiting, whatever its Pods reported last.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kubetrain.domain.diagnosis import ChainState, Diagnosis, PodReport
from kubetrain.domain.states import BusinessState, ReasonCode
from tests.unit.diagnosis_helpers import NOW, SNAPSHOTS, dump, items, run

pytestmark = pytest.mark.unit

R = ReasonCode
S = BusinessState

# Codes of a job that progresses with nothing wrong.
PROGRESSING = {
    R.SCHEDULING,
    R.CONTAINER_CREATING,
    R.PREFLIGHT,
    R.RENDEZVOUS,
    R.TRAINING,
}
IN_PROGRESS = PROGRESSING | {R.NO_PROGRESS, R.GANG_PARTIAL, R.SIDECAR_RESTARTING}
FIXTURES = sorted(p.stem for p in SNAPSHOTS.glob("*.json"))


def _reports(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    pods = [p["metadata"]["name"] for p in items(data, "Pod")]
    yield "no report", {}
    if not pods:
        return
    yield (
        "preflight",
        {"pod_reports": tuple(PodReport(p, "PREFLIGHT", NOW, "gpu-visible") for p in pods)},
    )
    yield (
        "training",
        {
            "pod_reports": tuple(PodReport(p, "TRAINING", NOW) for p in pods),
            "reported_phase": (pods[-1], "TRAINING", NOW),
        },
    )
    yield (
        "first training",
        {
            "pod_reports": (
                PodReport(pods[0], "TRAINING", NOW),
                *(PodReport(p, "PREFLIGHT", NOW, "rendezvous-reachable") for p in pods[1:]),
            ),
        },
    )


def _diagnoses() -> Iterator[Any]:
    for name in FIXTURES:
        data = dump(name)
        for label, facts in _reports(data):
            yield pytest.param(name, facts, id=f"{name}-{label}")


CASES = list(_diagnoses())


def _marks(d: Diagnosis, state: ChainState) -> list[str]:
    return [str(m.link) for m in d.chain if m.state is state]


@pytest.mark.parametrize(("name", "facts"), CASES)
def test_every_diagnosis_keeps_its_promises(name: str, facts: dict[str, Any]) -> None:
    d = run(dump(name), **facts)
    blocking, active = _marks(d, ChainState.BLOCKING), _marks(d, ChainState.ACTIVE)
    if d.state is S.QUEUED:
        assert d.waitable in (True, False), f"{d.reason}: waitable {d.waitable}"
    if d.state in (S.QUEUED, S.RUNNING):
        if d.reason in PROGRESSING:
            assert (blocking, len(active)) == ([], 1), d.chain
        else:
            assert len(blocking) == 1, f"{d.reason}: blocking {blocking}"
    if d.state.terminal:
        assert active == [], d.chain
        assert d.reason not in IN_PROGRESS
        assert d.waitable is None
