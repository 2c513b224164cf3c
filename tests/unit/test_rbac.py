"""The RBAC of deploy/base grants exactly what kubetrain's code calls: derived here from
the call sites in src/kubetrain/cluster and control, compared both ways.

Two kinds of call reach the API server: lightkube's typed client
(`client.get(Lease, ...)`, `client.create(obj)`) and the reflectors' raw list
and watch of the paths in cluster/cache.py. A call whose resource this reading
cannot tell fails the test: keep call sites plain enough to read.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import yaml

from kubetrain.cluster import cache

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ROOMS = [ROOT / "src/kubetrain/cluster", ROOT / "src/kubetrain/control"]
RBAC = ROOT / "deploy/base/rbac.yaml"

# lightkube client method -> Kubernetes verb
VERBS = {
    "get": "get",
    "list": "list",
    "watch": "watch",
    "create": "create",
    "replace": "update",
    "patch": "patch",
    "apply": "patch",
    "delete": "delete",
    "deletecollection": "deletecollection",
}
# Subresources read through a method of their own: client.log(pod) is GET pods/log.
SUBRESOURCE_CALLS = {"log": ("", "pods/log", "get")}
# Namespaced in kubetrain's own namespace (a Role); everything else is cluster-wide.
OWN_NAMESPACE = {("coordination.k8s.io", "leases")}

HTTP_REQUESTS = {"get", "stream", "post", "put", "patch", "delete", "request", "send"}

Triple = tuple[str, str, str]  # (API group, resource, verb)


def _resource_classes(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Names imported from lightkube.resources.* -> (group, plural)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "lightkube.resources."
        ):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                info = getattr(module, alias.name)._api_info
                # A subresource's class (JobStatus) is its own rule: jobs/status.
                plural = f"{info.plural}/{info.action}" if info.action else info.plural
                out[alias.asname or alias.name] = (info.resource.group, plural)
    return out


def _is_client(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "client") or (
        isinstance(node, ast.Attribute) and node.attr == "client"
    )


def _named_resources(node: ast.AST, classes: dict[str, tuple[str, str]]) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in classes}


def _resource_of(
    arg: ast.expr, function: ast.AST, classes: dict[str, tuple[str, str]], where: str
) -> tuple[str, str]:
    """The resource a call's first argument names: a class, an instance made by one,
    or a variable assigned from either in the same function."""
    found = _named_resources(arg, classes)
    if not found and isinstance(arg, ast.Name):
        for node in ast.walk(function):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == arg.id for t in targets):
                found |= _named_resources(node.value or node, classes)  # type: ignore[attr-defined]
    if len(found) != 1:
        pytest.fail(f"{where}: cannot tell which resource this call touches (found {found})")
    return classes[found.pop()]


def typed_calls() -> set[Triple]:
    needed = set()
    for room in ROOMS:
        for path in sorted(room.glob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            classes = _resource_classes(tree)
            for function in ast.walk(tree):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for call in ast.walk(function):
                    if (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and call.func.attr in SUBRESOURCE_CALLS
                        and _is_client(call.func.value)
                    ):
                        needed.add(SUBRESOURCE_CALLS[call.func.attr])
                        continue
                    if not (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and call.func.attr in VERBS
                        and _is_client(call.func.value)
                    ):
                        continue
                    where = f"{path.relative_to(ROOT)}:{call.lineno}"
                    group, plural = _resource_of(call.args[0], function, classes, where)
                    needed.add((group, plural, VERBS[call.func.attr]))
    return needed


def _group_and_resource(path: str) -> tuple[str, str]:
    """(API group, resource) of a path: `/api/v1/pods` -> ("", "pods"),
    `/apis/batch/v1/namespaces/{}/jobs?...` -> ("batch", "jobs")."""
    parts = path.split("?")[0].strip("/").split("/")
    return ("" if parts[0] == "api" else parts[1]), parts[-1]


def raw_calls() -> set[Triple]:
    """The reflectors list and watch each path of the cache."""
    needed = set()
    for _, path, _ in cache._RESOURCES:
        group, resource = _group_and_resource(path)
        needed |= {(group, resource, "list"), (group, resource, "watch")}
    return needed


def _raw_http_calls() -> list[tuple[Path, ast.Call]]:
    """Every `http.<request>(...)` of the rooms: a plain client's call."""
    out = []
    for room in ROOMS:
        for path in sorted(room.glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in HTTP_REQUESTS
                    and isinstance(node.func.value, ast.Attribute | ast.Name)
                    and getattr(node.func.value, "attr", getattr(node.func.value, "id", ""))
                    == "http"
                ):
                    out.append((path, node))
    return out


