"""Runs the control loops of one kubetrain process: watch caches, syncer and
dispatcher, under leader election so that only one replica acts at a time."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kubetrain.cluster.cache import ClusterCache
from kubetrain.cluster.client import (
    ClusterConfig,
    CreatingClient,
    HttpClient,
    TypedClient,
    creating_client,
    http_client,
    typed_client,
)
from kubetrain.cluster.leader import LeaderElector
from kubetrain.control.dispatcher import Dispatcher
from kubetrain.control.notifier import MAX_IN_FLIGHT, Notifier
from kubetrain.control.syncer import Syncer
from kubetrain.delivery import TIMEOUT_SECONDS, webhook_poster
from kubetrain.domain.manifest import RenderOptions
from kubetrain.domain.networks import Network
from kubetrain.domain.snapshot import Snapshot
from kubetrain.metrics import LEADER
from kubetrain.store import Database

log = logging.getLogger(__name__)

# Seconds a syncer's round waits at most for the dispatcher's backlog to be through.
# Creating the Jobs of waiting jobs comes first: the syncer's rounds record what the
# Jobs already made went through, and on one interpreter they took the dispatcher's
# turns (docs/benchmarks.md). The bound keeps the syncer going through a long backlog.
BACKLOG_FIRST = 1.0


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class ControlLoops:
    db: Database
    config: ClusterConfig
    render_options: RenderOptions = field(default_factory=RenderOptions)
    leader_elect: bool = True
    lease_namespace: str = "default"
    lease_name: str = "kubetrain-controller"
    identity: str = field(default_factory=default_identity)
    resync_interval: float = 30.0
    stall_after: int | None = 1800  # seconds; a job's spec.stallAfter wins (None: never)
    webhook_allowed_networks: tuple[Network, ...] = ()
    webhook_timeout: float = TIMEOUT_SECONDS
    webhook_max_in_flight: int = MAX_IN_FLIGHT
    dispatcher: Dispatcher | None = None
    syncer: Syncer | None = None
    elector: LeaderElector | None = None
    notifier: Notifier | None = None
    cache: ClusterCache | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def cluster_listing(self) -> dict[str, Any] | None:
        """The watch caches as one `List` while this replica leads and they are synced;
        call it on the loop's thread (the web pages' nodes and quotas read it)."""
        cache = self.cache
        if cache is None or not all(r.synced.is_set() for r in cache.reflectors.values()):
            return None
        return cache.listing()

    def cluster_snapshot(self) -> Snapshot | None:
        """The watch caches as a Snapshot with the node usage of every bound Pod (not only
        ours), for a dry run's forecast; None as for `cluster_listing`. On the loop's thread."""
        cache = self.cache
        listing = self.cluster_listing()
        if cache is None or listing is None:
            return None
        return dataclasses.replace(Snapshot.from_list(listing), node_state=cache.node_state())

    def notify(self) -> None:
        """Wake the dispatcher; safe to call from the API's worker threads."""
        loop, dispatcher = self._loop, self.dispatcher
        if loop is not None and dispatcher is not None and not loop.is_closed():
            loop.call_soon_threadsafe(dispatcher.notify)

    def reported(self, job_id: str) -> None:
        """Have the syncer look at a job whose Pod reported; safe from any thread."""
        loop, syncer = self._loop, self.syncer
        if loop is not None and syncer is not None and not loop.is_closed():
            loop.call_soon_threadsafe(syncer.mark, job_id)

    def watch_problems(self, failing_for: float, *, synced: bool) -> list[str]:
        """Why the watches are unhealthy: each one failing for longer than `failing_for`
        seconds, and (with `synced`) each not listed yet. Empty on a standby, which
        watches nothing."""
        cache = self.cache
        if cache is None or (self.elector is not None and not self.elector.leading.is_set()):
            return []
        now = time.monotonic()
        problems = []
        for name, reflector in cache.reflectors.items():
            since = reflector.stats.failing_since
            # The class only: an error's text is no business of an unauthenticated probe.
            error = (reflector.stats.last_error or "").split(":", 1)[0]
            if since is not None and now - since > failing_for:
                problems.append(f"the watch of {name} has failed for {now - since:.0f} s ({error})")
            elif synced and not reflector.synced.is_set():
                problems.append(f"the watch of {name} has not listed yet")
        return problems

    async def _dispatch_first(self) -> None:
        if self.dispatcher is not None:
            await self.dispatcher.backlog_through(BACKLOG_FIRST)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        http = http_client(self.config)
        client = typed_client(self.config)
        creates = creating_client(self.config)
        try:
            if self.leader_elect:
                self.elector = LeaderElector(
                    client,
                    identity=self.identity,
                    name=self.lease_name,
                    namespace=self.lease_namespace,
                )
                await self.elector.run(lambda: self._work(http, client, creates))
            else:
                LEADER.set(1)
                await self._work(http, client, creates)
        finally:
            await http.aclose()
            await creates.aclose()

    def _term(
        self, http: HttpClient, client: TypedClient, creates: CreatingClient
    ) -> tuple[ClusterCache, Syncer, Dispatcher]:
        """The caches and loops of one term as leader: fresh each term, since a
        standby's view may be stale."""
        cache = self.cache = ClusterCache(http)
        syncer = self.syncer = Syncer(
            self.db,
            cache,
            resync_interval=self.resync_interval,
            stall_after=self.stall_after,
            on_cancelled=self.notify,  # the dispatcher deletes a cancelled job's Job
            yield_to=self._dispatch_first,
        )
        dispatcher = self.dispatcher = Dispatcher(
            self.db,
            client,
            http=creates,
            render_options=self.render_options,
            on_dispatched=syncer.note_dispatched,
        )
        return cache, syncer, dispatcher

    async def _work(self, http: HttpClient, client: TypedClient, creates: CreatingClient) -> None:
        cache, syncer, dispatcher = self._term(http, client, creates)
        log.info("control loops running as %s", self.identity)
        try:
            async with webhook_poster(
                allowed_networks=self.webhook_allowed_networks,
                timeout=self.webhook_timeout,
                max_connections=self.webhook_max_in_flight,
            ) as post:
                self.notifier = Notifier(self.db, post, max_in_flight=self.webhook_max_in_flight)
                await asyncio.gather(
                    cache.run(), syncer.run(), dispatcher.run(), self.notifier.run()
                )
        finally:
            self.cache = None  # a standby's view would go stale
