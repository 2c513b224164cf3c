"""Why a Pod was refused before scheduling: ResourceQuota, LimitRange, Kueue.

The Job controller's `FailedCreate` event carries the API server's refusal
verbatim. ResourceQuota admission writes (plugin/pkg/admission/resourcequota)

    pods "x" is forbidden: exceeded quota: gpu-quota, requested:
    requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=0, limited:
    requests.nvidia.com/gpu=2

with several resources joined by "," (no space) in each section, or
`failed quota: NAME: must specify limits.cpu for: trainer; requests.cpu for:
trainer` (v1.33; older releases: `must specify limits.cpu,requests.cpu`) when
the quota tracks a resource the Pod does not declare. LimitRange admission writes
`maximum cpu usage per Container is 2, but limit is 4`. Kueue keeps the Job
suspended and says on its Workload's `QuotaReserved` condition
`couldn't assign flavors to pod set main: insufficient unused quota for
nvidia.com/gpu in flavor default-flavor, 4 more needed` (waitable) or
`... request > maximum capacity (16 > 8)` (never).

The numbers are read so the diagnosis can say "needs 4 GPUs; quota gpu-quota
allows 2", and whether waiting can help: a request above the hard limit on its
own never fits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from kubetrain.domain.quantity import QuantityError, parse_quantity

__all__ = ["AdmissionRefusal", "QuotaResource", "parse_admission_refusal", "parse_kueue_message"]


@dataclass(frozen=True)
class QuotaResource:
    resource: str  # as the quota names it: requests.nvidia.com/gpu, limits.memory, pods
    requested: Decimal | None
    used: Decimal | None
    limit: Decimal | None

    @property
    def never(self) -> bool:
        """The request alone is above the hard limit: no amount of waiting helps."""
        return self.requested is not None and self.limit is not None and self.requested > self.limit


@dataclass(frozen=True)
class AdmissionRefusal:
    kind: str  # "quota" | "quota-unspecified" | "limit-range" | "kueue" | "other"
    name: str | None  # the ResourceQuota (or ClusterQueue flavor) that refused
    resources: tuple[QuotaResource, ...]
    waitable: bool | None
    message: str

    @property
    def is_quota(self) -> bool:
        return self.kind in ("quota", "quota-unspecified", "limit-range", "kueue")


_EXCEEDED = re.compile(
    r"exceeded quota: (?P<name>[^,]+), requested: (?P<requested>.*?), used: (?P<used>.*?), "
    r"limited: (?P<limited>[^\s]*)",
    re.DOTALL,
)
_UNSPECIFIED = re.compile(r"failed quota: (?P<name>[^:]+): must specify (?P<what>[^\n]+)")
_LIMIT_RANGE = re.compile(
    r"(?P<bound>maximum|minimum) (?P<resource>\S+) usage per "
    r"(?P<scope>Container|Pod|PersistentVolumeClaim) "
    r"is (?P<limit>\S+), but (?:limit|request) is (?P<requested>[^\s.,]+)"
)
_KUEUE_MORE = re.compile(
    r"insufficient unused quota for (?P<resource>\S+) in flavor (?P<flavor>[^,\s]+), "
    r"(?P<more>\S+) more needed"
)
_KUEUE_NEVER = re.compile(
    r"insufficient quota for (?P<resource>\S+) in flavor (?P<flavor>[^,\s]+), "
    r"(?:request|previously considered podsets requests \((?P<previous>[^)]*)\) \+ current podset "
    r"request \((?P<current>[^)]*)\)) > maximum capacity \((?:(?P<request>[^\s)]+) > "
    r")?(?P<max>[^)\s]+)\)"
)


def _quantity(text: str) -> Decimal | None:
    try:
        return parse_quantity(text)
    except QuantityError:
        return None


def _pairs(section: str) -> dict[str, Decimal | None]:
    found: dict[str, Decimal | None] = {}
    for item in section.split(","):
        key, sep, value = item.strip().partition("=")
        if sep and key:
            found[key] = _quantity(value)
    return found


def _unspecified(what: str) -> list[str]:
    """The resources of `limits.cpu for: a,b; requests.cpu for: a` or `limits.cpu,requests.cpu`."""
    found: list[str] = []
    for part in what.split(";"):
        named = part.split(" for: ")[0].strip()
        found += [r for r in (r.strip() for r in named.split(",")) if r and " " not in r]
    return found


def parse_admission_refusal(message: str) -> AdmissionRefusal:
    """Read a FailedCreate message; an unknown refusal is kind "other", kept verbatim."""
    if not isinstance(message, str):
        return AdmissionRefusal("other", None, (), None, "")
    if match := _EXCEEDED.search(message):
        asked, used, limited = (_pairs(match[k]) for k in ("requested", "used", "limited"))
        resources = tuple(
            QuotaResource(r, asked.get(r), used.get(r), limited.get(r))
            for r in dict.fromkeys([*asked, *limited])
        )
        waitable = not any(r.never for r in resources)
        return AdmissionRefusal("quota", match["name"].strip(), resources, waitable, message)
    if match := _UNSPECIFIED.search(message):
        resources = tuple(QuotaResource(r, None, None, None) for r in _unspecified(match["what"]))
        return AdmissionRefusal(
            "quota-unspecified", match["name"].strip(), resources, False, message
        )
    if match := _LIMIT_RANGE.search(message):
        limit, requested = _quantity(match["limit"]), _quantity(match["requested"])
        resource = QuotaResource(match["resource"], requested, None, limit)
        return AdmissionRefusal("limit-range", None, (resource,), False, message)
    return AdmissionRefusal("other", None, (), None, message)


def parse_kueue_message(message: str) -> AdmissionRefusal | None:
    """Read a Kueue Workload condition message; None when it is not about quota."""
    if not isinstance(message, str):
        return None
    if match := _KUEUE_NEVER.search(message):
        if match["request"] is not None:
            requested = _quantity(match["request"])
        else:  # since Kueue 0.14: earlier pod sets' requests + this one's
            previous, current = (
                _quantity(match["previous"] or ""),
                _quantity(match["current"] or ""),
            )
            requested = previous + current if previous is not None and current is not None else None
        resource = QuotaResource(match["resource"], requested, None, _quantity(match["max"]))
        return AdmissionRefusal("kueue", match["flavor"], (resource,), False, message)
    if match := _KUEUE_MORE.search(message):
        resource = QuotaResource(match["resource"], None, None, None)
        return AdmissionRefusal("kueue", match["flavor"], (resource,), True, message)
    return None
