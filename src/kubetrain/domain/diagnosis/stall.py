"""A training job whose reports stopped: NO_PROGRESS in place of TRAINING.

Only a Pod that said it trains (its runtime reported TRAINING) can be said to
have stopped: an image without kubetrain's runtime never reports a step, and its
silence means nothing. The clock starts at the later of the job's last step and
the Pod's TRAINING report, so a new attempt is given its own threshold to reach
its first step. The detail names the step and its time (not an age), so that a
resync of a job still stalled writes nothing new.

A job is never failed for it; with spec.cancelAfterStall, `cancel_for_no_progress`
says when the control loop cancels one that stays stalled.
"""

from __future__ import annotations

from datetime import UTC, datetime

from kubetrain.domain.diagnosis.outcome import _Outcome
from kubetrain.domain.diagnosis.reading import _Finding, _gone, _Reader
from kubetrain.domain.diagnosis.result import Diagnosis
from kubetrain.domain.objects import meta_name
from kubetrain.domain.states import BusinessState, ReasonCode


def _stalled(reader: _Reader, outcome: _Outcome, now: datetime) -> _Outcome:
    """`outcome` with NO_PROGRESS as its primary when a training job's steps stopped."""
    job = reader.job
    reported = job.reported_phase
    if (
        job.stall_after is None
        or outcome.state is not BusinessState.RUNNING
        or not any(f.reason is ReasonCode.TRAINING for f in outcome.findings)
        or reported is None
        or reported[1] != "TRAINING"
        or not any(meta_name(p) == reported[0] and not _gone(p) for p in reader.pods)
    ):
        return outcome
    moments = [m for m in (reported[2], job.last_step[1] if job.last_step else None) if m]
    if not moments:
        return outcome
    last = max(moments)
    if (now - last).total_seconds() <= job.stall_after:
        return outcome
    threshold = _duration(job.stall_after)
    at = last.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if job.last_step is not None and job.last_step[1] >= (reported[2] or last):
        detail = f"no step for over {threshold}: the last, step {job.last_step[0]}, came at {at}"
    else:
        detail = f"no step for over {threshold} since Pod {reported[0]} began training at {at}"
    finding = _Finding(ReasonCode.NO_PROGRESS, detail, since=last)
    # In place of TRAINING, first: a restarting sidecar beside it stays a blocker.
    others = [f for f in outcome.findings if f.reason is not ReasonCode.TRAINING]
    return _Outcome(outcome.state, [finding, *others], outcome.stage)


def cancel_for_no_progress(
    reason: ReasonCode,
    since: datetime | None,
    *,
    stall_after: int | None,
    cancel_after_stall: int | None,
    now: datetime,
) -> str | None:
    """The history message of cancelling a job (spec.cancelAfterStall) that has been
    NO_PROGRESS for `cancel_after_stall` seconds, or None while that is not due.

    `since` is the diagnosis' since for NO_PROGRESS: the last progress (the later of
    the last step and the TRAINING report). The job became NO_PROGRESS once
    `stall_after` seconds had passed from it, so the wait is counted from there, not
    from whenever a resync first noticed: a control loop that was down for an hour
    does not give a stalled job an extra hour."""
    if (
        reason is not ReasonCode.NO_PROGRESS
        or since is None
        or stall_after is None
        or cancel_after_stall is None
    ):
        return None
    if (now - since).total_seconds() <= stall_after + cancel_after_stall:
        return None
    at = since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return (
        f"cancelled for no progress: NO_PROGRESS for over {_duration(cancel_after_stall)} "
        f"(spec.cancelAfterStall), no step since {at} (stall threshold "
        f"{_duration(stall_after)})"
    )


def _duration(seconds: int) -> str:
    """3600 -> "1h", 5400 -> "1h30m", 90 -> "1m30s": the spelling spec.stallAfter takes."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)
    return text or "0s"


def _diverged(reader: _Reader, outcome: _Outcome) -> _Outcome:
    """`outcome` with LOSS_NOT_FINITE as its primary when a running job's last step
    reported a loss that is NaN or infinite (it goes before NO_PROGRESS: a job that
    diverged and then stopped reporting diverged first)."""
    found = reader.job.non_finite_loss
    if (
        found is None
        or outcome.state is not BusinessState.RUNNING
        or outcome.findings[0].reason not in (ReasonCode.TRAINING, ReasonCode.NO_PROGRESS)
    ):
        return outcome
    step, metric, value, at = found
    finding = _Finding(
        ReasonCode.LOSS_NOT_FINITE,
        f"step {step} reported {metric} = {value}",
        waitable=False,
        since=at,
    )
    return _Outcome(outcome.state, [finding, *outcome.findings[1:]], outcome.stage)


def cancel_for_non_finite_loss(diagnosis: Diagnosis, *, cancel: bool) -> str | None:
    """The history message of cancelling a LOSS_NOT_FINITE job whose spec asks it
    (spec.cancelOnNonFiniteLoss), or None."""
    if not cancel or diagnosis.reason is not ReasonCode.LOSS_NOT_FINITE:
        return None
    detail = diagnosis.blockers[0].detail if diagnosis.blockers else ""
    said = detail or diagnosis.explanation.rpartition(". ")[2].rstrip(".")
    said = said[:1].upper() + said[1:]  # a sentence, as the explanation says it
    return f"cancelled for a non-finite loss: {said} (spec.cancelOnNonFiniteLoss)"
