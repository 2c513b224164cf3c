"""The dashboard's routes under /ui: sign-in, jobs, one job, nodes, quotas, Kueue's
queues and (for admins) GPU usage.

Access is the REST API's, checked by the same functions (api/auth.py) on the
same stored token: a session names its token, and each request reloads it.
A refusal is an HTML page with the API's status (401 becomes the sign-in
page), never a traceback. Every page with live data renders its `live` block
alone when asked with `?fragment=live`; dashboard.js swaps it in every few
seconds, so the page refreshes without a reload.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, urlencode

import yaml
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from kubetrain.api.auth import require_job_access, require_project, visible_namespaces
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.jobs import cancel_job, progress_view
from kubetrain.api.logs import read_tail
from kubetrain.api.principal import Action, Principal
from kubetrain.api.problems import ProblemError
from kubetrain.api.queues import queue_boards, queues_view
from kubetrain.api.schemas import HistoryEntry, JobDetail, JobStatus
from kubetrain.api.usage import usage_answer
from kubetrain.api.web import chart as charts
from kubetrain.api.web import views
from kubetrain.api.web.sessions import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SESSION_SECONDS,
    SIGNIN_COOKIE,
    SIGNIN_SECONDS,
    SessionSigner,
    WebSession,
    same_secret,
)
from kubetrain.domain import facts
from kubetrain.domain.inventory import inventory
from kubetrain.domain.manifest import render_job
from kubetrain.domain.reasons import CATALOG
from kubetrain.domain.snapshot import Snapshot, SnapshotError
from kubetrain.domain.spec import SpecError, TrainingJob
from kubetrain.domain.states import TERMINAL, BusinessState, ReasonCode
from kubetrain.store import (
    ALL_PROJECTS,
    authenticate_token,
    checkpoint_reports,
    close_web_session,
    count_jobs,
    current_attempts,
    get_attempt,
    get_job,
    job_history,
    list_attempts,
    list_jobs,
    list_projects,
    list_unfinished_jobs,
    open_web_session,
    resolve_job_dataset,
    step_series,
    web_session_token,
)

PAGE_SIZE = 200  # jobs on one page; the filters narrow a larger project
LIVE_SECONDS = 5  # how often dashboard.js refreshes a page's live block
FORM_TYPE = "application/x-www-form-urlencoded"

# Scripts and styles from our own origin only, no inline code: an injection that
# escaped the templates' escaping still could not run (defence in depth).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",  # pages carry a project's data
}

router = APIRouter(prefix="/ui", include_in_schema=False)
ENV = Environment(
    loader=PackageLoader("kubetrain.api.web", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.globals.update(
    reason_words=views.reason_words,
    state_class=views.state_class,
    checkpoint_words=facts.checkpoint_words,
    phase_fact=facts.phase_fact,
    dropped_words=facts.dropped_words,
    clock=facts.clock,
    reason_class=views.reason_class,
    catalog=CATALOG,
    states=list(BusinessState),
    reasons=list(ReasonCode),
    live_seconds=LIVE_SECONDS,
    csrf_field=CSRF_FIELD,
    admin_action=Action.ADMIN,
)

# "{{ total | counted("job") }}": "1 job", "2 jobs" (Jinja's own `count` is `length`).
ENV.filters["counted"] = facts.count

Context = Annotated[ApiContext, Depends(get_context)]


class SignInRequired(Exception):
    """No valid session: the handler answers with the sign-in page's address."""

    def __init__(self, back_to: str) -> None:
        super().__init__(back_to)
        self.back_to = back_to


class PageRefusal(Exception):
    """A refusal shown as an HTML page with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Viewer:
    principal: Principal
    session: WebSession

    @property
    def projects_label(self) -> str:
        p = self.principal.project
        return "all projects" if p == ALL_PROJECTS else f"project {p}"


def _now() -> datetime:
    return datetime.now(UTC)


def _signer(request: Request) -> SessionSigner:
    signer: SessionSigner = request.app.state.web_signer
    return signer


def _here(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def viewer(request: Request, context: Context) -> Viewer:
    """The signed-in caller, from the session cookie and the stored token."""
    session = _signer(request).read(request.cookies.get(SESSION_COOKIE), now=int(time.time()))
    if session is None:
        raise SignInRequired(_here(request))
    with context.db.read_only() as db:
        token = web_session_token(db, session.session_id)
        if token is None:  # signed out, or the token revoked since sign-in
            raise SignInRequired(_here(request))
        principal = Principal(
            token_id=token.id, name=token.name, role=token.role, project=token.project
        )
    return Viewer(principal, session)


Signed = Annotated[Viewer, Depends(viewer)]


def _allowed(check: Callable[[], None]) -> None:
    """Run one of api/auth's checks; its refusal becomes the same status as a page."""
    try:
        check()
    except ProblemError as exc:
        raise PageRefusal(exc.status, exc.detail or exc.title) from None


