"""The dashboard's arithmetic: ages, chip colours, counts, timeline lanes, bars, demand,
quotas, and the session cookie's signature."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest

from kubetrain.api.web import views
from kubetrain.api.web.sessions import SessionSigner, same_secret
from kubetrain.domain.states import BusinessState as S
from kubetrain.domain.states import ReasonCode as R

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-5, "0s"), (42, "42s"), (60 * 12, "12m"), (3600 * 3, "3h"), (3600 * 3 + 300, "3h 5m"),
     (86400 * 2 + 3600 * 4, "2d 4h"), (86400, "1d")],
)  # fmt: skip
def test_age_reads_in_the_two_largest_units(seconds: int, text: str) -> None:
    assert views.age(NOW - timedelta(seconds=seconds), NOW) == text


def test_chip_colours_say_who_acts() -> None:
    assert views.reason_class(S.QUEUED, R.WAITING_FOR_QUOTA) == "chip-user"
    assert views.reason_class(S.QUEUED, R.NO_GPU_NODES) == "chip-platform"
    assert views.reason_class(S.RUNNING, R.TRAINING) == "chip-active"
    assert views.reason_class(S.FAILED, R.EXIT_NONZERO) == "chip-bad"
    assert views.reason_class(S.SUCCEEDED, R.COMPLETED) == "chip-ok"


def test_counts_put_unfinished_work_first_then_the_most_frequent() -> None:
    counts = views.reason_counts(
        [
            (S.SUCCEEDED, R.COMPLETED, 40),
            (S.QUEUED, R.WAITING_FOR_QUOTA, 3),
            (S.QUEUED, R.INSUFFICIENT_GPU, 12),
            (S.QUEUED, R.IMAGE_PULL_FAILED, 1),
        ]
    )
    assert [c.words for c in counts] == [
        "12 waiting for GPU",
        "3 waiting for quota",
        "1 image pull failed",
        "40 completed",
    ]


def _entry(kind: str, attempt: int | None = None, **fields: object) -> SimpleNamespace:
    base = {"at": NOW, "from_state": None, "to_state": None, "to_reason": None}
    base.update(raw_reason=None, raw_message=None, detail=None)
    return SimpleNamespace(kind=kind, attempt=attempt, **{**base, **fields})


def test_the_timeline_puts_each_attempt_in_its_own_lane() -> None:
    found = views.timeline(
        [
            _entry("business", to_state="CREATED", to_reason="JOB_NOT_CREATED"),
            _entry("runtime", 1, to_state="Pending", detail={"pod_phase": [None, "Pending"]}),
            _entry(
                "runtime",
                2,
                to_state="Running",
                raw_reason="Started",
                detail={"changed": {"node": [None, "gpu-0"]}, "pod_name": "p", "pod_uid": "u"},
            ),
            _entry("business", from_state="QUEUED", to_state="RUNNING", to_reason="TRAINING"),
        ]
    )
    assert found.lanes == ["job", "attempt 1", "attempt 2"]
    assert [(r.lane, r.title) for r in found.rows] == [
        (0, "- → CREATED (JOB_NOT_CREATED)"),
        (1, "Pending"),
        (2, "Running (Started)"),
        (0, "QUEUED → RUNNING (TRAINING)"),
    ]
    assert found.rows[1].text == "pod_phase: - → Pending"
    assert found.rows[2].text == "node: - → gpu-0"


def test_a_business_row_without_kubernetes_words_shows_kubetrains_message() -> None:
    said = "cancelled for no progress: NO_PROGRESS for over 30m (spec.cancelAfterStall)"
    found = views.timeline(
        [
            _entry(
                "business",
                from_state="RUNNING",
                to_state="CANCELLED",
                to_reason="CANCELLED",
                detail={"message": said},
            ),
            _entry("business", to_state="RUNNING", detail={"link": "training", "waitable": None}),
        ]
    )
    assert [r.text for r in found.rows] == [said, None]


def test_bars_clamp_and_colour_by_how_full() -> None:
    half = views.Bar("gpu", Decimal(4), Decimal(8))
    assert (half.percent, half.level, half.text()) == (50.0, "ok", "4 of 8 used, 4 free")
    over = views.Bar("gpu", Decimal(9), Decimal(8))
    assert (over.percent, over.level, over.free) == (100.0, "full", Decimal(0))
    assert views.Bar("gpu", Decimal(0), Decimal(0)).percent == 0.0


def test_gpu_demand_counts_per_gpu_type() -> None:
    specs = [
        {"spec": {"resources": {"gpus": 8, "gpuType": "nvidia-h100"}}},
        {"spec": {"resources": {"gpus": 2, "gpuType": "nvidia-h100"}}},
        {"spec": {"resources": {"gpus": 1}}},
        {"spec": {"resources": {"requests": {"cpu": "1"}}}},
    ]
    assert views.gpu_demand(specs) == {"nvidia-h100": 10, "": 1}


def test_a_gang_asks_for_its_gpus_on_every_worker() -> None:
    gang = {"spec": {"workers": 2, "resources": {"gpus": 8, "gpuType": "nvidia-h100"}}}
    assert views.gpu_demand([gang]) == {"nvidia-h100": 16}
    assert views.gpu_shape(gang) == "2x8"
    assert views.gpu_shape({"spec": {"resources": {"gpus": 8}}}) == "8"


def test_quotas_show_gpu_then_cpu_then_memory_and_only_the_namespaces_asked() -> None:
    gpu, cpu, memory = "requests.nvidia.com/gpu", "requests.cpu", "requests.memory"
    quota = {
        "kind": "ResourceQuota",
        "metadata": {"name": "team", "namespace": "a"},
        "status": {
            "hard": {memory: "64Gi", cpu: "16", gpu: "4"},
            "used": {memory: "16Gi", cpu: "4", gpu: "3"},
        },
    }
    other = {**quota, "metadata": {"name": "team", "namespace": "b"}}
    (view,) = views.quotas([quota, other], {"a"})
    assert [(b.label, b.text()) for b in view.bars] == [
        ("requests.nvidia.com/gpu", "3 of 4 used, 1 free"),
        ("requests.cpu", "4 of 16 used, 12 free"),
        ("requests.memory", "16Gi of 64Gi used, 48Gi free"),
    ]
    assert len(views.quotas([quota, other], None)) == 2


def test_a_session_cookie_is_refused_when_forged_tampered_or_expired() -> None:
    signer = SessionSigner(b"k" * 32)
    value, session = signer.issue("token-1", now=1000)
    assert signer.read(value, now=1001) == session
    payload, mac = value.split(".")
    assert signer.read(f"{payload}x.{mac}", now=1001) is None
    assert SessionSigner(b"other key" * 4).read(value, now=1001) is None
    assert signer.read(value, now=session.expires) is None
    assert signer.read("garbage", now=1001) is None
    assert same_secret(session.csrf, session.csrf)
    assert not same_secret(session.csrf, None)
    assert not same_secret(session.csrf, "")


def test_the_step_chart_prefers_loss_and_scales_into_its_box():
    steps = [(0, {"lr": 0.1, "loss": 2.0}), (50, {"lr": 0.1, "loss": 1.0}), (100, {"loss": 0.0})]
    chart = views.step_chart(steps)
    assert chart is not None
    assert (chart.metric, chart.first_step, chart.last_step) == ("loss", 0, 100)
    assert chart.points.split() == ["0.0,0.0", "300.0,80.0", "600.0,160.0"]
    assert views.step_chart([(1, {"loss": 1.0})]) is None  # one point is no line
    assert views.step_chart([(1, {}), (2, {})]) is None


def test_steps_trained_again_after_a_resume_are_drawn_once_by_step_as_last_reported():
    # Attempt 1 reported steps 1-12 and died after its checkpoint at 10; attempt 2
    # resumed from 10 and reported 11-14: the line runs 1..14, never back.
    first = [(step, {"loss": 1.0}) for step in range(1, 13)]
    second = [(step, {"loss": 2.0}) for step in range(11, 15)]
    chart = views.step_chart([*first, *second], checkpoints=[5, 10], resumes=[10])
    assert chart is not None
    assert (chart.first_step, chart.last_step) == (1, 14)
    points = [tuple(float(v) for v in p.split(",")) for p in chart.points.split()]
    xs = [x for x, _ in points]
    assert len(xs) == 14
    assert xs == sorted(set(xs))
    # 11 and 12 as attempt 2 reported them (2.0, the top of the box), not attempt 1
    assert [y for _, y in points] == [160.0] * 10 + [0.0] * 4
    assert [(m.kind, m.step) for m in chart.marks] == [
        ("checkpoint", 5),
        ("checkpoint", 10),
        ("resume", 10),
    ]


def test_sizes_are_shown_in_the_unit_that_shows_them():
    assert [views.byte_size(n) for n in (0, 1023, 1024, 4300, 2 * 2**20, 3 * 2**30, 5 * 2**40)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "4.2 KiB",
        "2.0 MiB",
        "3.0 GiB",
        "5120.0 GiB",
    ]


def test_checkpoints_and_resumes_are_marked_only_within_the_steps_drawn():
    steps = [(100, {"loss": 2.0}), (200, {"loss": 1.0}), (300, {"loss": 0.5})]
    chart = views.step_chart(steps, checkpoints=[50, 200, 200], resumes=[300])
    assert chart is not None
    assert [(m.kind, m.step, m.x) for m in chart.marks] == [
        ("checkpoint", 200, views.CHART_WIDTH / 2),
        ("resume", 300, float(views.CHART_WIDTH)),
    ]


def test_the_checkpoint_table_says_what_each_checkpoint_is_bound_to() -> None:
    at = datetime(2026, 12, 5, 1, 0, tzinfo=UTC)
    digest = "sha256:" + "ab" * 32
    rows = views.checkpoint_rows(
        [
            ("pod-a", {"step": 10, "sizeBytes": 2048, "durationSeconds": 0.1}, at),
            (
                "pod-a",
                {
                    "step": 20,
                    "sizeBytes": 2048,
                    "durationSeconds": 0.1,
                    "binding": {
                        "dataset_version": "mnist@v2",
                        "code_version": digest,
                        "params_sha256": None,
                    },
                },
                at,
            ),
        ],
        {"pod-a": 1},
    )
    newest, oldest = rows
    assert newest.binding == (
        ("dataset", "mnist@v2"),
        ("code", "sha256:abababababa…"),
        ("params", "unset"),
    )
    assert oldest.binding == ()  # a runtime that did not report one: "not reported"
