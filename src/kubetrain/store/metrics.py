"""The store's side of /metrics: time spent per business state, and the job counts.

Each change that ends a stay in a state notes (state, seconds) on its session
(`note_state_durations`); the stay counts into JOB_STATE_SECONDS only once the
transaction commits, so a rolled-back change counts nothing. The listeners are
registered on SQLAlchemy's `Session` class when this module is imported, which
importing `kubetrain.store` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from kubetrain.domain.states import BusinessState
from kubetrain.metrics import JOB_STATE_SECONDS
from kubetrain.store.db import Database
from kubetrain.store.models import Job

# session.info key: (state, seconds) of each stay in a business state that ended in
# this transaction.
STATE_DURATIONS_KEY = "kubetrain.state_durations"


def note_state_durations(
    session: Session,
    leaving: Iterable[tuple[str, BusinessState, datetime]],
    now: datetime,
    entered: Mapping[str, datetime],
) -> None:
    """Note how long each (job id, state it leaves, job created at) stayed in that state;
    `entered` is `state_entered` of those jobs (a job that never moved is in its state
    since it was created)."""
    noted = session.info.setdefault(STATE_DURATIONS_KEY, [])
    for job_id, state, created in leaving:
        since = entered.get(job_id) or created
        noted.append((str(state), max(0.0, (now - since).total_seconds())))


@event.listens_for(Session, "after_commit")
def _report_state_durations(session: Session) -> None:
    for state, seconds in session.info.pop(STATE_DURATIONS_KEY, ()):
        JOB_STATE_SECONDS.labels(state).observe(seconds)


@event.listens_for(Session, "after_rollback")
def _drop_state_durations(session: Session) -> None:
    session.info.pop(STATE_DURATIONS_KEY, None)


class JobCounts(Collector):
    """kubetrain_jobs{state,reason}, counted in the database at scrape time, so every
    API replica reports the same numbers whichever of them leads."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "kubetrain_jobs", "Jobs by business state and reason", labels=["state", "reason"]
        )
        query = select(Job.business_state, Job.reason, func.count()).group_by(
            Job.business_state, Job.reason
        )
        with self.db.read_only() as session:
            for state, reason, count in session.execute(query):
                family.add_metric([str(state), str(reason)], count)
        yield family