async def form(request: Request) -> dict[str, str]:
    """A urlencoded form body (the pages' forms send nothing else)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if body and media != FORM_TYPE:
        raise PageRefusal(415, f"the form must be sent as {FORM_TYPE}")
    return dict(parse_qsl(body, keep_blank_values=True))


Form = Annotated[dict[str, str], Depends(form)]


def _check_csrf(signed: Viewer, fields: dict[str, str]) -> None:
    if not same_secret(signed.session.csrf, fields.get(CSRF_FIELD)):
        raise PageRefusal(403, "the form is stale or was not sent by this site: reload and retry")


def render(request: Request, name: str, *, status: int = 200, **values: Any) -> HTMLResponse:
    """A page, or only its `live` block for `?fragment=live`."""
    template = ENV.get_template(name)
    values.setdefault("viewer", None)
    values["path"] = request.url.path
    if request.query_params.get("fragment") == "live" and "live" in template.blocks:
        html = "".join(template.blocks["live"](template.new_context(values)))
    else:
        html = template.render(values)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _covered_projects(context: ApiContext, principal: Principal) -> list[str]:
    if principal.project != ALL_PROJECTS:
        return [principal.project]
    with context.db.read_only() as db:
        return list_projects(db)


# -- sign-in -----------------------------------------------------------------------


def _signin_page(request: Request, *, status: int = 200, error: str | None = None) -> Response:
    csrf = request.cookies.get(SIGNIN_COOKIE) or ""
    fresh = not _signer(request).signin_is_valid(csrf, now=int(time.time()))
    if fresh:
        csrf = _signer(request).issue_signin(now=int(time.time()))
    back_to = request.query_params.get("next", "")
    response = render(
        request, "signin.html", status=status, csrf=csrf, error=error, back_to=_local(back_to)
    )
    if fresh:
        _set_cookie(request, response, SIGNIN_COOKIE, csrf, max_age=SIGNIN_SECONDS)
    return response


def _local(target: str) -> str:
    """Only a path of this dashboard: `next` must not send a user elsewhere."""
    return target if target.startswith("/ui/") and not target.startswith("//") else "/ui/"


def _set_cookie(
    request: Request, response: Response, name: str, value: str, *, max_age: int
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/ui",
        httponly=True,
        secure=request.url.scheme == "https",
        samesite="lax",
    )


@router.get("/signin")
def signin_form(request: Request) -> Response:
    return _signin_page(request)


def _from_elsewhere(request: Request) -> bool:
    """Whether the browser says the form was posted from another site. Browsers set
    these headers themselves, so no page elsewhere can choose them."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    if origin is None:
        return False
    return origin != f"{request.url.scheme}://{request.url.netloc}"


@router.post("/signin")
def signin(request: Request, fields: Form, context: Context) -> Response:
    cookie = request.cookies.get(SIGNIN_COOKIE)
    if (
        _from_elsewhere(request)
        or not _signer(request).signin_is_valid(cookie, now=int(time.time()))
        or not same_secret(cookie or "", fields.get(CSRF_FIELD))
    ):
        return _signin_page(
            request, status=403, error="the sign-in form expired; it has been renewed, try again"
        )
    plaintext = fields.get("token", "").strip()
    if not plaintext:
        return _signin_page(request, status=422, error="token: paste an API token")
    with context.db.transaction() as db:
        token = authenticate_token(db, plaintext)
        session_id = (
            open_web_session(db, token.id, lifetime=timedelta(seconds=SESSION_SECONDS))
            if token is not None
            else None
        )
    if session_id is None:
        return _signin_page(request, status=401, error="token: unknown or revoked")
    value, _ = _signer(request).issue(session_id, now=int(time.time()))
    response = RedirectResponse(_local(fields.get("next", "")), status_code=303)
    _set_cookie(request, response, SESSION_COOKIE, value, max_age=SESSION_SECONDS)
    response.delete_cookie(SIGNIN_COOKIE, path="/ui")
    return response


