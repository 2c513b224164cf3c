"""domain/names.py's control-character check against Unicode's own categories."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from kubetrain.domain.names import control_character_problem

pytestmark = pytest.mark.unit


def by_category(value: str, *, multiline: bool = False) -> str | None:
    """The check as Unicode's categories define it (Cc and Cs), character by character."""
    for index, char in enumerate(value):
        if multiline and char in "\t\n":
            continue
        if unicodedata.category(char) in ("Cc", "Cs"):
            allowed = " (tab and newline are allowed here)" if multiline else ""
            return f"contains the control character U+{ord(char):04X} at {index}{allowed}"
    return None


@pytest.mark.parametrize("multiline", [False, True])
def test_every_code_point_is_judged_as_by_its_unicode_category(multiline: bool) -> None:
    # Cc and Cs lie in the Basic Multilingual Plane: all of it, and a sample beyond.
    for code in [*range(0x10000), *range(0x10000, sys.maxunicode + 1, 61)]:
        value = f"ab{chr(code)}"
        assert control_character_problem(value, multiline=multiline) == by_category(
            value, multiline=multiline
        ), hex(code)


def test_the_first_control_character_is_named_with_its_place() -> None:
    assert control_character_problem("ok\ttab\x7f") == "contains the control character U+0009 at 2"
    assert control_character_problem("ok\ttab\x7f", multiline=True) == (
        "contains the control character U+007F at 6 (tab and newline are allowed here)"
    )
    assert control_character_problem("line\nline\u00e9\U0001f600") is not None
    assert control_character_problem("line\nline\u00e9\U0001f600", multiline=True) is None
