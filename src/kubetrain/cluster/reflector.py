"""List+watch of one resource into an in-memory cache, as client-go's reflector does.

List (paginated) gives a consistent view and a resourceVersion; the watch then
streams changes from there, with bookmarks so that a reconnect resumes from a
recent version. A `410 Gone` (the version was compacted away) means events
were lost: we relist, and emit the differences — including deletions that
happened while we were not watching, which a watch alone would never report.

Objects are kept without `metadata.managedFields` (the server-side apply
bookkeeping, nothing kubetrain reads): on a Pod it is a third of the JSON, and
the cache holds every Pod, Job, Node and Event it follows (client-go users drop
it with an informer transform for the same reason).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from sys import intern
from typing import Any

import httpx2 as httpx
import msgspec

from kubetrain.domain.manifest import LABEL_JOB_ID
from kubetrain.metrics import WATCH_CONNECTED, WATCH_EVENTS, WATCH_RELISTS, WATCH_RESTARTS

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Handler = Callable[[str, Obj], Awaitable[None] | None]

# Every watch event and list page is decoded here: the standard library's json took
# ~6 % of the serve process's interpreter through a backlog of 1,000 jobs (profiled),
# msgspec's decoder (lightkube's own dependency) decodes the same objects 2.6x as fast.
# Its DecodeError is a ValueError, which `run` answers with a reconnect, as before.
_decode = msgspec.json.Decoder().decode


@dataclass
class ReflectorStats:
    lists: int = 0
    relists_410: int = 0
    watch_restarts: int = 0
    events: int = 0
    last_error: str | None = None
    connected: bool = False  # the watch stream is open
    failing_since: float | None = None  # monotonic time of the first of consecutive failures


class GoneError(Exception):
    """The watch's resourceVersion is too old (HTTP 410 / Status code 410)."""


@dataclass
class Reflector:
    http: httpx.AsyncClient
    path: str  # e.g. /api/v1/pods or /apis/batch/v1/jobs
    label_selector: str | None = None
    field_selector: str | None = None
    on_event: Handler | None = None
    page_size: int = 500
    watch_timeout: int = 290
    backoff: float = 0.5
    # Injected for tests: how to wait, and a jitter factor in [0, 1).
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    jitter: Callable[[], float] = random.random
    # Keep only what a relist compares (uid, resourceVersion), for a kind
    # whose handler keeps what it needs itself (Events: the cache keeps ours only).
    slim: bool = False
    items: dict[str, Obj] = field(default_factory=dict)  # uid -> object
    resource_version: str | None = None
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    stats: ReflectorStats = field(default_factory=ReflectorStats)

    @property
    def resource(self) -> str:
        """The plural name, as metrics label it: /apis/batch/v1/jobs -> jobs."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def _params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        return params

    async def run(self) -> None:
        """List, then watch forever; relist on 410, reconnect with backoff on errors."""
        delay = self.backoff
        # Resume from a known version (the server replays from its watch cache);
        # only a first start or a 410 needs the full list.
        need_list = self.resource_version is None
        cause = "start"  # why the next list is needed: start, gone (410), error
        while True:
            try:
                if need_list:
                    WATCH_RELISTS.labels(self.resource, cause).inc()
                    await self._list()
                    need_list = False
                await self._watch()
                delay = self.backoff
            except asyncio.CancelledError:
                raise
            except GoneError:
                self.stats.relists_410 += 1
                need_list, cause = True, "gone"
            except (httpx.HTTPError, OSError, ValueError) as exc:
                self.stats.watch_restarts += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                self.stats.failing_since = self.stats.failing_since or time.monotonic()
                WATCH_RESTARTS.labels(self.resource).inc()
                log.warning("watch %s failed, retrying in %.1fs: %s", self.path, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                # A list that failed halfway is redone from scratch.
                if self.resource_version is None:
                    need_list, cause = True, "error"
            finally:
                self.stats.connected = False
                WATCH_CONNECTED.labels(self.resource).set(0)

    async def _list(self) -> None:
        fresh: dict[str, Obj] = {}
        params = {**self._params(), "limit": str(self.page_size)}
        version = None
        delay = self.backoff
        while True:
            resp = await self.http.get(self.path, params=params)
            if resp.status_code == 410:
                # The continue token expired (compaction, or the list was slow): start
                # over, after a jittered backoff, so that many reflectors (or replicas)
                # whose tokens expired together do not relist the cluster at once.
                params.pop("continue", None)
                fresh.clear()
                WATCH_RELISTS.labels(self.resource, "gone").inc()
                await self.sleep(delay * (0.5 + self.jitter()))
                delay = min(delay * 2, 10.0)
                continue
            resp.raise_for_status()
            body = _decode(resp.content)
            for item in body.get("items") or []:
                fresh[item["metadata"]["uid"]] = self._whole(_trimmed(item))
            version = body["metadata"].get("resourceVersion")
            token = body["metadata"].get("continue")
            if not token:
                break
            params["continue"] = token
        old = self.items
        self.items = {uid: self._kept(obj) for uid, obj in fresh.items()}
        self.resource_version = version
        self.stats.lists += 1
        # Emit what changed while we were not watching, deletions included.
        for uid, obj in old.items():
            if uid not in fresh:
                await self._emit("DELETED", obj)
        for uid, obj in fresh.items():
            before = old.get(uid)
            if before is None:
                await self._emit("ADDED", obj)
            elif before["metadata"].get("resourceVersion") != obj["metadata"].get(
                "resourceVersion"
            ):
                await self._emit("MODIFIED", obj)
        self.synced.set()

    async def _watch(self) -> None:
        params = {
            **self._params(),
            "watch": "1",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout),
        }
        if self.resource_version:
            params["resourceVersion"] = self.resource_version
        timeout = httpx.Timeout(10.0, read=self.watch_timeout + 30.0)
        async with self.http.stream("GET", self.path, params=params, timeout=timeout) as resp:
            if resp.status_code == 410:
                raise GoneError
            resp.raise_for_status()
            self.stats.connected, self.stats.failing_since = True, None
            WATCH_CONNECTED.labels(self.resource).set(1)
            async for line in resp.aiter_lines():
                if not line:
                    continue
                event = _decode(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise GoneError
                    raise ValueError(f"watch error: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.resource_version = version
                if kind == "BOOKMARK":
                    continue
                obj = self._whole(_trimmed(obj))
                uid = obj["metadata"]["uid"]
                if kind == "DELETED":
                    self.items.pop(uid, None)
                else:
                    self.items[uid] = self._kept(obj)
                self.stats.events += 1
                WATCH_EVENTS.labels(self.resource).inc()
                await self._emit(kind, obj)

    def stub(self, uid: str) -> None:
        """Keeps only a stub of this object until it changes (its handler is done with it)."""
        obj = self.items.get(uid)
        if obj is not None:
            self.items[uid] = _stub(obj)

    def _whole(self, obj: Obj) -> Obj:
        """An object this reflector keeps whole, with its strings shared (`interned`); a
        slim kind's are handed on as decoded (their handler keeps what it needs)."""
        return obj if self.slim else interned(obj)

    def _kept(self, obj: Obj) -> Obj:
        if not self.slim:
            return obj
        # A slim kind's handler routes a DELETED by its uid alone (bound Pods), or not
        # at all (Events): what a relist compares is all it keeps of each.
        meta = obj["metadata"]
        return {"metadata": {k: meta[k] for k in ("uid", "resourceVersion") if k in meta}}

    async def _emit(self, kind: str, obj: Obj) -> None:
        if self.on_event is None:
            return
        result = self.on_event(kind, obj)
        if result is not None:
            await result


