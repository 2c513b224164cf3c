"""A diverged loss on the job page and in `kubetrain get job`: said as reported."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from kubetrain.cli.jobs import _progress_lines
from kubetrain.domain.manifest import job_name
from kubetrain.store import Database
from tests.api.builders import JOBS, PROJECT, FakeReviewer, Tokens, enrol, submitted
from tests.web.conftest import PROJECT_NAMESPACE, plaintext, sign_in

pytestmark = pytest.mark.db


def test_a_nan_loss_is_shown_on_the_page_and_by_get_job(
    client: TestClient, tokens: Tokens, db: Database, reviewer: FakeReviewer
) -> None:
    job_id = submitted(client, tokens)
    token = enrol(db, reviewer, job_id, "aaaaa", namespace=PROJECT_NAMESPACE)
    steps = [
        {"seq": i, "time": datetime.now(UTC).isoformat(), "type": "step", "step": i, "metrics": m}
        for i, m in enumerate([{"loss": 0.9}, {"loss": 0.5}, {"loss": "NaN", "lr": 0.1}])
    ]
    answer = client.post(
        f"/api/v1/jobs/{job_id}/reports",
        json={"pod": f"{job_name(job_id)}-aaaaa", "events": steps},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 202, answer.text
    sign_in(client, plaintext(tokens, "viewer"))
    page = client.get(f"/ui/projects/{PROJECT}/jobs/{job_id}")
    assert page.status_code == 200
    assert "2 · loss NaN · lr 0.1" in page.text
    progress = client.get(f"{JOBS}/{job_id}", headers=tokens("viewer")).json()["progress"]
    lines = dict(_progress_lines(progress, running=True))
    assert lines["Step"].startswith("2 (loss NaN, lr 0.1)")
