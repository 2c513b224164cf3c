"""Which namespaces a project may map to (domain/projects.py)."""

from __future__ import annotations

import pytest

from kubetrain.domain.projects import DEFAULT_RESERVED_NAMESPACES, namespace_refusal
from kubetrain.settings import ServerSettings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "namespace",
    ["default", "kube-system", "kube-public", "kubetrain", "kueue-system", "cert-manager"],
)
def test_system_namespaces_are_reserved_even_when_everything_is_allowed(namespace: str):
    refusal = namespace_refusal(namespace, allowed=["*"], reserved=DEFAULT_RESERVED_NAMESPACES)
    assert refusal is not None
    assert "reserved" in refusal


def test_a_namespace_must_match_an_allowed_pattern():
    assert namespace_refusal("team-a", allowed=["team-*"], reserved=[]) is None
    refusal = namespace_refusal("research", allowed=["team-*"], reserved=[])
    assert refusal == "namespace 'research' is not among the namespaces open to jobs"


def test_settings_refuse_a_project_mapped_into_a_reserved_namespace():
    settings = ServerSettings(namespaces={"ai": "kube-system"}, database_url="sqlite://")
    assert not settings.project_open("ai")
    with pytest.raises(ValueError, match="reserved"):
        settings.namespace_for("ai")
    assert settings.project_open("ai-training")
    prefixed = ServerSettings(namespace_prefix="kubetrain-", database_url="sqlite://")
    assert not prefixed.project_open("vision")