async def served_version(http: httpx.AsyncClient, group: str) -> str | None:
    """The version of API `group` the cluster prefers (its discovery document), or None
    when the cluster serves no such group (a CRD not installed). Discovery is readable by
    every authenticated user (system:discovery): no RBAC rule of kubetrain's grants it."""
    resp = await http.get(f"/apis/{group}")
    if resp.status_code == 404:
        return None
    resp.raise_for_status()
    body = resp.json()
    preferred = (body.get("preferredVersion") or {}).get("version")
    if isinstance(preferred, str) and preferred:
        return preferred
    versions = [v.get("version") for v in body.get("versions") or [] if isinstance(v, dict)]
    return next((v for v in versions if isinstance(v, str) and v), None)


# Enough for a relist to compare and for a handler to route a DELETED: of the labels,
# only the job id the cache routes by (a Pod carries half a dozen of the Job
# controller's, kept for every finished job otherwise).
_STUB_FIELDS = ("uid", "name", "namespace", "resourceVersion")
_STUB_LABELS = (LABEL_JOB_ID,)


def _stub(obj: Obj) -> Obj:
    meta = obj["metadata"]
    kept = {k: meta[k] for k in _STUB_FIELDS if k in meta}
    if isinstance(kept.get("namespace"), str):
        kept["namespace"] = sys.intern(kept["namespace"])  # one string per namespace
    labels = meta.get("labels")
    if isinstance(labels, dict) and (routed := {k: labels[k] for k in _STUB_LABELS if k in labels}):
        kept["labels"] = routed
    return {"metadata": kept}


# Strings up to this long are shared between the objects kept (a status, a reason,
# an image, a namespace, a label value); longer ones are mostly unique (messages).
_SHARED_LENGTH = 64


def interned(value: Any) -> Any:
    """`value` (decoded JSON) with its keys and short strings interned: each watch event
    is decoded on its own, so every kept object had its own copy of every key
    ("metadata", "status", "lastTransitionTime", …) and of every common value. The
    same content; about 45 % less memory per Pod, Job and Event kept (bench/cache_memory.py)."""
    if type(value) is dict:
        return {(intern(k) if type(k) is str else k): interned(v) for k, v in value.items()}
    if type(value) is list:
        return [interned(v) for v in value]
    if type(value) is str and len(value) <= _SHARED_LENGTH:
        return intern(value)
    return value


def _trimmed(obj: Obj) -> Obj:
    obj["metadata"].pop("managedFields", None)
    return obj
