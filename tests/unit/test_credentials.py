"""One credential rule (kubetrain.runtime.credentials) for the spec's plain-env check, the
server's log redaction and the runtime's redaction: what one calls a secret, all do."""

from __future__ import annotations

import pytest

from kubetrain.domain.spec.fields import looks_like_credential
from kubetrain.logs import redact
from kubetrain.runtime.credentials import is_credential_name
from kubetrain.runtime.redact import Redactor

pytestmark = pytest.mark.unit

CREDENTIALS = [
    "MY_TOKEN",
    "OPENAI_KEY",
    "DB_PASS",
    "TOKEN",
    "PASSWORD_FILE",
    "HF_TOKEN",
    "WANDB_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "KUBETRAIN_STATUS_TOKEN_FILE",
    "apiKey",
    "client-secret",
]
PLAIN = ["PAD_TOKEN", "MAX_TOKENS", "TOKENIZER", "KEY_PATH", "SECRET_NAME", "SORT_KEY", "HOME"]
VALUE = "s3cr3t-value"


@pytest.mark.parametrize("name", CREDENTIALS + PLAIN)
def test_every_detector_agrees_on_every_name(name: str) -> None:
    secret = name in CREDENTIALS
    assert is_credential_name(name) is secret
    assert looks_like_credential(name, "plain") is secret
    assert (VALUE not in redact(f"{name}={VALUE}")) is secret
    assert (VALUE not in Redactor({name: VALUE})(f"saw {VALUE}")) is secret


@pytest.mark.parametrize(
    "text",
    [
        f"postgresql://user:{VALUE}@db/x",
        f"Authorization: Bearer {VALUE}",
        f"kt_{VALUE}",
        f"kubetrain_session={VALUE}",
    ],
)
def test_every_detector_agrees_on_shapes(text: str) -> None:
    assert VALUE not in redact(text)
    assert VALUE not in Redactor({})(text)
    assert looks_like_credential("ANYTHING", text)
