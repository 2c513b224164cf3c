"""Kubernetes resource quantities, parsed the way the API server parses them.

The grammar is that of k8s.io/apimachinery/pkg/api/resource: a signed decimal
number followed by an optional binary suffix (Ki … Ei), decimal suffix
(n u m k M G T P E) or decimal exponent (e3, E-2). Values are held as exact
Decimals so that "500m" + "500m" == "1" and comparisons never round.

Two renderings: `canonical_cpu`/`canonical_bytes` give one spelling per amount
(what is stored, rendered into a Job and hashed into a spec digest);
`format_quantity` is compact text for messages.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from kubetrain.errors import KubetrainError

__all__ = [
    "QuantityError",
    "canonical_bytes",
    "canonical_cpu",
    "format_quantity",
    "parse_quantity",
    "quantity_text",
]

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
# The API server refuses quantities whose exponent leaves int64 scale; we refuse
# anything past 10^18 * 2^10 magnitude for the same reason (and so "1e999" is an
# error, not a Decimal that overflows later arithmetic).
_MAX_EXPONENT = 21
_MAX_LENGTH = 64
# "No quantity may represent a number greater than 2^63-1 in magnitude"
# (apimachinery's Quantity); past it, Decimal arithmetic at its default
# precision would also fail (DivisionImpossible) instead of refusing.
_MAX_MAGNITUDE = Decimal(2**63 - 1)

# The units canonical_bytes may write, largest first: every binary suffix, and the
# decimal ones that make a whole number of bytes (not n, u, m).
_BINARY_UNITS = tuple(
    (suffix, 1024**power) for suffix, power in sorted(_BINARY.items(), key=lambda i: -i[1])
)
_DECIMAL_UNITS = tuple(
    (suffix, 10**power)
    for suffix, power in sorted(_DECIMAL.items(), key=lambda i: -i[1])
    if power > 0
)


class QuantityError(KubetrainError, ValueError):
    """A string that is not a Kubernetes quantity; the message says what is allowed."""


def quantity_text(value: str | int | float) -> str:
    """A quantity as text: YAML and JSON give `4` and `0.5` as numbers, and Kubernetes
    accepts both spellings. Not for booleans (callers refuse those first)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return value.strip()


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a quantity ("500m", "16Gi", "1e3", 8) into an exact Decimal."""
    if isinstance(text, bool):
        raise QuantityError("expected a quantity such as 500m, 16Gi or 8, got a boolean")
    if not isinstance(text, str | int | float):
        raise QuantityError(f"expected a quantity string, got {type(text).__name__}")
    return _parsed(text)


# Kept per spelling: a submission's few amounts (cpu, memory, a cache's size) are
# parsed when validated and again for its digest, and they repeat across jobs.
@lru_cache(maxsize=1024, typed=True)
def _parsed(text: str | int | float) -> Decimal:
    raw = quantity_text(text)
    if not raw or len(raw) > _MAX_LENGTH:
        raise QuantityError(
            f"expected a quantity of at most {_MAX_LENGTH} characters such as 500m, 16Gi or 8"
        )
    match = _QUANTITY.match(raw)
    if match is None:
        raise QuantityError(
            f"{raw!r} is not a Kubernetes quantity: use a number with an optional suffix "
            "(n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei) or exponent (e3)"
        )
    try:
        number = Decimal(match["number"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{raw!r} is not a number") from exc
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        value = number * (Decimal(1024) ** _BINARY[suffix])
    else:
        exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(
                f"{raw!r} is out of range: exponents beyond ±{_MAX_EXPONENT} are refused"
            )
        value = number.scaleb(exponent)
    if abs(value) > _MAX_MAGNITUDE:
        raise QuantityError(f"{raw!r} is out of range: a quantity is at most 2^63-1 (about 8Ei)")
    return value


def format_quantity(value: Decimal) -> str:
    """Render a Decimal compactly for messages: 16Gi stays 16Gi, 0.5 becomes 500m."""
    try:
        return _formatted(value)
    except TypeError:  # a signalling NaN cannot be hashed
        return _format(value)


# Kept per amount: the fit table words the same few amounts for every group of nodes.
@lru_cache(maxsize=1024, typed=True)
def _formatted(value: Decimal) -> str:
    return _format(value)


def _format(value: Decimal) -> str:
    for suffix, power in sorted(_BINARY.items(), key=lambda item: -item[1]):
        unit = Decimal(1024) ** power
        if value >= unit and value % unit == 0:
            return f"{int(value // unit)}{suffix}"
    if value != value.to_integral_value():
        milli = value * 1000
        if milli == milli.to_integral_value():
            return f"{int(milli)}m"
    normal = value.normalize()
    return f"{normal:f}"


def canonical_cpu(text: str) -> str:
    """One spelling per amount of a validated cpu quantity, as the API server stores it:
    4, 500m, 1500m."""
    millis = int(parse_quantity(text) * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def canonical_bytes(value: str | int) -> str:
    """One spelling per amount of a validated byte quantity: the shortest of its largest
    binary and decimal suffix forms.

    16Gi stays 16Gi and 16G stays 16G (not 15625000Ki); a tie goes to binary.
    """
    amount = value if isinstance(value, int) else int(parse_quantity(value))
    candidates = [str(amount)]
    for units in (_BINARY_UNITS, _DECIMAL_UNITS):
        for suffix, unit in units:
            if amount and amount % unit == 0:
                candidates.append(f"{amount // unit}{suffix}")
                break
    return min(candidates, key=len)
