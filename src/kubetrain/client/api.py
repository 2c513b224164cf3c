"""`kubetrain.Client`: kubetrain's HTTP API from Python, and the CLI's one client.

```python
from kubetrain import Client

client = Client()                        # KUBETRAIN_URL, KUBETRAIN_TOKEN, the config file
job = client.submit("job.yaml", project="ml-team")
job = client.wait(job.id, timeout=3600)  # until SUCCEEDED or FAILED
print(job.state, job.reason, client.why(job.id).explanation)
```

A job is named by its id or by its name (the newest job of that name in the
project). Every failure is one of kubetrain's errors (kubetrain/client/errors.py):
`ApiError` carries the server's RFC 9457 problem. Settings are the CLI's
(kubetrain/client_settings.py): an argument, else `KUBETRAIN_*`, else the config
file's `[client]` table. One Client keeps one connection; it is not for several
threads at once (make one per thread).

Importing this takes the standard library only (the CLI's start-up depends on it,
tests/unit/test_cli_main.py); `submit` loads the TrainingJob models (pydantic) to
check a document before sending it, naming the field it refuses.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote

from kubetrain import __version__
from kubetrain.client import _http
from kubetrain.client.errors import ApiError, ClientError, JobEnded, NotFound, WaitTimeout
from kubetrain.client.results import TERMINAL_STATES, Diagnosis, HistoryEntry, Job, Usage
from kubetrain.client_settings import ClientSettings, describe_invalid

if TYPE_CHECKING:
    from kubetrain.domain.spec import TrainingJob

__all__ = ["Client", "Reply"]

# Job ids are UUIDs; anything else that names a job is its name.
_JOB_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
PAGE_SIZE = 500  # the API's largest page
STATES = ("CREATED", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


class Reply(NamedTuple):  # not a dataclass: `dataclasses` alone is a tenth of the CLI's start
    status: int
    body: Any


class Client:
    """kubetrain's API: jobs submitted, read, waited for, explained, cancelled; logs; usage.

    `url`, `token`, `project` (the default of every method's `project=`) and
    `timeout` (seconds for connecting and for each read) default to KUBETRAIN_URL,
    KUBETRAIN_TOKEN, KUBETRAIN_PROJECT, KUBETRAIN_TIMEOUT, then the config file
    (`kubetrain/config.toml` under XDG_CONFIG_HOME, or KUBETRAIN_CONFIG).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        project: str | None = None,
        timeout: float | None = None,
        user_agent: str = f"kubetrain-python/{__version__}",
    ) -> None:
        try:
            settings = ClientSettings.load(url=url, token=token, project=project, timeout=timeout)
        except ValueError as exc:  # pydantic's ValidationError too, worded as the CLI does
            raise ClientError(describe_invalid(exc, "client")) from None
        secret = settings.token.get_secret_value() if settings.token is not None else ""
        if not secret:
            raise ClientError(
                "no API token: set KUBETRAIN_TOKEN (an admin makes one with "
                "`kubetrain token create`)"
            )
        if not (secret.isascii() and secret.isprintable()) or " " in secret:
            # Said without the value: an error message must not show a credential.
            raise ClientError(
                "KUBETRAIN_TOKEN is not a token: it holds a space, a line break or a "
                "character other than ASCII"
            )
        self.url = settings.url.rstrip("/")
        self.project = settings.project
        self.timeout = settings.timeout
        try:
            self._http = _http.Client(
                self.url,
                timeout=settings.timeout,
                headers={
                    "Authorization": f"Bearer {secret}",
                    "Accept": "application/json, application/problem+json",
                    "User-Agent": user_agent,
                },
            )
        except ValueError as exc:
            raise ClientError(
                f"the kubetrain server's URL {exc} (KUBETRAIN_URL, --url or the config file)"
            ) from None

    def __repr__(self) -> str:
        return f"Client(url={self.url!r}, project={self.project!r})"  # never the token

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the next request opens another)."""
        self._http.close()

    # -- jobs -------------------------------------------------------------------

    def submit(
        self,
        document_or_path: Mapping[str, Any] | str | os.PathLike[str],
        project: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Job:
        """Submit a TrainingJob: a document (a dict as the YAML reads), a path to its YAML
        file, or YAML text (a string with a line break). `project` (else the client's)
        fills a missing `metadata.project` and must equal one that is given. Checked
        here first: a document that is not valid raises SpecError naming each field
        (`problems`), before any request; what the server refuses raises ApiError.
        With `idempotency_key`, submitting again returns the first job.
        """
        # Here: the TrainingJob models (pydantic) are for submit alone, not the reads.
        from kubetrain.domain.spec import parse_training_job, parse_training_job_yaml

        project = project or self.project
        if isinstance(document_or_path, Mapping):
            job = parse_training_job(dict(document_or_path), project=project)
        else:
            job = parse_training_job_yaml(_read(document_or_path), project=project)
        return Job(self.submit_checked(job, idempotency_key=idempotency_key).body)

    def submit_checked(
        self, job: TrainingJob, *, idempotency_key: str | None = None, dry_run: bool = False
    ) -> Reply:
        """POST a TrainingJob already checked (domain.spec's model): the reply, 201 for
        a new job, 200 for one submitted before with the same idempotency key; with
        `dry_run`, 200 and the forecast of what the job would meet (nothing written)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        params = {"dryRun": "All"} if dry_run else None
        path = self.jobs_path(job.metadata.project)
        return self.request(
            "POST", path, json=job.model_dump(mode="json"), headers=headers, params=params
        )

    def get(self, name_or_id: str, project: str | None = None) -> Job:
        """One job in full: state, reason, runtime, spec, diagnosis, progress, GPU time."""
        project = self._project(project)
        found = self._find(project, name_or_id)
        if "spec" not in found:  # found by name: a listing's entry
            found = self.request("GET", self.job_path(project, found["id"])).body
        return Job(found)

    def jobs(
        self,
        project: str | None = None,
        state: str | Iterable[str] | None = None,
        *,
        reason: str | Iterable[str] | None = None,
        name: str | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """A project's jobs, newest first: every one (following the pages), or the newest
        `limit`; only those in `state` (one or several), of `reason`, named `name`."""
        project = self._project(project)
        if limit is not None and limit < 1:
            raise ValueError("limit must be 1 or more")
        items = self.list_jobs(
            project, limit=limit, state=_several(state), reason=_several(reason), name=name
        )
        return [Job(item) for item in items]

    def wait(
        self,
        name_or_id: str,
        project: str | None = None,
        until: str | Iterable[str] = ("SUCCEEDED", "FAILED"),
        timeout: float | None = 600.0,
        *,
        poll_interval: float = 2.0,
    ) -> Job:
        """Until the job's state is one of `until`; the job then, in full.

        Raises WaitTimeout (a TimeoutError) after `timeout` seconds (None: no limit),
        and JobEnded when the job ends in a state not in `until` (a CANCELLED job
        waited for until SUCCEEDED or FAILED), each with the job as last seen.
        """
        wanted = frozenset(_several(until) or ())
        if not wanted or not wanted <= set(STATES):
            raise ValueError(f"until: give states among {', '.join(STATES)}, not {until!r}")
        if poll_interval <= 0:
            raise ValueError("poll_interval: give a number of seconds above 0")
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.get(name_or_id, project)
        while True:
            if job.state in wanted:
                return job
            if job.state in TERMINAL_STATES:
                raise JobEnded(
                    f"job {job.name} ({job.id}) ended {job.state}/{job.reason}, not "
                    f"{' or '.join(sorted(wanted))}",
                    job,
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"job {job.name} ({job.id}) is still {job.state}/{job.reason} after "
                    f"{timeout:g} s, not {' or '.join(sorted(wanted))}",
                    job,
                )
            pause = poll_interval
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)
            job = Job(self.request("GET", self.job_path(job.project, job.id)).body)

    def why(self, name_or_id: str, project: str | None = None) -> Diagnosis:
        """Why the job is or is not running: the syncer's latest diagnosis. NotFound
        (a 404 problem) until it has made one."""
        project = self._project(project)
        found = self._find(project, name_or_id)
        body = self.request("GET", self.job_path(project, found["id"]) + "/diagnosis").body
        if not isinstance(body, dict):
            raise ClientError("the server answered a diagnosis that is not an object")
        return Diagnosis(body, job_id=found["id"])

    def cancel(self, name_or_id: str, project: str | None = None) -> Job:
        """Cancel the job (its Kubernetes Job is deleted); cancelling again changes
        nothing. ApiError (409) for a job that has SUCCEEDED or FAILED."""
        project = self._project(project)
        found = self._find(project, name_or_id)
        return Job(self.request("POST", self.job_path(project, found["id"]) + "/cancel").body)

    def history(self, name_or_id: str, project: str | None = None) -> list[HistoryEntry]:
        """Every change of the job's state, oldest first."""
        project = self._project(project)
        found = self._find(project, name_or_id)
        body = self.request("GET", self.job_path(project, found["id"]) + "/history").body
        return [HistoryEntry(item) for item in body["items"]]

    def logs(
        self,
        name_or_id: str,
        project: str | None = None,
        follow: bool = False,
        attempt: int | None = None,
        worker: int | None = None,
        *,
        tail: int | None = None,
        since: str | timedelta | None = None,
        timestamps: bool = False,
    ) -> Iterator[str]:
        """The job's output, line by line (without the line break): the newest attempt's,
        or `attempt`'s; a gang's `worker` (rank). `follow` keeps reading until the
        container ends. The request is made here: a refusal (409 on a fake node, 410
        when the Pod is gone, with its termination message) raises now, not while
        iterating."""
        chunks = self.log_chunks(
            name_or_id,
            project,
            follow=follow,
            attempt=attempt,
            worker=worker,
            tail=tail,
            since=since,
            timestamps=timestamps,
        )
        return _lines(chunks)

    def log_chunks(
        self,
        name_or_id: str,
        project: str | None = None,
        *,
        follow: bool = False,
        attempt: int | None = None,
        worker: int | None = None,
        tail: int | None = None,
        since: str | timedelta | None = None,
        timestamps: bool = False,
    ) -> Iterator[str]:
        """As `logs`, the text as it arrives (pieces of lines), for a terminal."""
        project = self._project(project)
        found = self._find(project, name_or_id)
        params: dict[str, Any] = {
            key: value
            for key, value in (("attempt", attempt), ("worker", worker), ("tail", tail))
            if value is not None
        }
        if since is not None:
            params["since"] = _duration(since)
        if follow:
            params["follow"] = "true"
        if timestamps:
            params["timestamps"] = "true"
        path = self.job_path(project, found["id"]) + "/logs"
        return self.stream_text(path, params=params, follow=follow)

    # -- usage ------------------------------------------------------------------

    def usage(self, project: str | None = None, since: datetime | None = None) -> Usage:
        """GPU-hours per project and GPU type since `since` (a time with its zone; None:
        since the start): of `project`, or without it of every project the token covers
        (that takes an admin token; the client's default project is not used here)."""
        params: dict[str, str] = {}
        if project:
            params["project"] = project
        if since is not None:
            if since.tzinfo is None:
                raise ValueError("since: give a time with its zone (datetime.now(UTC) - ...)")
            params["since"] = since.isoformat()
        return Usage(self.request("GET", "/api/v1/usage", params=params).body)

    # -- the API as it is: what the typed methods and the CLI's commands use --------

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """One request to the API (`path` from `/api/v1/...`): its status and JSON body;
        ApiError for a refusal, ClientError when no answer came."""
        try:
            response = self._http.request(method, path, json=json, params=params, headers=headers)
        except _http.TransportError as exc:
            raise self._failure(exc, "the request to") from None
        if not response.is_success:
            raise ApiError.of(response.status_code, response.content)
        if response.status_code == 204:  # No Content, by definition
            return Reply(204, None)
        try:
            return Reply(response.status_code, response.json())
        except ValueError:
            raise ClientError(
                f"the server at {self.url} answered with something not JSON"
            ) from None

    def stream_text(
        self, path: str, *, params: Mapping[str, Any] | None = None, follow: bool = False
    ) -> Iterator[str]:
        """A text answer, piece by piece as it arrives; the request is made (and a
        refusal raised) now. With `follow`, no read timeout: a quiet log is no failure."""
        stack = ExitStack()
        try:
            with _transport(self, "the stream from"):
                response = stack.enter_context(
                    self._http.stream(
                        "GET", path, params=params, headers={"Accept": "text/plain"}, endless=follow
                    )
                )
                if not response.is_success:
                    answer = response.read()
                    raise ApiError.of(answer.status_code, answer.content)
        except BaseException:
            stack.close()
            raise
        return self._pieces(stack, response)

    def _pieces(self, stack: ExitStack, response: _http.Stream) -> Iterator[str]:
        with stack, _transport(self, "the stream from"):
            yield from response.iter_text()

    @staticmethod
    def jobs_path(project: str) -> str:
        return f"/api/v1/projects/{quote(project, safe='')}/jobs"

    def job_path(self, project: str, job_id: str) -> str:
        return f"{self.jobs_path(project)}/{quote(job_id, safe='')}"

    def list_jobs(
        self, project: str, *, limit: int | None = None, **filters: Any
    ) -> list[dict[str, Any]]:
        """Every matching job as the API's JSON (or the newest `limit`), page after page."""
        jobs: list[dict[str, Any]] = []
        cursor = None
        while limit is None or len(jobs) < limit:
            size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(jobs))
            params = {key: value for key, value in filters.items() if value}
            params["limit"] = size
            if cursor:
                params["cursor"] = cursor
            page = self.request("GET", self.jobs_path(project), params=params).body
            jobs += page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return jobs

    def find(self, name_or_id: str, project: str | None = None) -> dict[str, Any]:
        """The job with that id, else the newest job of that name, as the API's JSON
        (a listing's entry for a name: no spec or diagnosis); NotFound if none."""
        return self._find(self._project(project), name_or_id)

    def _find(self, project: str, ref: str) -> dict[str, Any]:
        if _JOB_ID.fullmatch(ref):
            try:
                job: dict[str, Any] = self.request("GET", self.job_path(project, ref)).body
                return job
            except NotFound:
                pass  # a name that looks like an id
        found = self.list_jobs(project, limit=1, name=ref)
        if not found:
            detail = f"no job named {ref!r} (nor with that id) in project {project!r}"
            problem = {"type": "about:blank", "title": "Not Found", "status": 404, "detail": detail}
            raise NotFound(404, problem, detail)
        return found[0]

    def _project(self, project: str | None) -> str:
        chosen = project or self.project
        if not chosen:
            raise ClientError("no project: pass project= (--project) or set KUBETRAIN_PROJECT")
        return chosen

    def _failure(self, exc: _http.TransportError, what: str) -> ClientError:
        if isinstance(exc, _http.Unreachable):
            return ClientError(
                f"cannot reach the kubetrain server at {self.url} ({exc}); "
                "is it running, and is KUBETRAIN_URL right?"
            )
        if isinstance(exc, _http.TimedOut):
            return ClientError(
                f"the kubetrain server at {self.url} did not answer within {self.timeout:g} s"
            )
        return ClientError(f"{what} {self.url} failed: {exc}")


@contextmanager
def _transport(client: Client, what: str) -> Iterator[None]:
    """Transport failures as the client's ClientError."""
    try:
        yield
    except _http.TransportError as exc:
        raise client._failure(exc, what) from None


def _lines(chunks: Iterator[str]) -> Iterator[str]:
    pending = ""
    for chunk in chunks:
        *complete, pending = (pending + chunk).split("\n")
        yield from complete
    if pending:
        yield pending


def _several(value: str | Iterable[str] | None) -> list[str] | None:
    """One state (reason) or several, as the API's repeated query parameter."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    return [item.upper() for item in items]


def _duration(since: str | timedelta) -> str:
    if isinstance(since, timedelta):
        seconds = int(since.total_seconds())
        if seconds < 1:
            raise ValueError("since: give at least one second")
        return f"{seconds}s"
    return since


def _read(source: str | os.PathLike[str]) -> str:
    """YAML text as given (a string with a line break), else the file it names."""
    if isinstance(source, str) and "\n" in source:
        return source
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ClientError(f"cannot read {source}: {exc}") from None
