"""The client commands' settings and the config file, on the standard library alone.

kubetrain/settings.py describes every setting; this is the client's part of it
(url, token, project, timeout: a flag, else KUBETRAIN_*, else the config file's
[client] table, else the default) and the file both sides read. It is apart
because a command that asks the server one question must answer in a few
interpreter starts (bench/cli_start.py), and pydantic-settings alone takes
longer than that to import. The rules are pydantic-settings' as ServerSettings
keeps them: environment names matched without regard to case, an unknown key
refused, a number accepted as pydantic's lax mode does; a refusal is a pydantic
`ValidationError` with pydantic's own words (pydantic_core is imported only then).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_URL",
    "ClientSettings",
    "Secret",
    "config_path",
    "config_table",
    "describe_invalid",
]

CONFIG_ENV = "KUBETRAIN_CONFIG"
DEFAULT_URL = "http://127.0.0.1:8080"
_ENV_PREFIX = "kubetrain_"  # matched in lower case, as pydantic-settings does
_DEFAULTS: dict[str, Any] = {"url": DEFAULT_URL, "token": None, "project": None, "timeout": 30.0}


def config_path() -> Path:
    """Where the config file is looked for (it need not exist)."""
    if explicit := os.environ.get(CONFIG_ENV):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kubetrain" / "config.toml"


def config_table(table: str) -> dict[str, Any]:
    """One table of the config file ({} without a file); ValueError naming the file
    if it cannot be read or is not TOML."""
    path = config_path()
    try:
        file = path.open("rb")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ValueError(f"config file {path}: {exc}") from None
    import tomllib  # here: most machines have no config file

    try:
        with file:
            document = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"config file {path}: {exc}") from None
    found = document.get(table, {})
    if not isinstance(found, dict):
        raise ValueError(f"config file {path}: [{table}] must be a table")
    return found


class Secret:
    """A string that never shows in a repr or a log line (pydantic's SecretStr, lighter)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __str__(self) -> str:
        return "**********" if self._value else ""


class ClientSettings:
    """What the client commands (submit, get, history, cancel, logs, ...) read.

    `ClientSettings(**flags)` reads the environment and the config file under the
    given values; ValueError for a config file that cannot be read, pydantic's
    ValidationError (a ValueError) for a value that is not valid.
    """

    __slots__ = ("project", "timeout", "token", "url")

    url: str
    token: Secret | None
    project: str | None
    timeout: float

    def __init__(self, **flags: Any) -> None:
        environment = {name.lower(): value for name, value in os.environ.items()}
        values = {
            **_DEFAULTS,
            **config_table("client"),
            **{
                field: environment[_ENV_PREFIX + field]
                for field in _DEFAULTS
                if _ENV_PREFIX + field in environment
            },
            **flags,
        }
        errors: list[dict[str, Any]] = []
        for field in ("url", "token", "project"):
            value = values[field]
            if not isinstance(value, str) and not (value is None and field != "url"):
                errors.append({"type": "string_type", "loc": (field,), "input": value})
        timeout = _number(values["timeout"], errors)
        errors += [
            {"type": "extra_forbidden", "loc": (key,), "input": value}
            for key, value in values.items()
            if key not in _DEFAULTS
        ]
        if errors:
            from pydantic_core import ValidationError

            raise ValidationError.from_exception_data(type(self).__name__, errors)  # type: ignore[arg-type]
        self.url = values["url"]
        self.token = None if values["token"] is None else Secret(values["token"])
        self.project = values["project"]
        self.timeout = timeout

    @classmethod
    def load(cls, **flags: Any) -> ClientSettings:
        """The settings, with each flag that was given (not None) taking precedence."""
        return cls(**{key: value for key, value in flags.items() if value is not None})

    def __repr__(self) -> str:
        return (
            f"ClientSettings(url={self.url!r}, token={self.token!r}, "
            f"project={self.project!r}, timeout={self.timeout!r})"
        )


def describe_invalid(exc: ValueError, what: str) -> str:
    """A refusal of settings as one line: each field and pydantic's words for it (a
    ValidationError), else the message itself (a config file that cannot be read)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    problems = "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
        for error in errors(include_url=False, include_input=False)
    )
    return f"{what} settings are not valid: {problems}"


def _number(value: Any, errors: list[dict[str, Any]]) -> float:
    """A timeout as pydantic's lax float with gt=0 takes it; the refusal added to `errors`."""
    where = ("timeout",)
    if isinstance(value, int | float | str):  # bool is an int, 1.0 to pydantic too
        try:
            number = float(value)
        except ValueError:
            errors.append({"type": "float_parsing", "loc": where, "input": value})
            return 0.0
        if not number > 0:  # nan included
            errors.append(
                {"type": "greater_than", "loc": where, "input": value, "ctx": {"gt": 0.0}}
            )
        return number
    errors.append({"type": "float_type", "loc": where, "input": value})
    return 0.0