def raw_creates() -> set[Triple]:
    """The plain client's POSTs (cluster/jobs.py's create of a Job, as bytes), read from
    their path: a literal, or an f-string whose literal parts name the resource."""
    needed = set()
    for path, call in _raw_http_calls():
        if path.name == "reflector.py":
            continue  # its list and watch: raw_calls
        where = f"{path.relative_to(ROOT)}:{call.lineno}"
        assert call.func.attr == "post", f"{where}: a plain client's call other than a create"  # type: ignore[attr-defined]
        target = call.args[0] if call.args else None
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            url = target.value
        elif isinstance(target, ast.JoinedStr):
            url = "".join(
                str(v.value) if isinstance(v, ast.Constant) else "{}" for v in target.values
            )
        else:
            pytest.fail(f"{where}: cannot tell which path this call touches")
        needed.add((*_group_and_resource(url), "create"))
    return needed


def test_the_plain_client_lists_and_watches_in_the_reflector_and_creates_jobs_only():
    where = {path.name for path, _ in _raw_http_calls()}
    assert where == {"reflector.py", "jobs.py"}
    assert raw_creates() == {("batch", "jobs", "create")}


def needed() -> set[Triple]:
    return typed_calls() | raw_calls() | raw_creates()


def granted(kind: str) -> set[Triple]:
    out = set()
    for document in yaml.safe_load_all(RBAC.read_text()):
        if document["kind"] != kind:
            continue
        for rule in document["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out |= {(group, resource, verb) for verb in rule["verbs"]}
    return out


def test_the_code_calls_what_this_reading_expects():
    # A guard on the reading itself: if it found nothing, both sides could agree on nothing.
    calls = needed()
    assert ("coordination.k8s.io", "leases", "update") in calls
    assert ("batch", "jobs", "create") in calls
    assert ("", "pods", "watch") in calls
    assert ("", "namespaces", "create") in calls
    assert ("", "services", "create") in calls
    assert ("", "pods/log", "get") in calls
    assert ("", "nodes", "get") in calls


def test_the_cluster_role_grants_exactly_the_cluster_wide_calls():
    wanted = {t for t in needed() if t[:2] not in OWN_NAMESPACE}
    have = granted("ClusterRole")
    assert wanted - have == set(), "missing from the ClusterRole"
    assert have - wanted == set(), "granted but never called"


def test_the_role_grants_exactly_the_lease_calls():
    wanted = {t for t in needed() if t[:2] in OWN_NAMESPACE}
    have = granted("Role")
    assert wanted - have == set(), "missing from the Role"
    assert have - wanted == set(), "granted but never called"


def test_the_lease_can_be_read_and_renewed_only_by_its_name():
    from kubetrain.control.runner import ControlLoops

    (role,) = [d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "Role"]
    for rule in role["rules"]:
        if set(rule["verbs"]) & {"get", "update"}:
            assert rule["resourceNames"] == [ControlLoops.lease_name]


def test_the_bindings_bind_the_service_account_to_its_roles():
    documents = list(yaml.safe_load_all(RBAC.read_text()))
    roles = {(d["kind"], d["metadata"]["name"]) for d in documents if "rules" in d}
    bindings = [d for d in documents if d["kind"].endswith("Binding")]
    assert {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings} == roles
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "kubetrain", "namespace": "kubetrain"}
        ]
