"""The runtime's redaction: secret-looking env values, URL userinfo, bearer tokens, key=value."""

from __future__ import annotations

import pytest

from kubetrain.runtime.redact import Redactor

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("token tok-abcdef in the middle", "token *** in the middle"),
        ("https://alice:pw1@host/x", "https://***@host/x"),
        ("postgresql://u@db:5432/k", "postgresql://***@db:5432/k"),
        ("Authorization: Bearer eyJhbGciOi.x.y", "Authorization: Bearer ***"),
        ("password=hunter2 and API_KEY: abc", "password=*** and API_KEY: ***"),
        ('{"token": "zzz"}', '{"token": "***"}'),
        ("steps=1 lr=0.1 HOME=/root", "steps=1 lr=0.1 HOME=/root"),  # nothing secret
    ],
)
def test_redaction(text, expected):
    redact = Redactor({"HF_TOKEN": "tok-abcdef", "HOME": "/root", "MY_KEY": "1"})
    assert redact(text) == expected
