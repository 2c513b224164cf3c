"""A resume against the checkpoint it read: what differed, and whether that was allowed.

The rule is the runtime's (kubetrain.runtime.checkpoint, CheckpointManager.resume):

* the node (and the Pod, the attempt) may differ: resuming elsewhere is the point;
* the world size must match, always (each rank resumes its own shard);
* the dataset version, the code version and the params digest must match, unless the
  run let that field differ (`allow_mismatch`); a field the checkpoint or the run left
  unset is not compared.

Only what was recorded is compared: a value nobody reported is "not reported", never
guessed. A runtime older than the binding in its resume report reports none of it:
one "binding: not reported" stands for its four fields.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# The binding fields the runtime compares, as the runtime names them, and as we say them.
BINDING_FIELDS = {
    "dataset_version": "dataset version",
    "code_version": "code version",
    "params_sha256": "params digest",
}
_SHOWN = 16  # characters of a value shown in a line; digests are cut


class Rule(StrEnum):
    MAY_DIFFER = "may differ"
    MUST_MATCH = "must match"
    MUST_MATCH_UNLESS_ALLOWED = "must match unless allowed"


class Verdict(StrEnum):
    SAME = "same"
    ALLOWED = "differs, allowed"
    ALLOWED_BY_RUN = "differs, allowed by the run"
    NOT_ALLOWED = "differs, not allowed"  # the runtime would have refused: worth a look
    UNSET = "not compared"  # the checkpoint or the run left it unset
    NOT_REPORTED = "not reported"


@dataclass(frozen=True)
class Compared:
    """One field, as the checkpoint (or the Pod that wrote it) had it and as the
    resuming attempt had it."""

    field: str
    checkpoint: str | None
    resumed: str | None
    rule: Rule
    verdict: Verdict

    def line(self) -> str:
        """One short line, e.g. "code version: sha256:aaaa… -> sha256:bbbb… (allowed by
        the run's allow_mismatch)"."""
        if self.verdict is Verdict.NOT_REPORTED:
            return f"{self.field}: not reported"
        if self.verdict is Verdict.UNSET:
            return f"{self.field}: not compared (unset in the checkpoint or the run)"
        if self.verdict is Verdict.SAME:
            return f"{self.field}: {_short(self.checkpoint)} (same)"
        why = {
            Verdict.ALLOWED: "allowed",
            Verdict.ALLOWED_BY_RUN: "allowed by the run's allow_mismatch",
            Verdict.NOT_ALLOWED: f"not allowed: {self.rule}",
        }[self.verdict]
        return f"{self.field}: {_short(self.checkpoint)} -> {_short(self.resumed)} ({why})"

    def to_json(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "checkpoint": self.checkpoint,
            "resumed": self.resumed,
            "rule": str(self.rule),
            "verdict": str(self.verdict),
            "says": self.line(),
        }


def compare_resume(
    *,
    from_node: str | None,
    node: str | None,
    checkpoint_binding: Mapping[str, Any] | None,
    binding: Mapping[str, Any] | None,
    allowed: Collection[str] | None,
) -> list[Compared]:
    """What differed between a checkpoint and the attempt that resumed from it.

    `from_node`, `node`: where the writing and the resuming Pods ran (None: not
    recorded). `checkpoint_binding`, `binding`: the checkpoint's binding and the run's,
    as the runtime reported them (None: not reported). `allowed`: the fields the run
    let differ and that did (None: not reported)."""
    compared = [_node(from_node, node)]
    if checkpoint_binding is None or binding is None:
        # One line for the four fields: the runtime reports them together or not at all.
        compared.append(Compared("binding", None, None, Rule.MUST_MATCH, Verdict.NOT_REPORTED))
        return compared
    for name, said in BINDING_FIELDS.items():
        was, now = _text(checkpoint_binding.get(name)), _text(binding.get(name))
        if was is None or now is None:
            verdict = Verdict.UNSET
        elif was == now:
            verdict = Verdict.SAME
        elif allowed is not None and name in allowed:
            verdict = Verdict.ALLOWED_BY_RUN
        else:
            verdict = Verdict.NOT_ALLOWED
        compared.append(Compared(said, was, now, Rule.MUST_MATCH_UNLESS_ALLOWED, verdict))
    # Absent or null: one process (the runtime writes it only for a gang).
    was = _text(checkpoint_binding.get("world_size") or 1)
    now = _text(binding.get("world_size") or 1)
    verdict = Verdict.SAME if was == now else Verdict.NOT_ALLOWED
    compared.append(Compared("world size", was, now, Rule.MUST_MATCH, verdict))
    return compared


def _node(was: str | None, now: str | None) -> Compared:
    if was is None or now is None:
        return Compared("node", was, now, Rule.MAY_DIFFER, Verdict.NOT_REPORTED)
    verdict = Verdict.SAME if was == now else Verdict.ALLOWED
    return Compared("node", was, now, Rule.MAY_DIFFER, verdict)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _short(value: str | None) -> str:
    if value is None:
        return "-"
    return value if len(value) <= _SHOWN else value[: _SHOWN - 1] + "…"
