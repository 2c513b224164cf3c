"""The one settings object of each side: the server's and the client commands'.

ServerSettings is here; ClientSettings and the config file's reader are in
kubetrain/client_settings.py (the standard library alone, so that the client
commands start fast) and re-exported here.

Each value comes from, highest first: a command-line flag (passed as a keyword),
the environment, the config file, the default.

    KUBETRAIN_DATABASE_URL   server  default: a SQLite file in the user's data directory
    KUBECONFIG               server  also --kubeconfig; else ~/.kube/config or in-cluster
    KUBETRAIN_HOST, _PORT    server  127.0.0.1, 8080
    KUBETRAIN_MAX_BODY_BYTES server  larger request bodies get 413
    KUBETRAIN_TOKEN_CACHE_SECONDS
                             server  how long a verified API token, or the Pod a
                                     report's token was found bound to, is taken on
                                     trust (5; 0: look every token up): a revocation
                                     or a deleted Pod takes effect within this
                                     (api/token_cache.py)
    KUBETRAIN_NAMESPACE_PREFIX, KUBETRAIN_NAMESPACES
                             server  project -> namespace: the mapping's entry, else
                                     prefix + project (by default the project's own name)
    KUBETRAIN_ALLOWED_NAMESPACES, KUBETRAIN_RESERVED_NAMESPACES
                             server  JSON lists of glob patterns: a project's namespace
                                     must match an allowed one (default ["*"]) and no
                                     reserved one (default: Kubernetes', kubetrain's and
                                     the usual add-ons' namespaces, domain/projects.py);
                                     kubetrain's own namespace in a cluster is always
                                     reserved
    KUBETRAIN_QUEUES         server  JSON project -> Kueue LocalQueue of its namespace: the
                                     queue of the project's jobs whose spec names none
                                     (no entry, no spec.queue: the Job is not queued)
    KUBETRAIN_STATUS_URL, _ACCELERATOR_LABEL, _GPU_RESOURCE
                             server  what every rendered Job carries (RenderOptions)
    KUBETRAIN_POD_SECURITY_ENFORCE, _WARN
                             server  the Pod Security levels (privileged, baseline,
                                     restricted) of the namespaces kubetrain makes
                                     (baseline, restricted)
    KUBETRAIN_LOG_FOLLOW_STREAMS_PER_TOKEN
                             server  how many `logs?follow=true` streams one API token may
                                     hold open at once on one replica (4); the next is a 429
    KUBETRAIN_STATUS_TOKEN_AUDIENCE
                             server  the audience of the ServiceAccount token projected
                                     into every Pod, which its reports prove the Pod's
                                     identity with ("kubetrain"; checked by TokenReview)
    KUBETRAIN_SESSION_SECRET server  key that signs the web pages' session cookies; give every
                                     API replica the same one (unset: a random key per process,
                                     so sessions end when it restarts)
    KUBETRAIN_STALL_AFTER_SECONDS
                             server  a training job with no step for this long is
                                     NO_PROGRESS, unless its spec.stallAfter says
                                     otherwise (1800; 0: never)
    KUBETRAIN_WEBHOOK_ALLOWED_NETWORKS
                             server  JSON list of CIDRs webhooks may reach although they are
                                     loopback, link-local, private, reserved... (default [],
                                     domain/networks.py); webhooks never reach those otherwise
    KUBETRAIN_WEBHOOK_TIMEOUT_SECONDS, _WEBHOOK_MAX_IN_FLIGHT
                             server  one delivery's deadline for the whole exchange (10), and
                                     how many webhooks are delivered to at once (64)
    KUBETRAIN_LOG_FORMAT     server  auto (text on a terminal, else JSON), json, text
    KUBETRAIN_LOG_LEVEL      server  debug, info (default), warning, error
    KUBETRAIN_URL            client  http://127.0.0.1:8080
    KUBETRAIN_TOKEN          client  the bearer token (never a flag: argv is visible to all)
    KUBETRAIN_PROJECT        client  default project of --project
    KUBETRAIN_TIMEOUT        client  seconds to wait for the server (30)

The config file is TOML, `$KUBETRAIN_CONFIG` or else
`$XDG_CONFIG_HOME/kubetrain/config.toml` (`~/.config/...`), with a table per
side and the same names in lower case without the prefix:

    [server]
    database_url = "postgresql://kubetrain@db/kubetrain"
    namespaces = {ai-training = "team-ai"}
    queues = {ai-training = "team-ai-gpus"}

    [client]
    url = "https://kubetrain.example"
    project = "ai-training"

A missing file is no error; an unknown key in it is (a typo must not pass as
a default).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from kubetrain.client_settings import (
    CONFIG_ENV,
    DEFAULT_URL,
    ClientSettings,
    config_path,
    config_table,
)
from kubetrain.domain import names, render_defaults
from kubetrain.domain.networks import Network, networks
from kubetrain.domain.projects import DEFAULT_RESERVED_NAMESPACES, namespace_refusal

if TYPE_CHECKING:
    from kubetrain.domain.manifest import RenderOptions

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_URL",
    "ClientSettings",
    "ServerSettings",
    "config_path",
]

# A TrainingJob is at most 256 KiB (domain.spec.MAX_YAML_BYTES); its JSON is no
# larger, and nothing else the API takes comes near.
DEFAULT_MAX_BODY_BYTES = 256 * 1024


class _ConfigFileTable(PydanticBaseSettingsSource):
    """One table of the config file, as keyword values (unknown keys fail validation)."""

    def __init__(self, settings_cls: type[BaseSettings], table: str) -> None:
        super().__init__(settings_cls)
        self._table = table

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole table

    def __call__(self) -> dict[str, Any]:
        return config_table(self._table)


class _Settings(BaseSettings):
    _table: ClassVar[str]

    model_config = SettingsConfigDict(
        env_prefix="KUBETRAIN_", extra="forbid", validate_default=True, populate_by_name=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _ConfigFileTable(settings_cls, cls._table)

    @classmethod
    def load(cls, **flags: Any) -> Any:
        """The settings, with each flag that was given (not None) taking precedence."""
        return cls(**{key: value for key, value in flags.items() if value is not None})


_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@functools.cache
@functools.lru_cache(maxsize=1024)
def _namespace_refusal(
    namespace: str, allowed: tuple[str, ...], reserved: tuple[str, ...]
) -> str | None:
    return namespace_refusal(namespace, allowed=allowed, reserved=reserved)


@functools.cache  # a Pod's namespace never changes: read once, not per request
def _own_namespace() -> tuple[str, ...]:
    """In a cluster, the namespace kubetrain itself runs in: always reserved."""
    try:
        return (_SERVICE_ACCOUNT_NAMESPACE.read_text().strip(),)
    except OSError:
        return ()


def _default_database_url() -> str:
    # Imported here: the client commands never need the store (SQLAlchemy, Alembic).
    from kubetrain.store.db import default_sqlite_url

    return default_sqlite_url()


class ServerSettings(_Settings):
    """What `kubetrain serve`, the API and the control loops read."""

    _table = "server"

    database_url: str = Field(default_factory=_default_database_url)
    kubeconfig: str | None = Field(
        default=None, validation_alias=AliasChoices("kubeconfig", "KUBECONFIG")
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # The proxies whose X-Forwarded-For/-Proto are believed (uvicorn's list: IPs,
    # CIDRs or "*"); behind a TLS-terminating ingress, its address, so that the
    # request's scheme is https and the session cookie gets Secure.
    forwarded_allow_ips: str = "127.0.0.1"
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    # A revocation must be felt soon: beyond a minute the cache would be a policy.
    token_cache_seconds: float = Field(default=5.0, ge=0, le=60)
    namespace_prefix: str = ""
    namespaces: dict[str, str] = {}
    # Glob patterns (domain/projects.py): a project's namespace must match an
    # allowed pattern and no reserved one; reserved wins.
    allowed_namespaces: list[str] = ["*"]
    reserved_namespaces: list[str] = list(DEFAULT_RESERVED_NAMESPACES)
    queues: dict[str, str] = {}
    status_url: str | None = None
    status_token_audience: str = render_defaults.TOKEN_AUDIENCE
    accelerator_label: str = render_defaults.ACCELERATOR_LABEL
    gpu_resource: str = render_defaults.GPU_RESOURCE
    pod_security_enforce: Literal["privileged", "baseline", "restricted"] = "baseline"
    pod_security_warn: Literal["privileged", "baseline", "restricted"] = "restricted"
    # Each follow stream is a connection through the API server to a kubelet for as long
    # as the container runs; a person follows a few workers, not hundreds.
    log_follow_streams_per_token: int = Field(default=4, ge=1, le=1000)
    session_secret: SecretStr | None = Field(default=None, min_length=32)
    # Half an hour without a step is rare in healthy training (even a long checkpoint
    # save or evaluation); a job that needs longer says so in spec.stallAfter.
    stall_after_seconds: int = Field(default=1800, ge=0)
    # Webhook URLs are tenants' choices, sent from inside the platform's network:
    # none of its own networks is reachable unless opened here (domain/networks.py).
    webhook_allowed_networks: list[str] = []
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    webhook_max_in_flight: int = Field(default=64, ge=1, le=1024)
    log_format: Literal["auto", "json", "text"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("namespaces")
    @classmethod
    def _namespaces_are_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for project, namespace in value.items():
            if problem := names.dns1123_label_problem(namespace):
                raise ValueError(f"namespace of project {project!r}: {problem}")
        return value

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _allowed_are_networks(cls, value: list[str]) -> list[str]:
        networks(value)  # ValueError naming the first that is no CIDR
        return value

    def webhook_networks(self) -> tuple[Network, ...]:
        """The networks opened to webhooks, parsed."""
        return networks(self.webhook_allowed_networks)

    @model_validator(mode="after")
    def _render_options_are_valid(self) -> ServerSettings:
        self.render_options()  # RenderOptions checks itself; fail at start, not per Job
        return self

    def render_options(self) -> RenderOptions:
        # Imported here: the renderer pulls in the TrainingJob models and PyYAML.
        from kubetrain.domain.manifest import RenderOptions

        return RenderOptions(
            gpu_resource=self.gpu_resource,
            accelerator_label=self.accelerator_label,
            status_url=self.status_url,
            pod_security_enforce=self.pod_security_enforce,
            pod_security_warn=self.pod_security_warn,
            token_audience=self.status_token_audience,
            default_queues=tuple(
                (namespace, queue)
                for project, queue in sorted(self.queues.items())
                if (namespace := self._open_namespace(project)) is not None
            ),
        )

    def _open_namespace(self, project: str) -> str | None:
        try:
            return self.namespace_for(project)
        except ValueError:
            return None

    def namespace_for(self, project: str) -> str:
        """The namespace a project's Jobs run in; ValueError if that is no DNS label
        or not open to jobs."""
        namespace = self.namespaces.get(project, self.namespace_prefix + project)
        if problem := names.dns1123_label_problem(namespace):
            raise ValueError(f"namespace {problem}")
        if refusal := self.namespace_refusal(namespace):
            raise ValueError(refusal)
        return namespace

    def project_open(self, project: str) -> bool:
        """Whether jobs may exist in `project`: its namespace is allowed, not reserved.
        (A project that maps to no DNS label at all is for namespace_for to refuse,
        naming the field.)"""
        namespace = self.namespaces.get(project, self.namespace_prefix + project)
        return self.namespace_refusal(namespace) is None

    def namespace_refusal(self, namespace: str) -> str | None:
        # Asked twice per submission (namespace_for, project_open): the globs are
        # matched once per namespace and settings.
        reserved = (*self.reserved_namespaces, *_own_namespace())
        return _namespace_refusal(namespace, tuple(self.allowed_namespaces), reserved)
