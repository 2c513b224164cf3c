"""The syncer's bookkeeping of what to look at next, without a database or a cluster."""

from __future__ import annotations

from typing import cast

import pytest

from kubetrain.cluster.cache import ClusterCache
from kubetrain.control.syncer import DISPATCH_GRACE, Syncer
from kubetrain.store.db import Database

pytestmark = pytest.mark.unit


def test_dispatch_times_are_let_go_once_past_their_grace():
    now = [1000.0]
    syncer = Syncer(cast(Database, None), ClusterCache(http=None), monotonic=lambda: now[0])
    for index in range(5):
        syncer.note_dispatched(f"old-{index}")
    now[0] += DISPATCH_GRACE / 2
    syncer.note_dispatched("recent")
    syncer.note_dispatched("old-4")  # dispatched again: its time is the new one
    now[0] += DISPATCH_GRACE / 2 + 1  # the first four are past their grace, "recent" is not
    syncer.note_dispatched("new")
    assert list(syncer.dispatched_at) == ["recent", "old-4", "new"]
    assert {"recent", "old-4", "new"} <= set(syncer.dirty)  # each marked to be looked at
