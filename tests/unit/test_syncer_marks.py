"""The syncer's bookkeeping of what to look at next, without a database or a cluster:
recorded objects fed to its cache as the watches deliver them."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY

from kubetrain.cluster.cache import ClusterCache
from kubetrain.control.syncer import DISPATCH_GRACE, Syncer
from kubetrain.store.db import Database
from tests.unit.test_cache import feed

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


def _diagnosed() -> dict[str, float]:
    """kubetrain_sync_jobs_total by trigger, as /metrics reads it."""
    return {
        t: REGISTRY.get_sample_value("kubetrain_sync_jobs_total", {"trigger": t}) or 0.0
        for t in ("event", "background")
    }


def _two_jobs() -> tuple[Syncer, list[float], dict[str, Any]]:
    """A syncer over a cache holding a job whose Pod waits for room (`waits`) and one
    whose Pod runs (`runs`), both recorded; nothing marked yet."""
    now = [1000.0]
    cache = ClusterCache(http=None)
    syncer = Syncer(cast(Database, None), cache, monotonic=lambda: now[0])
    feed(cache, "insufficient-gpu", "waits")
    running = {i["kind"]: i for i in feed(cache, "running", "runs")}
    syncer.dirty.clear()
    syncer.background.clear()
    syncer.cluster_changes.clear()
    return syncer, now, running


def _strangers(pod: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """`count` Pods of someone else's, each a copy of `pod` holding the same room."""
    out = []
    for n in range(count):
        other = copy.deepcopy(pod)
        other["metadata"]["uid"] = f"stranger-{n}"
        other["metadata"]["name"] = f"stranger-{n}"
        del other["metadata"]["labels"]["kubetrain.io/job-id"]
        out.append(other)
    return out


def test_room_taken_or_freed_on_a_node_marks_once_only_the_jobs_the_scheduler_could_not_place():
    syncer, now, running = _two_jobs()
    bound = syncer.cache.reflectors["bound_pods"]
    assert bound.on_event is not None
    for pod in _strangers(running["Pod"], 50):  # a busy cluster's Pods start and end
        bound.on_event("ADDED", pod)
        now[0] += 0.01
    # Another's Pods mark no job of their own; the room they hold is noted.
    assert not syncer.dirty
    assert not syncer.background
    syncer._mark_cluster_wide()
    # The job whose Pod waits for room is looked at again, once, as of the first change;
    # the running one waits on nothing that room elsewhere changes.
    assert syncer.background == {"waits": 1000.0}
    assert not syncer.dirty
    before = _diagnosed()
    assert syncer._next_batch() == {"waits": 1000.0}
    after = _diagnosed()
    assert {t: after[t] - before[t] for t in after} == {"event": 0, "background": 1}
    syncer._mark_cluster_wide()  # nothing new: nothing more
    assert not syncer.background


def test_our_own_pods_room_is_noted_when_its_claim_changes_and_not_otherwise():
    syncer, now, running = _two_jobs()
    pods = syncer.cache.reflectors["pods"]
    assert pods.on_event is not None
    pod = running["Pod"]
    node = pod["spec"]["nodeName"]
    held = syncer.cache.node_state().usage[node]
    assert syncer.cache.reflectors["bound_pods"].label_selector == "!kubetrain.io/job-id"
    # A change that keeps what it holds (a condition's time): its own job only.
    same = copy.deepcopy(pod)
    same["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-02T15:59:59Z"
    pods.on_event("MODIFIED", same)
    assert list(syncer.dirty) == ["runs"]
    assert syncer.cluster_changes == {}
    syncer.dirty.clear()
    # Finished: the room it held is freed, and noted once.
    done = copy.deepcopy(pod)
    done["status"]["phase"] = "Succeeded"
    pods.on_event("MODIFIED", done)
    pods.on_event("MODIFIED", copy.deepcopy(done))
    assert syncer.cluster_changes == {"bound_pods": now[0]}
    assert syncer.cache.node_state().usage.get(node) != held
    syncer._mark_cluster_wide()
    assert syncer.background == {"waits": 1000.0}


def test_a_node_that_changes_marks_every_unfinished_job_and_a_heartbeat_none():
    syncer, _, running = _two_jobs()
    nodes = syncer.cache.reflectors["nodes"]
    assert nodes.on_event is not None
    node = copy.deepcopy(running["Node"])
    for condition in node["status"]["conditions"]:
        condition["lastHeartbeatTime"] = "2026-12-02T15:59:59Z"
    nodes.on_event("MODIFIED", node)  # only the kubelet's status times moved
    assert syncer.cluster_changes == {}
    node = copy.deepcopy(node)
    node["spec"]["unschedulable"] = True  # cordoned
    nodes.on_event("MODIFIED", node)
    syncer._mark_cluster_wide()
    assert set(syncer.background) == {"waits", "runs"}
