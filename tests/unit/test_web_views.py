"""The dashboard's arithmetic: chip colours, counts, timeline lanes, bars, demand,
quotas, the checkpoint table and its folding, and the session cookie's signature."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace

import pytest

from kubetrain.api.web import views
from kubetrain.api.web.sessions import SessionSigner, same_secret
from kubetrain.domain.states import BusinessState as S
from kubetrain.domain.states import ReasonCode as R

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


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


def _row(step: int, pod: str = "pod-b") -> views.CheckpointRow:
    return views.CheckpointRow(step, "17.6 KiB", "0.01 s", 2, pod, NOW)


def test_checkpoints_fold_to_the_newest_few_and_the_one_a_resume_started_from() -> None:
    # 40 checkpoints newest first (200 down to 5); attempt 2 resumed from step 60 of pod-a.
    rows = [_row(step, "pod-b" if step > 60 else "pod-a") for step in range(200, 0, -5)]
    folded = views.fold_checkpoints(rows, [(60, "pod-a")])
    assert [r.step for r in folded.shown] == [200, 195, 190, 60]
    assert [r.step for r in folded.shown if r.resumed_from] == [60]
    assert folded.total == 40
    assert len(folded.more) == 36
    assert 60 not in [r.step for r in folded.more]
    assert [r.step for r in folded.more] == sorted((r.step for r in folded.more), reverse=True)
    # A step another Pod saved is not the checkpoint the resume read.
    assert not any(r.resumed_from for r in views.fold_checkpoints(rows, [(60, "pod-c")]).shown)
    # A resume whose writer the lineage does not know matches by step.
    assert views.fold_checkpoints(rows, [(60, None)]).shown[-1].step == 60


def test_never_more_than_ten_checkpoint_rows_open() -> None:
    rows = [_row(step) for step in range(100, 0, -1)]
    folded = views.fold_checkpoints(rows, [(step, None) for step in range(10, 90, 5)])
    assert len(folded.shown) == views.MOST_OPEN_ROWS
    assert [r.step for r in folded.shown[:3]] == [100, 99, 98]
    assert folded.total == 100
    few = views.fold_checkpoints(rows[:2], [])
    assert (len(few.shown), few.more) == (2, [])
