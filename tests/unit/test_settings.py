"""Settings: flags over the environment over the config file over the defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from kubetrain.client import Client, ClientError
from kubetrain.settings import DEFAULT_URL, ClientSettings, ServerSettings, config_path
from tests.isolated import isolated_settings

__all__ = ["isolated_settings"]  # the autouse fixture, for pytest

pytestmark = pytest.mark.unit


def write_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("KUBETRAIN_CONFIG", str(path))


def test_defaults(tmp_path: Path) -> None:
    server = ServerSettings()
    assert server.database_url == f"sqlite:///{tmp_path / 'data' / 'kubetrain' / 'kubetrain.db'}"
    assert (server.host, server.port, server.max_body_bytes) == ("127.0.0.1", 8080, 256 * 1024)
    assert server.kubeconfig is None
    assert server.namespace_for("ai-training") == "ai-training"
    client = ClientSettings()
    assert (client.url, client.token, client.project) == (DEFAULT_URL, None, None)


def test_flags_over_environment_over_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_config(
        monkeypatch,
        tmp_path,
        '[server]\nport = 9000\nhost = "127.0.0.2"\nkubeconfig = "/from/file"\n'
        '[client]\nurl = "http://from-file:1"\nproject = "from-file"\n',
    )
    monkeypatch.setenv("KUBETRAIN_PORT", "9100")
    monkeypatch.setenv("KUBECONFIG", "/from/env")
    monkeypatch.setenv("KUBETRAIN_PROJECT", "from-env")
    server = ServerSettings.load(port=9200, host=None)
    assert (server.port, server.host, server.kubeconfig) == (9200, "127.0.0.2", "/from/env")
    assert ServerSettings.load(kubeconfig="/from/flag").kubeconfig == "/from/flag"
    client = ClientSettings.load(project=None)
    assert (client.url, client.project) == ("http://from-file:1", "from-env")


def test_the_token_is_kept_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBETRAIN_TOKEN", "kt_secret-value")
    client = ClientSettings()
    assert client.token is not None
    assert client.token.get_secret_value() == "kt_secret-value"
    assert "kt_secret-value" not in repr(client)


def test_projects_map_to_namespaces(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_config(monkeypatch, tmp_path, '[server]\nnamespaces = {ai-training = "team-ai"}\n')
    monkeypatch.setenv("KUBETRAIN_NAMESPACE_PREFIX", "kt-")
    server = ServerSettings()
    assert server.namespace_for("ai-training") == "team-ai"
    assert server.namespace_for("vision") == "kt-vision"
    with pytest.raises(ValueError, match="63"):
        ServerSettings(namespace_prefix="x" * 60).namespace_for("vision")
    with pytest.raises(ValidationError, match="namespace of project"):
        ServerSettings(namespaces={"a": "Not_A_Label"})


def test_render_options_are_checked_when_loaded() -> None:
    settings = ServerSettings(
        status_url="https://kubetrain.example/status", accelerator_label="gpu.example/type"
    )
    options = settings.render_options()
    assert (options.status_url, options.accelerator_label) == (
        "https://kubetrain.example/status",
        "gpu.example/type",
    )
    with pytest.raises(ValidationError, match="status_url"):
        ServerSettings(status_url="ftp://user:pw@host/")
    with pytest.raises(ValidationError, match="gpu_resource"):
        ServerSettings(gpu_resource="gpu")


def test_a_projects_default_queue_is_rendered_for_its_namespace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write_config(
        monkeypatch,
        tmp_path,
        '[server]\nnamespaces = {ai-training = "team-ai"}\n'
        'queues = {ai-training = "team-ai-gpus", kube-system = "q"}\n',
    )
    options = ServerSettings().render_options()
    # A project whose namespace is closed (reserved) gets no queue: it has no jobs.
    assert options.default_queues == (("team-ai", "team-ai-gpus"),)
    with pytest.raises(ValidationError, match="default queue"):
        ServerSettings(queues={"ai-training": "Not A Queue"})


def test_a_typo_in_the_file_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_config(monkeypatch, tmp_path, '[client]\nprojekt = "x"\n')
    with pytest.raises(ValidationError, match="projekt"):
        ClientSettings()
    ServerSettings()  # the other table is untouched
    write_config(monkeypatch, tmp_path, "[client\n")
    with pytest.raises(ValueError, match="config file"):
        ClientSettings()


def test_the_config_file_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBETRAIN_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "kubetrain" / "config.toml"
    monkeypatch.setenv("KUBETRAIN_CONFIG", "~/kt.toml")
    assert config_path() == Path.home() / "kt.toml"


def test_the_stall_threshold_defaults_to_half_an_hour_and_zero_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ServerSettings().stall_after_seconds == 1800
    monkeypatch.setenv("KUBETRAIN_STALL_AFTER_SECONDS", "0")
    assert ServerSettings().stall_after_seconds == 0
    monkeypatch.setenv("KUBETRAIN_STALL_AFTER_SECONDS", "-1")
    with pytest.raises(ValidationError, match="stall_after_seconds"):
        ServerSettings()


def test_webhooks_reach_no_closed_network_unless_the_environment_opens_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ServerSettings().webhook_networks() == ()
    monkeypatch.setenv("KUBETRAIN_WEBHOOK_ALLOWED_NETWORKS", '["127.0.0.0/8", "fd00::/8"]')
    assert [str(n) for n in ServerSettings().webhook_networks()] == ["127.0.0.0/8", "fd00::/8"]
    monkeypatch.setenv("KUBETRAIN_WEBHOOK_ALLOWED_NETWORKS", '["10.0.0.1/8"]')
    with pytest.raises(ValidationError, match="webhook_allowed_networks"):
        ServerSettings()


class _AsPydanticSaysIt(BaseModel):
    """ClientSettings' fields as a pydantic model: its refusals are the words ClientSettings
    must use (it does without pydantic to start fast, kubetrain/client_settings.py)."""

    model_config = ConfigDict(extra="forbid")

    url: str = DEFAULT_URL
    token: SecretStr | None = None
    project: str | None = None
    timeout: float = Field(default=30.0, gt=0)


@pytest.mark.parametrize(
    "values",
    [
        {"timeout": "0"},
        {"timeout": -1},
        {"timeout": "nan"},
        {"timeout": "ten"},
        {"timeout": ""},
        {"timeout": [1]},
        {"url": 5, "projekt": "x"},
        {"token": 3, "project": True, "url": None},
    ],
)
def test_client_settings_refuse_in_pydantics_words(values: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as ours:
        ClientSettings(**values)
    with pytest.raises(ValidationError) as pydantics:
        _AsPydanticSaysIt(**values)
    assert ours.value.errors() == pydantics.value.errors()


@pytest.mark.parametrize("timeout", ["1e3", " 30 ", "2.5", 5, 0.5, True])
def test_client_settings_take_a_timeout_as_pydantic_does(timeout: object) -> None:
    assert ClientSettings(timeout=timeout).timeout == _AsPydanticSaysIt(timeout=timeout).timeout


def test_client_environment_names_are_not_case_sensitive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # As pydantic-settings reads them (and ServerSettings still does).
    write_config(monkeypatch, tmp_path, "[client]\ntimeout = 5\n")
    monkeypatch.setenv("kubetrain_project", "lower")
    monkeypatch.setenv("Kubetrain_Timeout", "7")
    client = ClientSettings()
    assert (client.project, client.timeout) == ("lower", 7.0)


def test_a_bad_client_setting_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBETRAIN_TIMEOUT", "0")
    with pytest.raises(ClientError) as refused:
        Client()
    assert str(refused.value) == (
        "client settings are not valid: timeout: Input should be greater than 0"
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("KUBETRAIN_URL", "localhost:8080", "URL 'localhost:8080' is not an http:// or https://"),
        ("KUBETRAIN_TOKEN", "kt_secret\nX-Evil: 1", "KUBETRAIN_TOKEN is not a token"),
        ("KUBETRAIN_TOKEN", "", "no API token"),
    ],
)
def test_the_client_refuses_a_url_or_token_it_cannot_use(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv("KUBETRAIN_TOKEN", "kt_secret")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ClientError, match=message) as refused:
        Client()
    assert "kt_secret" not in str(refused.value)
