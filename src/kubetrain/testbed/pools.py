"""Node pools declared in YAML: groups of fake nodes (the Node objects KWOK manages)
and groups of real ones (a kubelet and a containerd each, see realnode.py)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kubetrain.domain.quantity import QuantityError, parse_quantity
from kubetrain.errors import KubetrainError

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
POOL_LABEL = "testbed.kubetrain.io/pool"
GROUP_LABEL = "testbed.kubetrain.io/group"

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class PoolError(KubetrainError, ValueError):
    """A pool file that cannot be used; the message names the file and the field."""


class Taint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=253)
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


# Each real node is a kubelet, a containerd and Pods on this machine's two cores.
MAX_REAL_NODES = 8


class NodeGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_DNS_LABEL, max_length=40)
    # kwok: Node objects whose kubelet KWOK plays; real: a kubelet and a containerd
    # per node, whose capacity is this machine's (so `capacity` is not given).
    kind: Literal["kwok", "real"] = "kwok"
    count: int = Field(ge=0, le=10_000)
    prefix: str | None = Field(default=None, pattern=_DNS_LABEL, max_length=40)
    labels: dict[str, str] = Field(default_factory=dict)
    capacity: dict[str, str] = Field(default_factory=dict)
    # Real nodes only: the devices the testbed's device plugin advertises as
    # nvidia.com/gpu (not real GPUs: a container sees none).
    gpus: int = Field(default=0, ge=0, le=16)
    taints: list[Taint] = Field(default_factory=list)

    @model_validator(mode="after")
    def _kind_fields(self) -> NodeGroup:
        if self.kind == "real":
            if self.capacity:
                raise ValueError(
                    "capacity: a real node's capacity is what its kubelet finds; leave it out"
                )
            if self.count > MAX_REAL_NODES:
                raise ValueError(f"count: at most {MAX_REAL_NODES} real nodes")
        else:
            if self.gpus:
                raise ValueError("gpus: only for kind: real (give kwok nodes a capacity)")
            for required in ("cpu", "memory", "pods"):
                if required not in self.capacity:
                    raise ValueError(f"capacity.{required} is required")
        return self

    @field_validator("capacity", mode="before")
    @classmethod
    def _quantities(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out: dict[str, str] = {}
        for resource, quantity in value.items():
            try:
                amount = parse_quantity(quantity)
            except QuantityError as exc:
                raise ValueError(f"capacity.{resource}: {exc}") from None
            if amount < 0:
                raise ValueError(f"capacity.{resource}: must not be negative")
            out[str(resource)] = str(quantity)
        return out

    def node_names(self) -> list[str]:
        prefix = self.prefix or self.name
        return [f"{prefix}-{index}" for index in range(self.count)]


class Pool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    apiVersion: Literal["testbed.kubetrain.io/v1"]
    kind: Literal["NodePool"]
    name: str = Field(pattern=_DNS_LABEL, max_length=40)
    description: str = ""
    groups: list[NodeGroup] = Field(min_length=1)

    @model_validator(mode="after")
    def _few_real_nodes(self) -> Pool:
        real = sum(g.count for g in self.groups if g.kind == "real")
        if real > MAX_REAL_NODES:
            raise ValueError(f"groups: at most {MAX_REAL_NODES} real nodes in all, not {real}")
        names = [n for g in self.groups for n in g.node_names()]
        if len(set(names)) != len(names):
            raise ValueError("groups: two groups give nodes the same name")
        return self

    def node_count(self) -> int:
        return sum(group.count for group in self.groups)

    def real_groups(self) -> list[NodeGroup]:
        return [g for g in self.groups if g.kind == "real" and g.count > 0]

    def labels(self, group: NodeGroup, node_name: str) -> dict[str, str]:
        return {
            **group.labels,
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": group.kind,
            POOL_LABEL: self.name,
            GROUP_LABEL: group.name,
        }

    def nodes(self) -> list[dict[str, Any]]:
        """The Node objects to create for KWOK's groups (real nodes register
        themselves): KWOK keeps capacity and allocatable as given."""
        nodes = []
        for group in self.groups:
            if group.kind == "real":
                continue
            for node_name in group.node_names():
                labels = self.labels(group, node_name)
                nodes.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {
                            "name": node_name,
                            "labels": labels,
                            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                        },
                        "spec": {"taints": [t.model_dump() for t in group.taints]},
                        "status": {
                            "capacity": dict(group.capacity),
                            "allocatable": dict(group.capacity),
                        },
                    }
                )
        return nodes


def builtin_pools() -> list[str]:
    folder = resources.files("kubetrain.testbed") / "pools"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load_pool(name_or_path: str) -> Pool:
    """Load a built-in pool by name (default, no-gpu, large) or a pool file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text()
        except OSError as exc:
            raise PoolError(f"cannot read pool file {path}: {exc.strerror}") from None
        source = str(path)
    else:
        resource = resources.files("kubetrain.testbed") / "pools" / f"{name_or_path}.yaml"
        if not resource.is_file():
            known = ", ".join(builtin_pools())
            raise PoolError(f"unknown pool {name_or_path!r}: use one of {known} or a .yaml path")
        text = resource.read_text()
        source = f"built-in pool {name_or_path}"
    return parse_pool(text, source)


def parse_pool(text: str, source: str = "pool") -> Pool:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PoolError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise PoolError(f"{source}: expected a mapping with apiVersion, kind, name, groups")
    try:
        return Pool.model_validate(data)
    except ValidationError as exc:
        raise PoolError(f"{source}: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown field")
        else:
            problems.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)
