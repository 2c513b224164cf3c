"""The dashboard's HTML routes: sign-in and its cookie, CSRF, escaping, the REST API's
roles and project scopes on every page, filters, counts, nodes and quotas."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kubetrain.cli.serve import http_config
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.settings import ServerSettings
from kubetrain.store import (
    Database,
    Source,
    apply_business_change,
    job_history,
    list_tokens,
    revoke_token,
)
from tests.api.builders import OTHER, PROJECT, FakeReviewer, Tokens, enrol, submit, training_job
from tests.web.conftest import PROJECT_NAMESPACE, csrf_of, plaintext, sign_in

pytestmark = pytest.mark.db

# Reports take times within a window of the server's clock (api/reports.py).
YESTERDAY = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT16:00:0{}Z")

PAGES = [
    f"/ui/projects/{PROJECT}/jobs",
    "/ui/nodes",
    "/ui/quotas",
    "/ui/queues",
    "/ui/usage",
    "/ui/",
]
HOSTILE = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'


def submitted(client: TestClient, tokens: Tokens, document: dict[str, Any] | None = None) -> str:
    resp = submit(client, tokens, document or training_job())
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _job_page(job_id: str, project: str = PROJECT) -> str:
    return f"/ui/projects/{project}/jobs/{job_id}"


@pytest.mark.parametrize("page", PAGES)
def test_a_page_without_a_session_sends_to_sign_in(client: TestClient, page: str) -> None:
    resp = client.get(page, follow_redirects=False)
    assert resp.status_code == 303
    assert resp.headers["location"].startswith("/ui/signin?next=")
    client.cookies.set("kubetrain_session", "eyJmb3JnZWQiOiB0cnVlfQ.bm90LWEtbWFj", path="/ui")
    assert client.get(page, follow_redirects=False).status_code == 303  # a forged cookie


def test_sign_in_gives_a_strict_cookie_that_holds_no_token(
    client: TestClient, tokens: Tokens
) -> None:
    secret = plaintext(tokens, "viewer")
    form = client.get("/ui/signin")
    resp = client.post(
        "/ui/signin",
        data={"csrf_token": csrf_of(form.text), "token": secret, "next": "https://evil.example/"},
        follow_redirects=False,
    )
    assert resp.status_code == 303
    assert resp.headers["location"] == "/ui/"  # `next` never leaves the dashboard
    cookie = next(c for c in resp.headers.get_list("set-cookie") if "kubetrain_session=" in c)
    attributes = {a.strip().lower() for a in cookie.split(";")}
    assert {"httponly", "samesite=lax", "path=/ui"} <= attributes
    assert "secure" not in attributes  # plain HTTP here; see the TLS test
    assert secret not in cookie
    assert client.get(f"/ui/projects/{PROJECT}/jobs").status_code == 200

    out = client.post("/ui/signout", data={"csrf_token": csrf_of(client.get("/ui/nodes").text)})
    assert out.status_code == 200
    assert "Sign in" in out.text
    assert client.get("/ui/nodes", follow_redirects=False).status_code == 303


def test_the_cookie_is_secure_over_tls(app: FastAPI, tokens: Tokens) -> None:
    with TestClient(app, base_url="https://testserver") as tls:
        form = tls.get("/ui/signin")
        resp = tls.post(
            "/ui/signin",
            data={"csrf_token": csrf_of(form.text), "token": plaintext(tokens, "viewer")},
            follow_redirects=False,
        )
    cookie = next(c for c in resp.headers.get_list("set-cookie") if "kubetrain_session=" in c)
    assert "secure" in {a.strip().lower() for a in cookie.split(";")}


@pytest.mark.parametrize(("trusted", "tls"), [("127.0.0.1", False), ("testclient", True)])
def test_behind_a_trusted_tls_proxy_cookies_are_secure(
    app: FastAPI, trusted: str, tls: bool
) -> None:
    # `serve --forwarded-allow-ips`: only a listed proxy's X-Forwarded-Proto is believed.
    config = http_config(ServerSettings(forwarded_allow_ips=trusted), app)
    config.load()
    with TestClient(config.loaded_app) as proxied:
        form = proxied.get("/ui/signin", headers={"X-Forwarded-Proto": "https"})
    cookie = next(c for c in form.headers.get_list("set-cookie") if "kubetrain_signin=" in c)
    assert ("secure" in {a.strip().lower() for a in cookie.split(";")}) is tls
    assert ("strict-transport-security" in form.headers) is tls


def test_sign_in_refusals_name_the_problem(client: TestClient, tokens: Tokens) -> None:
    csrf = csrf_of(client.get("/ui/signin").text)
    wrong = client.post("/ui/signin", data={"csrf_token": csrf, "token": "kt_nope"})
    assert wrong.status_code == 401
    assert "token: unknown or revoked" in wrong.text
    empty = client.post("/ui/signin", data={"csrf_token": csrf, "token": ""})
    assert empty.status_code == 422
    assert "token: paste an API token" in empty.text
    forged = client.post(
        "/ui/signin", data={"csrf_token": "guess", "token": plaintext(tokens, "viewer")}
    )
    assert forged.status_code == 403
    assert "kubetrain_session=" not in " ".join(forged.headers.get_list("set-cookie"))
    as_json = client.post("/ui/signin", json={"token": plaintext(tokens, "viewer")})
    assert as_json.status_code == 415


def test_sign_out_ends_the_session_on_the_server(client: TestClient, tokens: Tokens) -> None:
    sign_in(client, plaintext(tokens, "viewer"))
    saved = client.cookies.get("kubetrain_session", path="/ui")
    assert saved
    out = client.post("/ui/signout", data={"csrf_token": csrf_of(client.get("/ui/nodes").text)})
    assert out.status_code == 200
    # The cookie saved before sign-out, replayed, opens nothing.
    client.cookies.set("kubetrain_session", saved, path="/ui")
    assert client.get("/ui/nodes", follow_redirects=False).status_code == 303
    # Another sign-in with the same token is another session, untouched by that sign-out.
    sign_in(client, plaintext(tokens, "viewer"))
    assert client.get("/ui/nodes").status_code == 200


def test_the_sign_in_csrf_value_is_the_servers_and_the_form_this_sites(
    client: TestClient, tokens: Tokens
) -> None:
    secret = plaintext(tokens, "viewer")
    # A value of the attacker's choosing, planted as the cookie and sent in the form.
    chosen = "attacker-chosen-value"
    client.cookies.set("kubetrain_signin", chosen, path="/ui")
    planted = client.post("/ui/signin", data={"csrf_token": chosen, "token": secret})
    assert planted.status_code == 403
    assert "kubetrain_session=" not in " ".join(planted.headers.get_list("set-cookie"))
    # A real form, but posted from another site: the browser says so.
    client.cookies.clear()
    csrf = csrf_of(client.get("/ui/signin").text)
    for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        refused = client.post(
            "/ui/signin", data={"csrf_token": csrf, "token": secret}, headers=headers
        )
        assert refused.status_code == 403, headers
        assert "kubetrain_session=" not in " ".join(refused.headers.get_list("set-cookie"))
    same_site = client.post(
        "/ui/signin",
        data={"csrf_token": csrf, "token": secret},
        headers={"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"},
        follow_redirects=False,
    )
    assert same_site.status_code == 303


def test_a_revoked_token_ends_its_session(client: TestClient, tokens: Tokens, db: Database) -> None:
    sign_in(client, plaintext(tokens, "viewer"))
    assert client.get("/ui/nodes").status_code == 200
    with db.transaction() as session:
        token_id = next(t.id for t in list_tokens(session) if t.name == f"viewer-{PROJECT}")
        assert revoke_token(session, token_id)
    assert client.get("/ui/nodes", follow_redirects=False).status_code == 303


def test_cancel_takes_the_session_csrf_token_and_the_cancel_role(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    job_id = submitted(client, tokens)
    sign_in(client, plaintext(tokens, "submitter"))
    page = client.get(_job_page(job_id))
    assert 'id="cancel"' in page.text
    cancel = f"{_job_page(job_id)}/cancel"
    for fields in ({}, {"csrf_token": "x" * 43}):
        refused = client.post(cancel, data=fields)
        assert refused.status_code == 403
        assert "stale or was not sent by this site" in refused.text
    with db.read_only() as session:
        assert len(job_history(session, PROJECT, job_id)) == 1  # nothing was written

    done = client.post(cancel, data={"csrf_token": csrf_of(page.text)}, follow_redirects=False)
    assert done.status_code == 303
    assert done.headers["location"] == _job_page(job_id)
    after = client.get(_job_page(job_id)).text
    assert 'id="state">CANCELLED<' in after
    assert 'id="cancel"' not in after
    with db.read_only() as session:
        last = job_history(session, PROJECT, job_id)[-1]
    assert last.to_state == "CANCELLED"
    assert last.raw_message is None or "web dashboard" in (last.raw_message or "")


def test_a_viewer_sees_no_cancel_button_and_may_not_post_one(
    client: TestClient, tokens: Tokens
) -> None:
    job_id = submitted(client, tokens)
    sign_in(client, plaintext(tokens, "viewer"))
    page = client.get(_job_page(job_id))
    assert page.status_code == 200
    assert 'id="cancel"' not in page.text
    refused = client.post(f"{_job_page(job_id)}/cancel", data={"csrf_token": csrf_of(page.text)})
    assert refused.status_code == 403
    assert "a viewer token may not cancel" in refused.text


def test_hostile_text_is_escaped_on_every_page_and_fragment(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    document = training_job()
    document["metadata"]["labels"] = {"team": "x"}
    document["metadata"]["annotations"] = {"note": HOSTILE}
    job_id = submitted(client, tokens, document)
    with db.transaction() as session:
        apply_business_change(
            session,
            job_id,
            BusinessState.QUEUED,
            ReasonCode.INSUFFICIENT_GPU,
            raw_reason="Unschedulable",
            raw_message=HOSTILE,
            message=HOSTILE,
            source=Source.SYNCER,
        )
    sign_in(client, plaintext(tokens, "viewer"))
    for url in (
        f"/ui/projects/{PROJECT}/jobs",
        f"/ui/projects/{PROJECT}/jobs?fragment=live",
        _job_page(job_id),
        f"{_job_page(job_id)}?fragment=live",
    ):
        resp = client.get(url)
        assert resp.status_code == 200
        assert "<script>window.__xss" not in resp.text, url
        assert "<img src=x" not in resp.text, url
        assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in resp.text, url
        csp = resp.headers["content-security-policy"]
        assert "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
    # in a query string reflected back as a refusal, too
    refused = client.get(f"/ui/projects/{PROJECT}/jobs?state={HOSTILE}")
    assert refused.status_code == 422
    assert "state: " in refused.text
    assert "<script>window" not in refused.text


def test_another_projects_jobs_show_on_no_page(client: TestClient, tokens: Tokens) -> None:
    mine = submitted(client, tokens, training_job("mine"))
    theirs = client.post(
        f"/api/v1/projects/{OTHER}/jobs",
        json=training_job("theirs"),
        headers=tokens("submitter", OTHER),
    ).json()["id"]
    sign_in(client, plaintext(tokens, "admin"))  # every role, one project
    assert client.get(f"/ui/projects/{OTHER}/jobs").status_code == 403
    # the same 404 as for a job that does not exist: ids leak nothing
    assert client.get(_job_page(theirs, OTHER)).status_code == 404
    assert client.get(_job_page(theirs)).status_code == 404
    assert client.get(_job_page("no-such-job", OTHER)).status_code == 404
    page = csrf_of(client.get(_job_page(mine)).text)
    assert client.post(f"{_job_page(theirs, OTHER)}/cancel", data={"csrf_token": page}).status_code
    assert client.get(_job_page(theirs, OTHER)).status_code == 404
    for url in [*PAGES, _job_page(mine), f"/ui/projects/{PROJECT}/jobs?fragment=live"]:
        text = client.get(url).text
        for secret in ("theirs", theirs, OTHER):
            assert secret not in text, url
    # the quota of OTHER's namespace and its waiting demand stay hidden as well
    assert "fixture-waiting-for-quota" not in client.get("/ui/quotas").text


def test_an_all_projects_token_sees_every_project(client: TestClient, tokens: Tokens) -> None:
    submitted(client, tokens, training_job("mine"))
    client.post(f"/api/v1/projects/{OTHER}/jobs", json=training_job("theirs"), headers=tokens.admin)
    sign_in(client, plaintext(tokens, "viewer", "*"))
    home = client.get("/ui/").text
    assert f"/ui/projects/{PROJECT}/jobs" in home
    assert f"/ui/projects/{OTHER}/jobs" in home
    assert "theirs" in client.get(f"/ui/projects/{OTHER}/jobs").text
    assert "fixture-waiting-for-quota" in client.get("/ui/quotas").text


def test_filters_and_counts_per_reason(client: TestClient, tokens: Tokens, db: Database) -> None:
    ids = {name: submitted(client, tokens, training_job(name)) for name in ("a", "b", "c")}
    with db.transaction() as session:
        for name, reason in (
            ("a", ReasonCode.INSUFFICIENT_GPU),
            ("b", ReasonCode.INSUFFICIENT_GPU),
        ):
            apply_business_change(
                session, ids[name], BusinessState.QUEUED, reason, source=Source.SYNCER
            )
        apply_business_change(
            session,
            ids["c"],
            BusinessState.QUEUED,
            ReasonCode.WAITING_FOR_QUOTA,
            source=Source.SYNCER,
        )
    sign_in(client, plaintext(tokens, "viewer"))
    page = client.get(f"/ui/projects/{PROJECT}/jobs").text
    counts = re.findall(r'class="chip chip-user"[^>]*>([^<]+)</a>', page)
    assert counts == ["2 waiting for GPU", "1 waiting for quota"]
    only = client.get(f"/ui/projects/{PROJECT}/jobs?reason=WAITING_FOR_QUOTA").text
    names = re.findall(r'class="job-name">([^<]+)<', only)
    assert names == ["c"]
    both = client.get(f"/ui/projects/{PROJECT}/jobs?state=QUEUED&reason=INSUFFICIENT_GPU").text
    assert sorted(re.findall(r'class="job-name">([^<]+)<', both)) == ["a", "b"]
    bad = client.get(f"/ui/projects/{PROJECT}/jobs?reason=SLOW")
    assert bad.status_code == 422
    assert "reason: &#39;SLOW&#39; is not a reason code" in bad.text


def test_nodes_page_draws_bars_per_accelerator_with_waiting_demand(
    client: TestClient, tokens: Tokens
) -> None:
    submitted(
        client,
        tokens,
        training_job(resources={"requests": {"cpu": "1", "memory": "1Gi"}, "gpus": 16}),
    )
    sign_in(client, plaintext(tokens, "viewer"))
    page = client.get("/ui/nodes").text
    groups = re.findall(r'data-accelerator="([^"]+)"', page)
    assert groups == ["nvidia-h100", "no accelerator"]  # GPU groups first
    gpu_bars = re.findall(
        r'data-resource="nvidia.com/gpu" data-used="([^"]+)" data-total="([^"]+)"', page
    )
    assert gpu_bars == [("0", "8"), ("0", "8")]  # the recorded H100 nodes, nothing bound
    assert "GPUs in use" in page
    assert "<b>16 GPUs</b>" in page
    # the recorded Pod waiting in PROJECT's namespace, with where it could go
    assert "kt-insufficient-gpu" in page
    assert "fits on no node" in page
    live = client.get("/ui/nodes?fragment=live").text
    assert "<html" not in live
    assert 'data-node="gpu-h100-0"' in live


def test_quotas_page_shows_used_of_hard(client: TestClient, tokens: Tokens) -> None:
    sign_in(client, plaintext(tokens, "viewer", OTHER))
    page = client.get("/ui/quotas").text
    assert 'data-namespace="fixture-waiting-for-quota-ebe6"' in page
    assert 'data-resource="requests.nvidia.com/gpu" data-used="0" data-total="2"' in page
    assert "0 of 2 used, 2 free" in page


def test_without_control_loops_the_cluster_pages_say_so(db: Database, tokens: Tokens) -> None:
    from kubetrain.api import create_app
    from kubetrain.settings import ServerSettings

    app = create_app(ServerSettings(database_url=db.url.render_as_string(hide_password=False)), db)
    with TestClient(app) as plain:
        sign_in(plain, plaintext(tokens, "viewer"))
        for url in ("/ui/nodes", "/ui/quotas", "/ui/queues"):
            resp = plain.get(url)
            assert resp.status_code == 200
            assert "does not watch the cluster" in resp.text


def test_the_job_page_shows_progress_a_chart_and_the_resume_lineage(
    client: TestClient, tokens: Tokens, db: Database, reviewer: FakeReviewer
) -> None:
    from kubetrain.domain.manifest import job_name

    job_id = submitted(client, tokens)
    token = enrol(db, reviewer, job_id, "aaaaa", namespace=PROJECT_NAMESPACE)
    pod = f"{job_name(job_id)}-aaaaa"
    events = (
        [
            {"seq": 0, "time": YESTERDAY.format(0), "type": "phase", "phase": "TRAINING"},
            {"seq": 1, "time": YESTERDAY.format(1), "type": "resumed", "fromStep": 10},
        ]
        + [
            {
                "seq": 2 + i,
                "time": YESTERDAY.format(2),
                "type": "step",
                "step": 10 + i,
                "metrics": {"loss": 1.0 / (i + 1)},
            }
            for i in range(5)
        ]
        + [
            {
                "seq": 9,
                "time": YESTERDAY.format(3),
                "type": "checkpoint",
                "step": 14,
                "sizeBytes": 2 * 2**20,
                "durationSeconds": 0.5,
            }
        ]
    )
    answer = client.post(
        f"/api/v1/jobs/{job_id}/reports",
        json={"pod": pod, "events": events},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 202, answer.text
    sign_in(client, plaintext(tokens, "viewer"))
    page = client.get(_job_page(job_id)).text
    section = page[page.index('id="progress"') : page.index("<h2>Timeline</h2>")]
    assert "TRAINING" in section
    assert "14 · loss 0.2" in section
    assert "step 14, 2.0 MiB in 0.50 s" in section
    assert "from step 10 of an earlier run" in section
    # a resume reported without its binding: the lineage says so rather than guess
    assert '<li class="verdict-not-reported">binding: not reported</li>' in section
    points = re.search(r'<polyline[^>]*points="([^"]+)"', section)
    assert points is not None
    assert len(points.group(1).split()) == 5  # one point per reported step
    assert "loss by step" in section
    # the checkpoint at step 14 and the resume from step 10 are marked where they fall:
    # the step axis runs 10..14 across the plot
    marks = re.findall(r'<line class="mark mark-(\w+)" x1="([\d.]+)"', section)
    assert marks == [("resume", "72.0"), ("checkpoint", "620.0")]
    assert '<path class="mark mark-last-checkpoint" d="M620.0 ' in section
    table = section[section.index('id="checkpoints"') :]
    cells = r"<td>14</td><td class=\"nowrap\">2.0 MiB</td><td class=\"nowrap\">0.50 s</td>"
    assert re.search(cells + r"<td>[^<]*" + pod, table)
    assert "Show all" not in section  # one checkpoint: nothing folded


def test_a_job_that_never_reported_has_no_progress_card(client: TestClient, tokens: Tokens) -> None:
    job_id = submitted(client, tokens)
    sign_in(client, plaintext(tokens, "viewer"))
    assert 'id="progress"' not in client.get(_job_page(job_id)).text


def _report(
    client: TestClient, job_id: str, pod: str, token: str, events: list[dict[str, Any]]
) -> None:
    for start in range(0, len(events), 100):  # the API takes 100 events a batch
        answer = client.post(
            f"/api/v1/jobs/{job_id}/reports",
            json={"pod": pod, "events": events[start : start + 100]},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 202, answer.text


def _trained(first: int, last: int, seq: int) -> list[dict[str, Any]]:
    """Steps first..last as the tiny training reports them: the loss falling 2.5 decades
    over 200 steps, the learning rate halved every 20, a checkpoint every 5 steps."""
    events: list[dict[str, Any]] = []
    for step in range(first, last + 1):
        metrics = {"loss": 3.85 * 10 ** (-2.5 * step / 200), "lr": 0.05 * 0.5 ** (step // 20)}
        events.append({"type": "step", "step": step, "metrics": metrics})
        if step % 5 == 0:
            events.append(
                {"type": "checkpoint", "step": step, "sizeBytes": 18_022, "durationSeconds": 0.01}
            )
    return [
        {"seq": seq + i, "time": YESTERDAY.format(0), **event} for i, event in enumerate(events)
    ]


def test_a_resumed_run_s_chart_has_axes_and_ticks_and_its_checkpoints_fold(
    client: TestClient, tokens: Tokens, db: Database, reviewer: FakeReviewer
) -> None:
    """200 steps checkpointed every 5, resumed at step 60 by another Pod: issue 34's run."""
    from kubetrain.domain.manifest import job_name

    job_id = submitted(client, tokens)
    one, two = f"{job_name(job_id)}-aaaaa", f"{job_name(job_id)}-bbbbb"
    first = enrol(db, reviewer, job_id, "aaaaa", namespace=PROJECT_NAMESPACE)
    _report(client, job_id, one, first, _trained(1, 63, 0))  # killed after its checkpoint at 60
    # The syncer records attempt 2's Pod: the current attempt, which alone reports now.
    second = enrol(db, reviewer, job_id, "bbbbb", namespace=PROJECT_NAMESPACE)
    resumed = {"seq": 0, "time": YESTERDAY.format(0), "type": "resumed", "fromStep": 60}
    _report(client, job_id, two, second, [resumed, *_trained(61, 200, 1)])
    sign_in(client, plaintext(tokens, "viewer"))
    page = client.get(_job_page(job_id)).text
    section = page[page.index('id="progress"') : page.index("<h2>Logs")]

    main = section[section.index('<svg class="plot" id="chart-main"') :]
    main = main[: main.index("</svg>")]
    # Axis titles, the loss on a log scale (it spans 2.5 decades), round tick labels.
    titles = re.findall(r'<text class="axis-title"[^>]*>([^<]+)</text>', main)
    assert titles == ["loss (log scale)", "step"]
    labels = re.findall(r'<text class="tick-label"[^>]*>([^<]+)</text>', main)
    assert labels == ["0.01", "0.1", "1", "10", "0", "50", "100", "150", "200"]
    assert 'data-scale="log"' in main
    # Text for screen readers: a title and a description the image is labelled by.
    assert 'role="img" aria-labelledby="chart-main-title chart-main-desc"' in main
    desc = re.search(r'<desc id="chart-main-desc">([^<]+)</desc>', main)
    assert desc is not None
    assert "steps 1 to 200, log scale" in desc.group(1)
    said = "Resumed from the checkpoint of step 60. 40 checkpoints saved, the last at step 200."
    assert said in desc.group(1)
    # The checkpoints are short ticks on the step axis; the last and the resume apart.
    ticks = re.findall(r'<line class="mark mark-checkpoint"[^>]*y1="([\d.]+)" y2="([\d.]+)"', main)
    assert len(ticks) == 40
    assert all(float(y2) - float(y1) <= 8 for y1, y2 in ticks)
    assert re.findall(r'class="mark mark-resume"[^>]*data-step="(\d+)"', main) == ["60"]
    assert re.findall(r'class="mark mark-last-checkpoint"[^>]*data-step="(\d+)"', main) == ["200"]
    assert "resumed from step 60</text>" in main
    # The learning rate: a small chart of its own, with its own axis.
    rate = section[section.index('<svg class="plot" id="chart-rate"') :]
    rate = rate[: rate.index("</svg>")]
    assert re.findall(r'<text class="axis-title"[^>]*>([^<]+)</text>', rate) == [
        "learning rate (log scale)",
        "step",
    ]

    # Folded: the newest three and the one attempt 2 resumed from open, the rest behind
    # "Show all 40".
    shown = section[section.index('<table class="checkpoints" id="checkpoints">') :]
    shown = shown[: shown.index("</table>")]
    assert re.findall(r"<tr[^>]*><td>(\d+)", shown) == ["200", "195", "190", "60"]
    assert '<tr class="resumed-from"><td>60 <span class="chip chip-active">' in shown
    assert "Show all 40 checkpoints (36 more, older)" in section
    folded = section[section.index('<details class="more-checkpoints"') :]
    assert len(re.findall(r"<tr[^>]*><td>\d+", folded[: folded.index("</details>")])) == 36
    assert "step 200, 17.6 KiB in 0.01 s; 40 checkpoints saved" in section

    # The CLI's words come from the same functions: the API gives it the count too.
    detail = client.get(f"/api/v1/projects/{PROJECT}/jobs/{job_id}", headers=tokens("viewer"))
    assert detail.json()["progress"]["checkpoints"] == 40
