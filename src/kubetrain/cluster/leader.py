"""Leader election through a coordination.k8s.io/v1 Lease, as client-go does it.

Only the holder of the Lease runs the dispatcher and the syncer. Expiry is
judged by the *local* time since the record last changed (never by comparing
the holder's clock with ours), so clock skew between replicas does not matter.
A leader that cannot renew within `renew_deadline` stops acting before its
Lease can expire, so two replicas never act at once.

A standby also watches the Lease, so it observes each renewal as it is written
rather than up to a retry period later, and wakes at the expiry computed from
that observation instead of at its next poll: a takeover after the leader dies
takes at most the lease duration (plus a request), not duration + 2 periods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import httpx2 as httpx
from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from kubetrain.cluster.errors import ClusterError, kube_errors
from kubetrain.metrics import LEADER

log = logging.getLogger(__name__)


class LeaderElector:
    def __init__(
        self,
        client: AsyncClient,
        *,
        identity: str,
        name: str = "kubetrain-controller",
        namespace: str = "kube-system",
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        release_on_cancel: bool = True,
    ) -> None:
        self.client = client
        self.identity = identity
        self.name = name
        self.namespace = namespace
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_cancel = release_on_cancel
        self.leading = asyncio.Event()
        # (holder, resourceVersion): any write of the record changes its version.
        self._observed: tuple[str | None, str | None] = (None, None)
        self._observed_at = 0.0
        self._observed_duration = lease_duration
        self._released = asyncio.Event()  # the watch saw the holder give the Lease up
        self.transitions = 0

    def _observe(self, holder: str | None, version: str | None, duration: int | None) -> None:
        """Note the record as seen now; its expiry counts from the first sight of it."""
        if (holder, version) != self._observed:
            self._observed, self._observed_at = (holder, version), time.monotonic()
        self._observed_duration = float(duration or self.lease_duration)

    def expires_in(self) -> float:
        """Seconds until the observed record expires by our clock (<= 0: expired)."""
        return self._observed_at + self._observed_duration - time.monotonic()

    async def try_acquire_or_renew(self) -> bool:
        """Take the Lease when it is free or expired, renew it when ours; False while
        another replica holds it. Raises ClusterError when the API server fails a call."""
        with kube_errors():
            return await self._acquire_or_renew()

    async def _acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            lease = Lease(
                metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                spec=LeaseSpec(
                    holderIdentity=self.identity,
                    leaseDurationSeconds=int(self.lease_duration),
                    acquireTime=now,
                    renewTime=now,
                    leaseTransitions=0,
                ),
            )
            try:
                await self.client.create(lease)
            except ApiError as again:
                if again.status.code == 409:
                    return False  # another replica created it first
                raise
            return True
        spec = lease.spec or LeaseSpec()
        self._observe(spec.holderIdentity, _version(lease), spec.leaseDurationSeconds)
        held_by_other = spec.holderIdentity not in (None, "", self.identity)
        if held_by_other and self.expires_in() >= 0:
            return False
        if spec.holderIdentity != self.identity:
            spec.acquireTime = now
            spec.leaseTransitions = (spec.leaseTransitions or 0) + 1
        spec.holderIdentity = self.identity
        spec.renewTime = now
        spec.leaseDurationSeconds = int(self.lease_duration)
        lease.spec = spec
        try:
            # The resourceVersion we read makes this a compare-and-swap.
            written = await self.client.replace(lease)
        except ApiError as exc:
            if exc.status.code == 409:
                return False
            raise
        self._observed, self._observed_at = (self.identity, _version(written)), time.monotonic()
        return True

    async def run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Forever: wait to lead, run `work` while leading, cancel it on losing."""
        watch = asyncio.create_task(self._watch())
        try:
            await self._run(work)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def _run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while True:
            began = time.monotonic()
            # Bounded like a renewal: a write that lands late leaves no time to act.
            if not await self._attempt_within(self.renew_deadline):
                await self._stand_by()
                continue
            log.info("%s is the leader (lease %s/%s)", self.identity, self.namespace, self.name)
            self.transitions += 1
            self.leading.set()
            LEADER.set(1)
            task = asyncio.create_task(work())
            try:
                await self._keep_renewing(task, began)
            except asyncio.CancelledError:
                # Shutting down: stop acting first, then hand the Lease over at once
                # (as client-go's ReleaseOnCancel does) instead of making the next
                # replica wait out its duration.
                self.leading.clear()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                if self.release_on_cancel:
                    await asyncio.shield(self._release())
                raise
            finally:
                self.leading.clear()
                LEADER.set(0)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            log.warning("%s lost the lease; standing by", self.identity)

    async def _stand_by(self) -> None:
        """Until the next try: a retry period, or less when the observed record expires
        sooner (a hair after, so the try finds it expired), or the holder releases it."""
        self._released.clear()
        wait = min(self.retry_period, max(0.0, self.expires_in()) + 0.01)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), wait)

    async def _watch(self) -> None:
        """Observe every write of the Lease as it happens; the polls stay the authority
        (a broken watch only makes the observations late, as with polling alone)."""
        while True:
            try:
                async for _, lease in self.client.watch(
                    Lease, namespace=self.namespace, fields={"metadata.name": self.name}
                ):
                    spec = lease.spec or LeaseSpec()
                    self._observe(spec.holderIdentity, _version(lease), spec.leaseDurationSeconds)
                    if not spec.holderIdentity:
                        self._released.set()
            except (ApiError, httpx.HTTPError, OSError) as exc:
                log.debug("watch of lease %s/%s: %s", self.namespace, self.name, exc)
            await asyncio.sleep(self.retry_period)

    async def _release(self) -> None:
        try:
            lease = await asyncio.wait_for(
                self.client.get(Lease, self.name, namespace=self.namespace), 2
            )
            if lease.spec is None or lease.spec.holderIdentity != self.identity:
                return
            lease.spec.holderIdentity = ""
            lease.spec.leaseDurationSeconds = 1
            lease.spec.renewTime = datetime.now(UTC)
            await asyncio.wait_for(self.client.replace(lease), 2)
            log.info("%s released the lease", self.identity)
        except (ApiError, httpx.HTTPError, OSError, TimeoutError) as exc:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, exc)

    async def _keep_renewing(self, task: asyncio.Task[None], renewed: float) -> None:
        """Renew until the work ends or a renewal misses the deadline. As client-go's
        renew does, every attempt runs within the time left before the renew deadline
        (counted from when the last successful attempt began, which is no later than
        its write): an attempt that would outlast it is cut off, so a stalled request
        (a get and a replace, each allowed the client's timeout) can never keep a
        leader acting past the moment a standby may take the Lease over."""
        while not task.done():
            # Never sleep past the deadline either: it ends the leadership on time.
            deadline = renewed + self.renew_deadline
            await asyncio.sleep(min(self.retry_period, max(0.0, deadline - time.monotonic())))
            started = time.monotonic()
            if started >= deadline or not await self._attempt_within(deadline - started):
                if time.monotonic() >= deadline:
                    log.warning("%s could not renew within the renew deadline", self.identity)
                    return
                continue
            renewed = started
        task.result()  # surface a crashed loop

    async def _attempt_within(self, seconds: float) -> bool:
        """An attempt cut off (False) when it takes longer than `seconds`."""
        if seconds <= 0:
            return False
        try:
            return await asyncio.wait_for(self._attempt(), seconds)
        except TimeoutError:
            return False

    async def _attempt(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except ClusterError as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False


def _version(lease: Lease) -> str | None:
    return lease.metadata.resourceVersion if lease.metadata else None
