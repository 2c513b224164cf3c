"""How the client commands print: aligned tables for people, JSON and YAML for programs."""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from kubetrain.domain.facts import age as facts_age
from kubetrain.domain.facts import clock

CELL_LIMIT = 80  # a raw Kubernetes message can be kilobytes; tables show its start


def printable(text: str) -> str:
    """`text` with every control character but newline and tab written as `\\u001b`.

    What Kubernetes and a job's Pods said (messages, termination messages, Pod
    names in reports) reaches the terminal through us; an escape sequence in it
    must not recolour, retitle or rewrite the user's screen. The escape is
    JSON's, so JSON output stays JSON (json.dumps leaves DEL and C1 raw).
    """
    if text.isprintable():
        return text
    return "".join(
        f"\\u{ord(char):04x}"
        if char not in "\n\t" and unicodedata.category(char) in ("Cc", "Cs")
        else char
        for char in text
    )


def emit(data: Any, output: str, *, stream: TextIO | None = None) -> None:
    """JSON (indented, one document) or YAML of `data`."""
    out = stream or sys.stdout
    if output == "json":
        out.write(printable(json.dumps(data, indent=2, ensure_ascii=False)) + "\n")
    elif output == "yaml":
        import yaml  # here: a table or JSON needs none of it

        out.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    else:
        raise ValueError(f"unknown output format {output!r}")


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    text = printable(" ".join(str(value).split()))
    return text if len(text) <= CELL_LIMIT else text[: CELL_LIMIT - 1] + "…"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], *, stream: TextIO | None = None
) -> None:
    """Columns padded to their widest cell, like kubectl's."""
    out = stream or sys.stdout
    cells = [[cell(value) for value in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    for row in [list(headers), *cells]:
        out.write(
            "   ".join(
                value.ljust(width) for value, width in zip(row, widths, strict=True)
            ).rstrip()
        )
        out.write("\n")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def short_time(text: str | None) -> str | None:
    """An API timestamp as `2026-03-01 12:00:05` (UTC), for tables: the page's clock."""
    when = parse_time(text)
    return clock(when) if when else None


def age(text: str | None, *, now: datetime | None = None) -> str:
    """How long ago, as the dashboard says it: 42s, 7m, 5h 3m, 3d 2h."""
    return facts_age(parse_time(text), now or datetime.now(UTC))
