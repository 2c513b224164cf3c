"""What differed between a checkpoint and the attempt that resumed from it, by the
runtime's binding rule (domain/lineage.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kubetrain.domain.lineage import Compared, Rule, Verdict, compare_resume

pytestmark = pytest.mark.unit

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
BOUND: dict[str, Any] = {
    "dataset_version": "v3",
    "code_version": DIGEST_A,
    "params_sha256": "c" * 64,
    "world_size": None,
}


def compare(**overrides: Any) -> dict[str, Compared]:
    values: dict[str, Any] = {
        "from_node": "node-a",
        "node": "node-b",
        "checkpoint_binding": BOUND,
        "binding": BOUND,
        "allowed": [],
    } | overrides
    return {c.field: c for c in compare_resume(**values)}


def test_another_node_is_allowed_and_a_matching_binding_is_the_same() -> None:
    found = compare()
    assert list(found) == ["node", "dataset version", "code version", "params digest", "world size"]
    assert found["node"].verdict is Verdict.ALLOWED
    assert found["node"].rule is Rule.MAY_DIFFER
    assert found["node"].line() == "node: node-a -> node-b (allowed)"
    assert found["dataset version"].line() == "dataset version: v3 (same)"
    assert found["params digest"].line() == "params digest: ccccccccccccccc… (same)"
    assert found["world size"].line() == "world size: 1 (same)"
    assert compare(node="node-a")["node"].line() == "node: node-a (same)"


def test_a_binding_field_the_run_let_differ_is_allowed_by_the_run() -> None:
    code = compare(binding=BOUND | {"code_version": DIGEST_B}, allowed=["code_version"])[
        "code version"
    ]
    assert (code.checkpoint, code.resumed) == (DIGEST_A, DIGEST_B)
    assert code.verdict is Verdict.ALLOWED_BY_RUN
    assert code.rule is Rule.MUST_MATCH_UNLESS_ALLOWED
    assert code.line() == (
        "code version: sha256:aaaaaaaa… -> sha256:bbbbbbbb… (allowed by the run's allow_mismatch)"
    )


def test_a_difference_the_rule_forbids_is_said_not_allowed() -> None:
    # The runtime refuses these; a record that shows one anyway deserves a look.
    dataset = compare(binding=BOUND | {"dataset_version": "v4"})["dataset version"]
    assert dataset.verdict is Verdict.NOT_ALLOWED
    assert dataset.line() == ("dataset version: v3 -> v4 (not allowed: must match unless allowed)")
    size = compare(binding=BOUND | {"world_size": 2})["world size"]
    assert size.verdict is Verdict.NOT_ALLOWED
    assert size.line() == "world size: 1 -> 2 (not allowed: must match)"


def test_a_field_unset_on_either_side_is_not_compared() -> None:
    # The runtime compares a field only when both the checkpoint and the run set it.
    found = compare(checkpoint_binding=BOUND | {"dataset_version": None})["dataset version"]
    assert found.verdict is Verdict.UNSET
    assert found.line() == "dataset version: not compared (unset in the checkpoint or the run)"


def test_what_was_not_recorded_is_not_reported_never_guessed() -> None:
    found = compare(from_node=None, checkpoint_binding=None, binding=None, allowed=None)
    assert list(found) == ["node", "binding"]
    assert found["node"].line() == "node: not reported"
    assert found["node"].resumed == "node-b"  # what is known stays in the record
    assert found["binding"].line() == "binding: not reported"


def test_the_json_carries_the_line() -> None:
    data = compare()["node"].to_json()
    assert data == {
        "field": "node",
        "checkpoint": "node-a",
        "resumed": "node-b",
        "rule": "may differ",
        "verdict": "differs, allowed",
        "says": "node: node-a -> node-b (allowed)",
    }
