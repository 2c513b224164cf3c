"""What every request handler shares: the settings, the database, the change hook and
the cluster view of the control loops running in the same process."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from kubetrain.api.principal import Principal
from kubetrain.api.streams import StreamSlots
from kubetrain.api.submissions import SubmissionWriter
from kubetrain.api.token_cache import VerifiedTokens
from kubetrain.cluster.logs import PodLogs
from kubetrain.cluster.tokenreview import PodIdentity, TokenReviewer
from kubetrain.domain.snapshot import Snapshot
from kubetrain.settings import ServerSettings
from kubetrain.store import Database

log = logging.getLogger("kubetrain.api")


@dataclass(frozen=True, slots=True)
class ApiContext:
    settings: ServerSettings
    db: Database
    on_change: Callable[[], None] | None = None
    on_report: Callable[[str], None] | None = None
    # The watch caches' objects as one `List` (ClusterCache.listing), or None while
    # they are not synced; absent where this process runs no control loops.
    # Called on the event loop's thread only: the caches change there.
    cluster: Callable[[], dict[str, Any] | None] | None = None

    # ControlLoops.watch_problems when this process runs the control loops
    watch_problems: Callable[..., list[str]] | None = None
    # Pods' logs, through the control loops' kubeconfig; None: no cluster connection
    pod_logs: PodLogs | None = None
    # The caches as a Snapshot with every node's usage (ControlLoops.cluster_snapshot),
    # for a dry run's forecast; on the event loop's thread only, like `cluster`.
    cluster_snapshot: Callable[[], Snapshot | None] | None = None

    # Tokens verified in the last seconds (token_cache.py), by hash.
    tokens: VerifiedTokens[Principal] = field(default_factory=VerifiedTokens)
    # The log follow streams each token holds open (api/logs.py).
    follow_streams: StreamSlots = field(default_factory=StreamSlots)
    # Pods' projected tokens, reviewed by the API server (api/reports.py); None: this
    # process has no cluster connection and refuses reports for now (503).
    pod_tokens: TokenReviewer | None = None
    # The Pods those tokens were found bound to in the last seconds, by the token's hash.
    pods: VerifiedTokens[PodIdentity] = field(default_factory=VerifiedTokens)
    # The submissions' queue and writer thread (api/submissions.py), on `db`.
    submissions: SubmissionWriter = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "submissions", SubmissionWriter(self.db))  # frozen

    def reported(self, job_id: str) -> None:
        """Tell the syncer a Pod of the job reported a new phase (it may now be TRAINING)."""
        if self.on_report is None:
            return
        try:
            self.on_report(job_id)
        except Exception:
            log.exception("the on_report hook failed; the next resync will see the report")

    def changed(self) -> None:
        """Wake the dispatcher after a commit it should act on (a submit, a cancel).

        The commit has happened and the answer stands whatever the hook does; a
        dispatcher that is not woken still finds the work on its next poll.
        """
        if self.on_change is None:
            return
        try:
            self.on_change()
        except Exception:
            log.exception("the on_change hook failed; the dispatcher will find the change later")


async def get_context(request: Request) -> ApiContext:
    # async: FastAPI runs a plain `def` dependency in a worker thread, a hop
    # that costs more than this lookup.
    context: ApiContext = request.app.state.kubetrain
    return context
