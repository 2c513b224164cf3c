"""The KWOK stages that play a kubelet's failures say what a real kubelet said.

The KWOK pools keep their fates (src/kubetrain/testbed/stages/pods.yaml) for speed
and for scale (the `large` pool); each failure fate is checked here against the
recording of the same failure on the `real` pool (tests/fixtures/snapshots/real-*):
the container's state and its reason, the exit code, the Pod's phase, reason and
conditions, the events' types and reasons, and the messages' words. A stage's
statusTemplate is read as the YAML it renders to, its Go template actions left as
text but for `printf` formats; in a message, `%q`, `%s`, `%v` and "(kwok)" stand for
the names, ids and addresses the kubelet fills in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import kubetrain.testbed
from tests.unit.diagnosis_helpers import dump, items

pytestmark = pytest.mark.unit

STAGES: dict[str, dict[str, Any]] = {
    doc["metadata"]["name"]: doc
    for doc in yaml.safe_load_all(
        (Path(kubetrain.testbed.__file__).parent / "stages" / "pods.yaml").read_text()
    )
}
ACTION = re.compile(r"\{\{(.*?)\}\}")
PRINTF = re.compile(r'\s*printf\s+"((?:[^"\\]|\\.)*)"')
# An inline `if`: the failure fates take its `else` branch (the stages branch on a
# zero exit code).
# `$x := "text"`, or `$x := or ( index $annotations "key" ) "default"`.
ASSIGNED = re.compile(r'\{\{\s*(\$\w+)\s*:=\s*(?:or \(.*?\)\s*)?"((?:[^"\\]|\\.)*)"\s*\}\}')
IF_ELSE = re.compile(r"\{\{\s*if [^}]*\}\}.*?\{\{\s*else\s*\}\}(.*?)\{\{\s*end\s*\}\}")


def _go_string(literal: str) -> str:
    text: str = json.loads(f'"{literal}"')
    return text


def rendered(stage: str) -> dict[str, Any]:
    """The stage's status as its template writes it: `printf` formats and string
    variables (an annotation's default) in place, any other action as its own text."""
    variables: dict[str, str] = {}
    lines = []
    for line in STAGES[stage]["spec"]["next"]["statusTemplate"].splitlines():
        if ACTION.fullmatch(line.strip()):  # an assignment, a range, an end
            assigned = ASSIGNED.fullmatch(line.strip())
            if assigned:
                variables[assigned[1]] = _go_string(assigned[2])
            continue
        line = IF_ELSE.sub(r"\1", line)
        lines.append(ACTION.sub(lambda m: json.dumps(_action(m[1], variables)), line))
    status: dict[str, Any] = yaml.safe_load("\n".join(lines))
    return status


def _action(action: str, variables: dict[str, str]) -> str:
    printf = PRINTF.match(action)
    if printf:
        return _go_string(printf[1])
    name = re.fullmatch(r"\s*(\$\w+)\s*(\|\s*Quote\s*)?", action)
    if name and name[1] in variables:
        return variables[name[1]]
    return "{{" + action.strip() + "}}"


def final(fate: Fate) -> dict[str, Any]:
    """The Pod's status once the fate's stages have run (each patches the last)."""
    status: dict[str, Any] = {}
    for stage in fate.stages:
        status.update(rendered(stage))
    return status


def shape(message: str) -> re.Pattern[str]:
    """A stage's message as a pattern of the real one: its fixed words exactly."""
    pattern = re.escape(message)
    pattern = pattern.replace(re.escape("(kwok)"), ".+?").replace("%q", '"[^"]*"')
    return re.compile(pattern.replace("%s", ".+?").replace("%v", ".+?"), re.S)


def real_pod(fixture: str) -> dict[str, Any]:
    (pod,) = items(dump(fixture), "Pod")
    return pod


def kubelet_events(fixture: str) -> list[dict[str, Any]]:
    return [
        e
        for e in items(dump(fixture), "Event")
        if e["involvedObject"]["kind"] == "Pod" and e["source"].get("component") == "kubelet"
    ]


def only_state(states: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ((kind, detail),) = states.items()
    return kind, detail


@dataclass(frozen=True)
class Fate:
    fate: str
    stages: tuple[str, ...]  # as KWOK plays them; the last one writes the verdict
    real: str  # the recording of the same failure on the `real` pool
    exit_code: str | None = None  # the annotation it comes from, when not fixed


FATES = [
    Fate("exit", ("pod-start", "pod-exit"), "real-exit-nonzero", "exit-code"),
    Fate("exit", ("pod-start", "pod-exit"), "real-preflight-failed", "exit-code"),
    Fate("oom", ("pod-start", "pod-oom"), "real-oom-killed"),
    Fate("evicted", ("pod-start", "pod-evicted"), "real-evicted"),
    Fate(
        "image-pull-failure",
        ("pod-image-pull-failed", "pod-image-pull-backoff"),
        "real-image-pull-failed",
    ),
    Fate("mount-failure", ("pod-mount-failed",), "real-mount-failed"),
    Fate("config-error", ("pod-config-error",), "real-config-error"),
    Fate("gpu-admission-error", ("pod-gpu-admission-error",), "real-gpu-allocation-failed"),
    Fate("crash-loop", ("pod-start", "pod-crash-loop"), "real-crash-loop", "exit-code"),
]
# Stages that play no failure: a container that starts, runs, is slow to create, or
# is deleted.
NOT_A_FAILURE = {"pod-start", "pod-container-creating", "pod-slow-start", "pod-delete"}


def test_every_stage_that_plays_a_failure_is_checked_against_a_recording() -> None:
    assert {s for f in FATES for s in f.stages} | NOT_A_FAILURE == set(STAGES)
    for fate in FATES:
        assert dump(fate.real)["recordedOn"] == "real"
        for stage in fate.stages:
            selector = STAGES[stage]["spec"]["selector"]["matchExpressions"]
            fates = [e for e in selector if "testbed.kubetrain.io/fate" in e["key"]]
            # The default fate, exit, is every stage's but the others'.
            assert (fate.fate in fates[0]["values"]) is (fates[0]["operator"] == "In"), stage


@pytest.fixture(params=FATES, ids=lambda f: f"{f.fate}-{f.real}")
def fate(request: pytest.FixtureRequest) -> Fate:
    fate: Fate = request.param
    return fate


def test_the_pod_phase_reason_and_message(fate: Fate) -> None:
    status, real = final(fate), real_pod(fate.real)["status"]
    assert status["phase"] == real["phase"]
    assert status.get("reason") == real.get("reason")
    if fate.fate == "evicted":
        # Node pressure (the stage) and an emptyDir past its limit (the recording)
        # word it differently; each of the kubelet's sentences ends in ". ".
        assert status["message"].endswith(". ")
        assert real["message"].endswith(". ")
    elif "message" in real:
        assert shape(status["message"]).fullmatch(real["message"])
    else:
        assert "message" not in status


def test_the_conditions_the_stage_writes(fate: Fate) -> None:
    written = {c["type"]: c for c in final(fate).get("conditions", [])}
    real = {c["type"]: c for c in real_pod(fate.real)["status"].get("conditions", [])}
    for kind, condition in written.items():
        if kind == "DisruptionTarget":
            # Node pressure sets it (pkg/kubelet/eviction/eviction_manager.go, v1.33);
            # the recorded emptyDir eviction does not. kubetrain's podFailurePolicy
            # needs it to replace an evicted Pod without using a retry.
            assert fate.fate == "evicted"
            assert condition["reason"] == "TerminationByKubelet"
            assert condition["message"] == rendered(fate.stages[-1])["message"]
            assert kind not in real
            continue
        assert (condition["status"], condition.get("reason")) == (
            real[kind]["status"],
            real[kind].get("reason"),
        ), kind


def test_the_container_state_reason_and_exit_code(fate: Fate) -> None:
    status, real = final(fate), real_pod(fate.real)["status"]
    if "containerStatuses" not in real:  # refused at admission: no container
        assert "containerStatuses" not in status
        return
    (container,), (recorded,) = status["containerStatuses"], real["containerStatuses"]
    for field in ("state", "lastState"):
        if not recorded.get(field):
            assert not container.get(field), field
            continue
        kind, detail = only_state(container[field])
        real_kind, real_detail = only_state(recorded[field])
        assert (kind, detail.get("reason")) == (real_kind, real_detail.get("reason")), field
        if "exitCode" in real_detail:
            if fate.exit_code:
                # Chosen by the annotation (the reason above is the stage's for any
                # code but 0).
                template = STAGES[fate.stages[-1]]["spec"]["next"]["statusTemplate"]
                assert f'"testbed.kubetrain.io/{fate.exit_code}"' in template
            else:
                assert detail["exitCode"] == real_detail["exitCode"]
        if kind == "waiting" and "message" in real_detail:
            assert shape(detail["message"]).fullmatch(real_detail["message"])
    assert container["restartCount"] == recorded["restartCount"]


def test_the_events_the_stages_write(fate: Fate) -> None:
    real = kubelet_events(fate.real)
    for stage in fate.stages:
        event = STAGES[stage]["spec"]["next"].get("event")
        if event is None:
            continue
        same = [e for e in real if (e["type"], e["reason"]) == (event["type"], event["reason"])]
        assert same, (stage, event["reason"])
        if fate.fate == "evicted" and stage == fate.stages[-1]:
            # The kubelet's event says what it wrote on the Pod.
            assert event["message"] == rendered(stage)["message"]
            assert same[0]["message"] == real_pod(fate.real)["status"]["message"]
        else:
            assert any(shape(event["message"]).fullmatch(e["message"]) for e in same), stage


def test_a_failed_pull_waits_in_err_image_pull_with_the_runtimes_words() -> None:
    # The kubelet keeps the pull's error for its back-off message
    # ("Back-off pulling image %q: ErrImagePull: <error>", pkg/kubelet/images/
    # image_manager.go, v1.33): ErrImagePull's own message is that error.
    (container,) = rendered("pod-image-pull-failed")["containerStatuses"]
    waiting = container["state"]["waiting"]
    (recorded,) = real_pod("real-image-pull-failed")["status"]["containerStatuses"]
    error = recorded["state"]["waiting"]["message"].split(": ErrImagePull: ", 1)[1]
    assert waiting["reason"] == "ErrImagePull"
    assert shape(waiting["message"]).fullmatch(error)


def test_a_message_shape_holds_the_fixed_words_only() -> None:
    assert shape('Error: secret "(kwok)" not found').fullmatch('Error: secret "wandb" not found')
    assert not shape('Error: secret "(kwok)" not found').fullmatch("Error: secret not found")
    assert shape("back-off 10s restarting failed container=%s pod=%s_%s(%s)").fullmatch(
        "back-off 10s restarting failed container=trainer pod=kt-a_team(0-1)"
    )
    assert not shape("Back-off pulling image %q").fullmatch('Back-off pulling image "x": more')
