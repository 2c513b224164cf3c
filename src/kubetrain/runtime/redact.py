"""Takes credentials out of any text the runtime writes: log lines, reports, termination message.

Three kinds: the values of environment variables whose names look secret
(`KUBETRAIN_STATUS_TOKEN`, `WANDB_API_KEY`, `DB_PASSWORD`), the userinfo of a
URL (`https://user:pass@host`), and bearer tokens or `key=value` pairs named
like secrets, whatever their source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|KEY|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE",
    re.IGNORECASE,
)
# Shorter values would mask digits and words all over the text ("1", "true").
MIN_SECRET_LENGTH = 4
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")
_BEARER = re.compile(r"(?P<word>\bBearer\s+)[^\s,;\"']+", re.IGNORECASE)
_ASSIGNMENT = re.compile(
    r"(?P<name>\b[\w.-]*(?:token|secret|password|passwd|api[_-]?key|credential)[\w.-]*"
    r"[\"']?\s*[=:]\s*[\"']?)[^\s,;\"'&]+",
    re.IGNORECASE,
)


class Redactor:
    """Masks the secret values of one environment, plus secrets recognisable by their shape."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        values = {
            value
            for name, value in environ.items()
            if SECRET_NAME.search(name) and len(value) >= MIN_SECRET_LENGTH
        }
        # Longest first: a secret that contains another is masked whole.
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, MASK)
        text = _USERINFO.sub(lambda m: m["scheme"] + MASK + "@", text)
        text = _BEARER.sub(lambda m: m["word"] + MASK, text)
        return _ASSIGNMENT.sub(lambda m: m["name"] + MASK, text)