@router.post("/signout")
def signout(request: Request, signed: Signed, fields: Form, context: Context) -> Response:
    _check_csrf(signed, fields)
    # Server-side: the cookie, replayed, names a session that no longer exists.
    with context.db.transaction() as db:
        close_web_session(db, signed.session.session_id)
    response = RedirectResponse("/ui/signin", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/ui")
    return response


# -- jobs --------------------------------------------------------------------------


@router.get("/")
def home(request: Request, signed: Signed, context: Context) -> Response:
    projects = _covered_projects(context, signed.principal)
    if len(projects) == 1:
        return RedirectResponse(f"/ui/projects/{quote(projects[0], safe='')}/jobs", 303)
    return render(request, "home.html", viewer=signed, projects=projects)


def _filters(request: Request) -> tuple[list[BusinessState], list[ReasonCode]]:
    """The page's ?state= and ?reason= filters; a value that is none is a 422 naming it."""
    states, reasons = [], []
    for value in request.query_params.getlist("state"):
        if not value:
            continue
        try:
            states.append(BusinessState(value))
        except ValueError:
            raise PageRefusal(422, f"state: {value!r} is not a business state") from None
    for value in request.query_params.getlist("reason"):
        if not value:
            continue
        try:
            reasons.append(ReasonCode(value))
        except ValueError:
            raise PageRefusal(422, f"reason: {value!r} is not a reason code") from None
    return states, reasons


def _since(job: JobStatus, diagnosis: dict[str, Any] | None) -> datetime:
    since = views.parse_time((diagnosis or {}).get("since"))
    return since or job.updated_at


def _gpus(spec: dict[str, Any]) -> str:
    return views.gpu_shape(spec)


@router.get("/projects/{project}/jobs")
def jobs_page(request: Request, project: str, signed: Signed, context: Context) -> Response:
    _allowed(lambda: require_project(signed.principal, project, Action.READ, context.settings))
    states, reasons = _filters(request)
    now = _now()
    with context.db.read_only() as db:
        page = list_jobs(db, project, states=states, reasons=reasons, limit=PAGE_SIZE)
        attempts = current_attempts(db, page.jobs)
        rows = [
            {
                "job": status,
                "since": facts.age(_since(status, job.diagnosis), now),
                "gpus": _gpus(job.spec),
            }
            for job in page.jobs
            for status in [JobStatus.of(job, attempts.get(job.id))]
        ]
        counts = views.reason_counts(count_jobs(db, project))
    return render(
        request,
        "jobs.html",
        viewer=signed,
        project=project,
        projects=_covered_projects(context, signed.principal),
        rows=rows,
        more=page.next_cursor is not None,
        counts=counts,
        total=sum(c.count for c in counts),
        chosen_states=[s.value for s in states],
        chosen_reasons=[r.value for r in reasons],
        filter_query=urlencode(
            [("state", s.value) for s in states] + [("reason", r.value) for r in reasons]
        ),
        updated=now.strftime("%H:%M:%S UTC"),
    )


def _manifest(context: ApiContext, db: Any, job: Any) -> str:
    try:
        training_job = TrainingJob.model_validate(job.spec)
        dataset = resolve_job_dataset(db, training_job.spec.dataset)
    except (SpecError, ValueError) as exc:
        return f"# cannot be rendered: {exc}"
    rendered = render_job(
        job.id,
        training_job,
        job.namespace,
        dataset=dataset,
        options=context.settings.render_options(),
    )
    return yaml.safe_dump(rendered, sort_keys=False, allow_unicode=True)


def _job_data(context: ApiContext, project: str, job_id: str) -> dict[str, Any]:
    """What the job page shows from the database (a worker thread's read)."""
    with context.db.read_only() as db:
        job = get_job(db, project, job_id)
        if job is None:
            raise PageRefusal(404, f"no job {job_id!r} in project {project!r}")
        attempt = get_attempt(db, job.id, job.current_attempt) if job.current_attempt else None
        detail = JobDetail.of(job, attempt, progress_view(db, job.id))
        steps = [(r.data["step"], r.data.get("metrics") or {}) for r in step_series(db, job.id)]
        saved = [(r.pod, r.data, r.reported_at) for r in checkpoint_reports(db, job.id)]
        attempts = {a.pod_name: a.number for a in list_attempts(db, job.id) if a.pod_name}
        history = [HistoryEntry.of(row) for row in job_history(db, project, job.id)]
        manifest = _manifest(context, db, job)
        if attempt is not None:
            db.expunge(attempt)  # the logs panel reads it after the session
        return {
            "detail": detail,
            "attempt": attempt,
            "namespace": job.namespace,
            "steps": steps,
            "saved": saved,
            "attempts": attempts,
            "history": history,
            "manifest": manifest,
        }


@router.get("/projects/{project}/jobs/{job_id}")
async def job_page(
    request: Request, project: str, job_id: str, signed: Signed, context: Context
) -> Response:
    _allowed(
        lambda: require_job_access(signed.principal, project, job_id, Action.READ, context.settings)
    )
    now = _now()
    data = await run_in_threadpool(_job_data, context, project, job_id)
    detail: JobDetail = data["detail"]
    saved = data["saved"]
    # async: the Pod's log is read on the event loop, where the cluster client lives.
    log_tail = await read_tail(context, data["namespace"], data["attempt"])
    diagnosis = detail.diagnosis or {}
    resumes = detail.progress.resumes if detail.progress else []
    last = detail.progress.checkpoint if detail.progress else None
    may_cancel = signed.principal.may(Action.CANCEL) and detail.business_status not in TERMINAL
    return render(
        request,
        "job.html",
        viewer=signed,
        project=project,
        projects=await run_in_threadpool(_covered_projects, context, signed.principal),
        job=detail,
        diagnosis=diagnosis,
        reason=CATALOG[detail.reason],
        since=facts.age(_since(detail, detail.diagnosis), now),
        timeline=views.timeline(data["history"]),
        progress=detail.progress,
        chart=charts.progress_chart(
            data["steps"],
            checkpoints=[int(d["step"]) for _, d, _ in saved],
            resumes=[r.from_step for r in resumes],
            last_checkpoint=(last or {}).get("step"),
        ),
        checkpoints=views.fold_checkpoints(
            views.checkpoint_rows(saved, data["attempts"]),
            [(r.from_step, r.from_pod) for r in resumes],
        ),
        logs=log_tail,
        manifest=data["manifest"],
        gpus=_gpus(detail.spec),
        may_cancel=may_cancel,
        updated=now.strftime("%H:%M:%S UTC"),
    )


@router.post("/projects/{project}/jobs/{job_id}/cancel")
def cancel_page(
    request: Request, project: str, job_id: str, signed: Signed, fields: Form, context: Context
) -> Response:
    _check_csrf(signed, fields)
    principal = signed.principal
    _allowed(
        lambda: require_job_access(principal, project, job_id, Action.CANCEL, context.settings)
    )
    try:
        cancel_job(context, principal, project, job_id, via="the web dashboard")
    except ProblemError as exc:
        raise PageRefusal(exc.status, exc.detail or exc.title) from None
    target = f"/ui/projects/{quote(project, safe='')}/jobs/{quote(job_id, safe='')}"
    return RedirectResponse(target, status_code=303)


# -- the cluster -------------------------------------------------------------------


def waiting_gpu_demand(signed: Signed, context: Context) -> dict[str, int]:
    """GPUs asked for by the caller's projects' jobs that wait (CREATED or QUEUED)."""
    project = signed.principal.project
    with context.db.read_only() as db:
        jobs = list_unfinished_jobs(db, project=None if project == ALL_PROJECTS else project)
        specs = [job.spec for job in jobs if job.business_state != BusinessState.RUNNING]
    return views.gpu_demand(specs)


def _listing(context: ApiContext) -> dict[str, Any] | None:
    return context.cluster() if context.cluster is not None else None


NO_CLUSTER = (
    "this server does not watch the cluster (it runs no control loops, or they have not "
    "finished their first list yet); the replica that runs them shows this page"
)


# async: the watch caches change on the event loop's thread, so they are read there.
@router.get("/nodes")
async def nodes_page(
    request: Request,
    signed: Signed,
    context: Context,
    demand: Annotated[dict[str, int], Depends(waiting_gpu_demand)],
) -> Response:
    listing = _listing(context)
    groups: list[views.NodeGroup] = []
    pending: list[Any] = []
    problems: list[str] = []
    if listing is not None:
        try:
            found = inventory(Snapshot.from_list(listing))
        except SnapshotError as exc:
            raise PageRefusal(503, f"the cluster's objects cannot be read: {exc}") from None
        groups = views.node_groups(found, demand)
        seen = visible_namespaces(signed.principal, context.settings)
        pending = [p for p in found.pending if seen is None or p.namespace in seen]
        problems = list(found.problems[:20])
    return render(
        request,
        "nodes.html",
        viewer=signed,
        projects=await run_in_threadpool(_covered_projects, context, signed.principal),
        watching=listing is not None,
        no_cluster=NO_CLUSTER,
        groups=groups,
        pending=pending,
        untyped_demand=demand.get("", 0),
        problems=problems,
        updated=_now().strftime("%H:%M:%S UTC"),
    )


@router.get("/quotas")
async def quotas_page(request: Request, signed: Signed, context: Context) -> Response:
    listing = _listing(context)
    quotas = []
    if listing is not None:
        quotas = views.quotas(
            listing.get("items", []), visible_namespaces(signed.principal, context.settings)
        )
    return render(
        request,
        "quotas.html",
        viewer=signed,
        projects=await run_in_threadpool(_covered_projects, context, signed.principal),
        watching=listing is not None,
        no_cluster=NO_CLUSTER,
        quotas=quotas,
        updated=_now().strftime("%H:%M:%S UTC"),
    )


@router.get("/queues")
async def queues_page(request: Request, signed: Signed, context: Context) -> Response:
    listing = _listing(context)
    answer = None
    if listing is not None:
        boards = queue_boards(
            listing, visible_namespaces(signed.principal, context.settings), datetime.now(UTC)
        )
        answer = await run_in_threadpool(queues_view, context, boards, signed.principal)
    queues = answer.cluster_queues if answer is not None else []
    return render(
        request,
        "queues.html",
        viewer=signed,
        projects=await run_in_threadpool(_covered_projects, context, signed.principal),
        watching=listing is not None,
        no_cluster=NO_CLUSTER,
        queues=queues,
        cards=views.queue_cards(queues),
        age=lambda moment: facts.age(moment, _now()),
        updated=_now().strftime("%H:%M:%S UTC"),
    )


# -- GPU usage ---------------------------------------------------------------------

# The windows the Usage page offers: ?since= value -> (words, how far back).
USAGE_WINDOWS: dict[str, tuple[str, timedelta | None]] = {
    "": ("since the start", None),
    "30d": ("the last 30 days", timedelta(days=30)),
    "7d": ("the last 7 days", timedelta(days=7)),
    "24h": ("the last 24 hours", timedelta(hours=24)),
}


@router.get("/usage")
def usage_page(request: Request, signed: Signed, context: Context) -> Response:
    """GPU-hours per project and GPU type: the usage endpoint's answer for every project
    the caller's token covers, which takes an admin (as the endpoint does)."""
    window = request.query_params.get("since", "")
    if window not in USAGE_WINDOWS:
        raise PageRefusal(422, f"since: {window!r} is not one of 24h, 7d, 30d")
    words, back = USAGE_WINDOWS[window]
    since = _now() - back if back is not None else None
    try:
        answer = usage_answer(context, signed.principal, project=None, since=since)
    except ProblemError as exc:
        raise PageRefusal(exc.status, exc.detail or exc.title) from None
    return render(
        request,
        "usage.html",
        viewer=signed,
        projects=_covered_projects(context, signed.principal),
        usage=answer,
        bars=views.usage_bars(answer.items),
        windows=[(key, label) for key, (label, _) in USAGE_WINDOWS.items()],
        window=window,
        window_words=words,
        updated=_now().strftime("%H:%M:%S UTC"),
    )
