"""Takes credentials out of any text the runtime writes: log lines, reports, termination message.

Two kinds: the values of environment variables whose names are a credential's
(`HF_TOKEN`, `WANDB_API_KEY`, `DB_PASSWORD`), and whatever
credentials.py recognises by shape (bearer tokens, URL userinfo, `key=value`
pairs named like secrets), whatever their source.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubetrain.runtime.credentials import MASK, is_credential_name, redact_text

# Shorter values would mask digits and words all over the text ("1", "true").
MIN_SECRET_LENGTH = 4


class Redactor:
    """Masks the secret values of one environment, plus secrets recognisable by their shape."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        values = {
            value
            for name, value in environ.items()
            if is_credential_name(name) and len(value) >= MIN_SECRET_LENGTH
        }
        # Longest first: a secret that contains another is masked whole.
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, MASK)
        return redact_text(text)
