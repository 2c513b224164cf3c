"""The one rule for what a credential looks like, wherever kubetrain must recognise one.

Used by the runtime's redaction (runtime/redact.py: log lines, reports, the
termination message), the server's log redaction (kubetrain.logs) and the
TrainingJob's check for credentials in plain `env` values (domain/spec), so
that what one of them calls a secret, all do. Standard library only, like the
rest of kubetrain.runtime, which must import nothing of the server side; the
server imports this module.

Names: the last word (split at `_`, `-`, `.` and camelCase) is a credential
word (TOKEN, PASSWORD, PASS, SECRET, KEY, ...), a trailing FILE aside
(PASSWORD_FILE); a tokenizer's vocabulary (PAD_TOKEN) and keys that are not
secrets (SORT_KEY) are left alone, as is anything that only mentions a word
(MAX_TOKENS, TOKENIZER, SECRET_NAME, KEY_PATH).

Text: bearer and basic credentials, kubetrain's API tokens (kt_), JWTs (the
Pods' ServiceAccount tokens among them), the userinfo of a URL, Cookie headers
and kubetrain's cookies, and `name=value` / `name: value` pairs whose name is a
credential's.
"""

from __future__ import annotations

import re

MASK = "***"

_CREDENTIAL_WORDS = frozenset(
    {
        "TOKEN",
        "PASSWORD",
        "PASSWD",
        "PASS",
        "PASSPHRASE",
        "SECRET",
        "KEY",
        "APIKEY",
        "CREDENTIAL",
        "CREDENTIALS",
        "AUTH",
        "COOKIE",
    }
)
# A language model's special tokens and counts of tokens are words, not secrets.
_VOCABULARY = frozenset(
    {"PAD", "BOS", "EOS", "UNK", "SEP", "CLS", "MASK", "START", "END", "STOP", "SPECIAL", "NEW"}
)
# Keys that index things rather than unlock them.
_PLAIN_KEYS = frozenset(
    {"PUBLIC", "SORT", "CACHE", "PARTITION", "PRIMARY", "ROUTING", "SHARD", "LOOKUP", "GROUP"}
)
_WORD = re.compile(r"[A-Z]+[0-9]*(?![a-z])|[A-Z]?[a-z]+[0-9]*|[0-9]+")


def is_credential_name(name: str) -> bool:
    """Whether a variable, field or parameter of this name holds a credential."""
    words = [word.upper() for word in _WORD.findall(name)]
    if len(words) > 1 and words[-1] == "FILE":
        words.pop()  # PASSWORD_FILE: where the secret is, and as much a secret's name
    if not words or words[-1] not in _CREDENTIAL_WORDS:
        return False
    before = words[-2] if len(words) > 1 else ""
    if words[-1] == "TOKEN":
        return before not in _VOCABULARY
    if words[-1] == "KEY":
        return before not in _PLAIN_KEYS
    return True


_SHAPES = (
    # Authorization headers, whatever the token type
    (re.compile(r"(?i)\b(bearer\s+)[^\s,;\"']+"), rf"\1{MASK}"),
    (re.compile(r"\b(Basic )[A-Za-z0-9+/]{8,}=*"), rf"\1{MASK}"),
    # kubetrain's API tokens (kt_)
    (re.compile(r"\b(kt_)[A-Za-z0-9_\-]{8,}"), rf"\1{MASK}"),
    # JWTs: ServiceAccount and OIDC tokens
    (re.compile(r"\beyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*"), MASK),
    # the userinfo of a URL (postgresql://user:secret@host/db)
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@]+@"), rf"\1{MASK}@"),
    # Cookie headers whole, and the dashboard's cookies wherever they are quoted
    (re.compile(r"(?im)^(\s*(?:set-)?cookie\s*:\s*).+$"), rf"\1{MASK}"),
    (re.compile(r"\b(kubetrain_(?:session|signin)=)[^\s;,&\"']+"), rf"\1{MASK}"),
)
# `name=value`, `name: value`, `"name": "value"`; the value is masked when the name is a
# credential's. Only the name and separator are matched, so a pair that is not a
# credential's never swallows the next one ("error: password=x").
_PAIR = re.compile(r"\b(?P<name>[A-Za-z_][\w.\-]*)[\"']?\s*[=:]\s*[\"']?")
_VALUE = re.compile(r"[^\s,;\"'&]+")


def redact_text(text: str) -> str:
    """`text` with every credential it quotes replaced by ***, each kept's prefix
    (`Bearer ***`, `kt_***`, `password=***`) saying what was there."""
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return _mask_pairs(text)


def _mask_pairs(text: str) -> str:
    out: list[str] = []
    done = 0
    for pair in _PAIR.finditer(text):
        if pair.start() < done or not is_credential_name(pair["name"]):
            continue
        value = _VALUE.match(text, pair.end())
        if value is None or value.group() == MASK:
            continue
        out += [text[done : value.start()], MASK]
        done = value.end()
    return "".join(out) + text[done:] if out else text


_USER_ONLY = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@:]+@")


def holds_credential(value: str) -> bool:
    """Whether a value quotes a credential by its shape (a URL with a password, a token,
    `password=...`), whatever its name says. A URL's user name alone is no secret."""
    plain = _USER_ONLY.sub(r"\1", value)
    return redact_text(plain) != plain
