"""What the probes learn of the watches: ControlLoops.watch_problems over reflector state."""

from __future__ import annotations

import time

import httpx2 as httpx
import pytest
from lightkube.config.kubeconfig import SingleConfig

from kubetrain.cluster.cache import ClusterCache
from kubetrain.cluster.leader import LeaderElector
from kubetrain.control.runner import ControlLoops
from kubetrain.store import Database

pytestmark = pytest.mark.unit


@pytest.fixture
def loops() -> ControlLoops:
    config: SingleConfig = None  # type: ignore[assignment]  # never used: nothing runs
    control = ControlLoops(Database("sqlite://"), config, leader_elect=False)
    control.cache = ClusterCache(httpx.AsyncClient())
    for reflector in control.cache.reflectors.values():
        reflector.synced.set()
    return control


def test_synced_and_connected_watches_are_healthy(loops: ControlLoops):
    assert loops.watch_problems(30, synced=True) == []


def test_a_watch_failing_past_the_limit_is_named_with_its_error_class_only(loops: ControlLoops):
    assert loops.cache is not None
    stats = loops.cache.reflectors["pods"].stats
    stats.failing_since = time.monotonic() - 45
    stats.last_error = "ConnectError: [Errno 111] Connection refused to 10.0.0.1"
    (problem,) = loops.watch_problems(30, synced=True)
    assert problem.startswith("the watch of pods has failed for 4")
    assert problem.endswith("(ConnectError)")
    assert loops.watch_problems(300, synced=False) == []  # not yet a reason to restart


def test_a_watch_not_listed_yet_makes_not_ready_but_not_dead(loops: ControlLoops):
    assert loops.cache is not None
    loops.cache.reflectors["nodes"].synced.clear()
    assert loops.watch_problems(30, synced=True) == ["the watch of nodes has not listed yet"]
    assert loops.watch_problems(300, synced=False) == []


def test_a_standby_watches_nothing_so_has_no_problem(loops: ControlLoops):
    assert loops.cache is not None
    loops.cache.reflectors["nodes"].synced.clear()
    loops.elector = LeaderElector(None, identity="me")
    assert loops.watch_problems(30, synced=True) == []
