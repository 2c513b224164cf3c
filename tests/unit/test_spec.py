"""The TrainingJob spec: what is accepted, what is refused, and that refusals name the field."""

from __future__ import annotations

import copy
import json
import random
from decimal import Decimal
from typing import Any

import pydantic
import pytest

from kubetrain.domain import spec as specmod
from kubetrain.domain.names import JOB_NAME_PREFIX, dns1123_label_problem
from kubetrain.domain.quantity import canonical_bytes, canonical_cpu
from kubetrain.domain.spec import (
    FieldProblem,
    SpecError,
    TrainingJob,
    duration_seconds,
    parse_training_job,
    parse_training_job_yaml,
    spec_digest,
)
from kubetrain.domain.spec.identity import _normalized

pytestmark = pytest.mark.unit

EXAMPLE_YAML = """\
apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: train-policy-v12, project: ai-training, labels: {}, annotations: {}}
spec:
  image: registry.example/trainer:2026-08
  command: [python, train.py]
  args: []
  env: [{name: EPOCHS, value: "10"}, {name: WANDB_API_KEY, secretRef: {name: wandb, key: token}}]
  resources: {requests: {cpu: "4", memory: 16Gi}, limits: {cpu: "8", memory: 32Gi},
              gpus: 1, gpuType: nvidia-h100}
  dataset: {name: imagenet, version: v3, claim: dataset-imagenet, subPath: v3}
  checkpoints: {claim: ckpt-train-policy}
  output: {claim: out-train-policy}
  cache: {size: 100Gi}
  priorityClass: batch-normal
  maxRuntime: 24h
  retries: 3
"""


def minimal() -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "train", "project": "ai-training"},
        "spec": {
            "image": "registry.example/trainer:1",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        },
    }


def full() -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load(EXAMPLE_YAML)
    return data


def put(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `data` with the dotted `path` set to `value` (or removed, for DELETE)."""
    out = copy.deepcopy(data)
    parts = path.split(".")
    node: Any = out
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    last = parts[-1]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


DELETE = object()


def problems(data: object, **kwargs: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_training_job(data, **kwargs)
    return {p.field: p.message for p in info.value.problems}


def refused(path: str, value: Any, base: dict[str, Any] | None = None) -> str:
    """The message for `path` when it is set to `value`; fails if another field is blamed."""
    found = problems(put(base or minimal(), path, value))
    assert found, "nothing was refused"
    field = specmod_path(path)
    assert field in found, f"expected a problem at {field}, got {found}"
    return found[field]


def specmod_path(path: str) -> str:
    out = ""
    for part in path.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


# -- accepted ---------------------------------------------------------------------------------


def test_the_example_of_the_issue_is_accepted():
    job = parse_training_job_yaml(EXAMPLE_YAML)
    assert job.metadata.name == "train-policy-v12"
    assert job.metadata.project == "ai-training"
    spec = job.spec
    assert spec.image == "registry.example/trainer:2026-08"
    assert spec.command == ["python", "train.py"]
    assert spec.env[0].value == "10"
    assert spec.env[1].secret_ref is not None
    assert (spec.env[1].secret_ref.name, spec.env[1].secret_ref.key) == ("wandb", "token")
    assert spec.resources.requests.cpu == "4"
    assert spec.resources.limits.memory == "32Gi"
    assert spec.resources.gpus == 1
    assert spec.resources.gpu_type == "nvidia-h100"
    assert spec.dataset is not None
    assert (spec.dataset.claim, spec.dataset.sub_path) == ("dataset-imagenet", "v3")
    assert spec.checkpoints is not None
    assert spec.checkpoints.claim == "ckpt-train-policy"
    assert spec.output is not None
    assert spec.output.claim == "out-train-policy"
    assert spec.cache is not None
    assert spec.cache.size == "100Gi"
    assert spec.priority_class == "batch-normal"
    assert spec.max_runtime == "24h"
    assert spec.retries == 3


def test_a_minimal_job_gets_the_documented_defaults():
    job = parse_training_job(minimal())
    spec = job.spec
    assert (spec.command, spec.args, spec.env) == ([], [], [])
    assert spec.resources.gpus == 0
    assert spec.resources.gpu_type is None
    assert spec.resources.limits.cpu is None
    assert spec.resources.limits.memory is None
    assert spec.dataset is None
    assert spec.checkpoints is None
    assert spec.output is None
    assert spec.cache is None
    assert spec.priority_class is None
    assert spec.max_runtime is None
    assert spec.retries == 0
    assert spec.workers == 1
    assert job.metadata.labels == {}
    assert job.metadata.annotations == {}


def test_it_dumps_back_to_the_wire_names_and_parses_again():
    job = parse_training_job_yaml(EXAMPLE_YAML)
    dumped = job.model_dump(mode="json", exclude_none=True)
    assert "apiVersion" in dumped
    assert "gpuType" in dumped["spec"]["resources"]
    assert parse_training_job(dumped) == job


def test_yaml_nulls_for_lists_and_maps_read_as_empty():
    data = put(put(minimal(), "metadata.labels", None), "spec.args", None)
    job = parse_training_job(put(data, "spec.env", None))
    assert job.metadata.labels == {}
    assert job.spec.args == []
    assert job.spec.env == []


def test_the_model_is_frozen():
    job = parse_training_job(minimal())
    with pytest.raises(pydantic.ValidationError):
        job.spec.retries = 5  # type: ignore[misc]


# -- errors are SpecErrors that name fields ---------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [None, [], "job", 5, 1.5, True, b"x", {"spec": []}, {"metadata": "x", "spec": {"image": 3}}],
)
def test_anything_malformed_is_a_spec_error(data):
    with pytest.raises(SpecError) as info:
        parse_training_job(data)
    assert info.value.problems
    assert all(isinstance(p, FieldProblem) for p in info.value.problems)


def test_a_spec_error_is_a_value_error_that_lists_each_field():
    error = SpecError([FieldProblem("spec.image", "bad"), FieldProblem("", "whole")])
    assert isinstance(error, ValueError)
    assert str(error) == "spec.image: bad; whole"


def assert_only_spec_errors(data: object) -> None:
    try:
        parse_training_job(data)
    except SpecError as exc:
        problems = exc.problems
        assert problems


def test_random_mutations_raise_nothing_but_spec_errors():
    """Whatever a client sends, the API gets a SpecError or a TrainingJob, never a 500."""
    rng = random.Random(1234)  # noqa: S311 - reproducible mutations, not secrets
    junk: list[Any] = [None, True, -1, 0, 1.5, "", "x" * 70, "\x00", [], {}, [1], {"a": 1}, 2**70]
    paths: list[list[str | int]] = []

    def collect(node: Any, path: list[str | int]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for key, value in node.items():
                collect(value, [*path, key])
        elif isinstance(node, list):
            for index, value in enumerate(node):
                collect(value, [*path, index])

    base = full()
    collect(base, [])
    for _ in range(400):
        data = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(paths[1:])
            node: Any = data
            try:
                for part in path[:-1]:
                    node = node[part]
                node[path[-1]] = rng.choice(junk)
            except (KeyError, IndexError, TypeError):
                continue
        assert_only_spec_errors(data)


def test_problems_are_capped():
    data = put(minimal(), "spec.env", [{"name": f"{i}BAD", "value": "x"} for i in range(150)])
    found = problems(data)
    assert len(found) <= specmod.MAX_PROBLEMS + 1
    assert "more problems" in found[""]


# -- top level and unknown fields -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("status", "apiVersion, kind, metadata, spec"),
        ("metadata.uid", "name, project, labels, annotations"),
        ("spec.replicas", "image, command, args, env"),
        ("spec.resources.gpu", "requests, limits, gpus, gpuType"),
        ("spec.resources.limits.ephemeral-storage", "cpu, memory"),
        ("spec.dataset.path", "name, version, claim, subPath"),
        ("spec.checkpoints.subPath", "claim"),
        ("spec.output.readOnly", "claim"),
        ("spec.cache.medium", "size"),
    ],
)
def test_unknown_fields_are_refused_and_the_allowed_ones_named(path, allowed):
    message = problems(put(full(), path, "x"))[path]
    assert message.startswith("unknown field")
    assert allowed in message


def test_gpus_are_not_a_request_of_their_own():
    data = full()
    data["spec"]["resources"]["requests"]["nvidia.com/gpu"] = 1
    message = problems(data)["spec.resources.requests.nvidia.com/gpu"]
    assert message == "unknown field; allowed here: cpu, memory"


def test_unknown_fields_in_list_items_are_refused():
    data = put(full(), "spec.env.0.valueFrom", {"secretKeyRef": {}})
    assert problems(data)["spec.env[0].valueFrom"].startswith("unknown field; allowed here: name")
    data = put(full(), "spec.env.1.secretRef.optional", True)
    assert "name, key" in problems(data)["spec.env[1].secretRef.optional"]


def test_snake_case_names_are_not_accepted_on_the_wire():
    data = put(minimal(), "spec.resources.gpu_type", "nvidia-h100")
    assert problems(data)["spec.resources.gpu_type"].startswith("unknown field")


@pytest.mark.parametrize(("field", "value"), [("apiVersion", "kubetrain.io/v2"), ("kind", "Job")])
def test_api_version_and_kind_are_fixed(field, value):
    message = refused(field, value)
    assert message.startswith("must be")


@pytest.mark.parametrize("field", ["apiVersion", "kind", "metadata", "spec"])
def test_top_level_fields_are_required(field):
    assert refused(field, DELETE).startswith("required")


def test_the_top_level_must_be_a_mapping():
    assert problems([minimal()]) == {"": "must be a mapping"}


# -- metadata ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "train-policy-v12", "x" * specmod.MAX_NAME_LENGTH, "0a"])
def test_names_that_are_dns_labels_once_prefixed_are_accepted(name):
    assert parse_training_job(put(minimal(), "metadata.name", name)).metadata.name == name
    assert dns1123_label_problem(JOB_NAME_PREFIX + name) is None


@pytest.mark.parametrize(
    "name",
    ["", "Train", "train_policy", "-train", "train-", "train.v1", "x" * 61, "tr ain", "train\n"],
)
def test_names_that_are_not_dns_labels_once_prefixed_are_refused(name):
    message = refused("metadata.name", name)
    assert "DNS-1123" in message or "at most 60" in message or "empty" in message


def test_a_name_of_61_characters_would_overflow_the_prefix():
    assert dns1123_label_problem(JOB_NAME_PREFIX + "x" * 61) is not None
    assert "at most 60" in refused("metadata.name", "x" * 61)


@pytest.mark.parametrize("project", ["Team", "team_a", "x" * 64, "", "a.b"])
def test_projects_must_be_dns_labels(project):
    refused("metadata.project", project)


def test_projects_of_kubernetes_own_namespaces_are_refused():
    assert "reserved" in refused("metadata.project", "kube-system")


def test_project_is_required_without_a_default():
    assert refused("metadata.project", DELETE) == "required"


def test_project_argument_fills_a_missing_project():
    data = put(minimal(), "metadata.project", DELETE)
    assert parse_training_job(data, project="vision").metadata.project == "vision"


def test_project_argument_must_match_a_given_project():
    found = problems(minimal(), project="vision")
    assert "submitted to project 'vision'" in found["metadata.project"]
    assert parse_training_job(minimal(), project="ai-training").metadata.project == "ai-training"


def test_project_mismatch_is_reported_with_the_other_problems():
    found = problems(put(minimal(), "spec.image", ""), project="vision")
    assert set(found) == {"metadata.project", "spec.image"}


@pytest.mark.parametrize(
    "key",
    ["team", "example.com/team", "app.kubernetes.io/name", "a_b.c-d", "x" * 63, "a/b"],
)
def test_label_keys_in_kubernetes_syntax_are_accepted(key):
    job = parse_training_job(put(minimal(), "metadata.labels", {key: "v"}))
    assert job.metadata.labels == {key: "v"}


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("kubetrain.io/job-id", "reserved for kubetrain"),
        ("sub.kubetrain.io/x", "reserved for kubetrain"),
        ("kubernetes.io/hostname", "reserved for Kubernetes"),
        ("batch.kubernetes.io/job-name", "reserved for Kubernetes"),
        ("k8s.io/x", "reserved for Kubernetes"),
        ("app.kubernetes.io/managed-by", "set by kubetrain"),
        ("job-name", "set by kubetrain or the Job controller"),
        ("controller-uid", "set by kubetrain or the Job controller"),
        ("bad key", "not a Kubernetes key"),
        ("-x", "not a Kubernetes key"),
        ("x" * 64, "not a Kubernetes key"),
        ("Example.com/x", "prefix"),
        ("/x", "prefix"),
        ("a/", "not a Kubernetes key"),
    ],
)
def test_label_and_annotation_keys_are_checked(key, says):
    for field in ("labels", "annotations"):
        found = problems(put(minimal(), f"metadata.{field}", {key: "v"}))
        assert says in found[f"metadata.{field}[{json.dumps(key)}]"]


@pytest.mark.parametrize("value", ["", "v1", "a.b_c-d", "x" * 63])
def test_label_values_in_kubernetes_syntax_are_accepted(value):
    job = parse_training_job(put(minimal(), "metadata.labels", {"k": value}))
    assert job.metadata.labels == {"k": value}


@pytest.mark.parametrize(
    ("value", "says"),
    [("x" * 64, "at most 63"), ("a b", "not a label value"), ("-a", "not a label value")],
)
def test_label_values_are_checked(value, says):
    assert says in problems(put(minimal(), "metadata.labels", {"k": value}))['metadata.labels["k"]']


def test_label_values_must_be_strings():
    found = problems(put(minimal(), "metadata.labels", {"version": 1.1}))
    assert "quote it" in found['metadata.labels["version"]']


def test_too_many_labels_are_refused():
    labels = {f"k{i}": "v" for i in range(specmod.MAX_LABELS + 1)}
    assert "at most 64" in refused("metadata.labels", labels)


def test_annotation_values_are_free_text_but_bounded():
    text = "line one\n\tline two: {json: true}"
    job = parse_training_job(put(minimal(), "metadata.annotations", {"note": text}))
    assert job.metadata.annotations["note"] == text
    big = {f"k{i}": "x" * 2000 for i in range(40)}
    assert "at most 65536" in refused("metadata.annotations", big)
    many = {f"k{i}": "" for i in range(specmod.MAX_ANNOTATIONS + 1)}
    assert "at most 64" in refused("metadata.annotations", many)


def test_control_characters_in_annotation_values_are_refused():
    found = problems(put(minimal(), "metadata.annotations", {"note": "a\x1b[31mred"}))
    assert "U+001B" in found['metadata.annotations["note"]']


# -- image, command, args ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "trainer",
        "registry.example/trainer:2026-08",
        "localhost:5000/team/trainer:v1.2",
        "ghcr.io/org/sub/trainer@sha256:" + "a" * 64,
        "registry.example/trainer:1@sha256:" + "0" * 64,
        "[::1]:5000/trainer",
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "UPPER.example/lower",
    ],
)
def test_image_references_are_accepted(image):
    assert parse_training_job(put(minimal(), "spec.image", image)).spec.image == image


@pytest.mark.parametrize(
    "image",
    [
        "",
        "Trainer",
        "registry.example/Trainer:1",
        "trainer:",
        "trainer:-bad",
        "trainer@sha256:abc",
        "train er",
        "trainer\n",
        " trainer",
        "registry.example/" + "a" * 300,  # a name over 255, a reference under 512
        "a" * 513,
    ],
)
def test_images_that_a_runtime_would_refuse_are_refused(image):
    refused("spec.image", image)


def test_image_must_be_a_string():
    assert "string" in refused("spec.image", 5)


def test_command_entries_may_not_be_empty_but_args_may():
    found = problems(put(minimal(), "spec.command", ["python", ""]))
    assert found == {"spec.command[1]": "must not be empty"}
    assert parse_training_job(put(minimal(), "spec.args", ["--name", ""])).spec.args[1] == ""


def test_multi_line_scripts_are_accepted_in_args():
    script = "set -e\n\tpython train.py\n"
    job = parse_training_job(put(minimal(), "spec.args", ["-c", script]))
    assert job.spec.args[1] == script


@pytest.mark.parametrize("bad", ["\x00", "\x1b[2J", "\r", "\x7f", "\x85", "\ud800"])
def test_control_characters_are_refused_in_command_and_args(bad):
    assert (
        "U+" in problems(put(minimal(), "spec.command", ["python", f"x{bad}"]))["spec.command[1]"]
    )
    assert "U+" in problems(put(minimal(), "spec.args", [f"x{bad}"]))["spec.args[0]"]


def test_command_and_args_are_bounded():
    assert "at most 256" in refused("spec.args", ["x"] * 257)
    assert "at most 32768" in problems(put(minimal(), "spec.args", ["x" * 32769]))["spec.args[0]"]
    assert "at most 65536" in refused("spec.command", ["x" * 30000] * 3)


def test_command_must_be_a_list_of_strings():
    assert refused("spec.command", "python train.py") == "must be a list"
    assert "string" in problems(put(minimal(), "spec.args", ["--epochs", 10]))["spec.args[1]"]


# -- env --------------------------------------------------------------------------------------


def test_env_takes_plain_values_and_secret_references():
    env = [
        {"name": "EPOCHS", "value": "10"},
        {"name": "EMPTY", "value": ""},
        {"name": "WANDB_API_KEY", "secretRef": {"name": "wandb.keys", "key": "token.v1"}},
    ]
    job = parse_training_job(put(minimal(), "spec.env", env))
    assert [e.name for e in job.spec.env] == ["EPOCHS", "EMPTY", "WANDB_API_KEY"]
    assert job.spec.env[1].value == ""


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "X"},
        {"name": "X", "value": "a", "secretRef": {"name": "s", "key": "k"}},
    ],
)
def test_env_entries_take_exactly_one_source(entry):
    found = problems(put(minimal(), "spec.env", [entry]))
    assert found == {"spec.env[0]": "give exactly one of value or secretRef"}


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", "A.B", "", "É", "x" * 129])
def test_env_names_must_be_c_identifiers(name):
    found = problems(put(minimal(), "spec.env", [{"name": name, "value": "v"}]))
    assert "spec.env[0].name" in found


@pytest.mark.parametrize("name", ["KUBETRAIN_JOB_ID", "KUBETRAIN_X", "kubetrain_x"])
def test_env_names_of_kubetrain_are_reserved(name):
    found = problems(put(minimal(), "spec.env", [{"name": name, "value": "v"}]))
    assert "KUBETRAIN_" in found["spec.env[0].name"]


@pytest.mark.parametrize(
    "name",
    [
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_RDZV_ENDPOINT",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "NODE_RANK",
        "GROUP_RANK",
    ],
)
def test_torchruns_variables_are_reserved(name):
    env = [{"name": "EPOCHS", "value": "3"}, {"name": name, "value": "1"}]
    found = problems(put(minimal(), "spec.env", env))
    assert list(found) == ["spec.env[1].name"]
    assert name in found["spec.env[1].name"]
    assert "wrong place in the gang" in found["spec.env[1].name"]


@pytest.mark.parametrize("name", ["PETS", "MY_RANK", "RANKS", "rank", "MASTER_ADDRESS"])
def test_names_near_torchruns_are_the_users(name):
    parse_training_job(put(minimal(), "spec.env", [{"name": name, "value": "1"}]))


def test_env_names_may_not_repeat():
    env = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "A", "value": "3"}]
    found = problems(put(minimal(), "spec.env", env))
    assert found == {"spec.env[2].name": "A is already set by env[0]"}


def test_env_is_bounded():
    env = [{"name": f"V{i}", "value": "x"} for i in range(specmod.MAX_ENV_ENTRIES + 1)]
    assert "at most 200" in refused("spec.env", env)
    assert (
        "at most 32768"
        in problems(put(minimal(), "spec.env", [{"name": "A", "value": "x" * 40000}]))[
            "spec.env[0].value"
        ]
    )
    env = [{"name": f"V{i}", "value": "x" * 30000} for i in range(5)]
    assert "at most 131072" in refused("spec.env", env)


def test_env_values_must_be_strings():
    found = problems(put(minimal(), "spec.env", [{"name": "EPOCHS", "value": 10}]))
    assert "quote it" in found["spec.env[0].value"]


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "GITHUB_TOKEN",
        "MY_SECRET",
        "MY_TOKEN",
        "OPENAI_KEY",
        "DB_PASS",
        "TOKEN",
        "PASSWORD_FILE",
    ],
)
def test_credentials_in_plain_values_are_refused(name):
    found = problems(put(minimal(), "spec.env", [{"name": name, "value": "hunter2"}]))
    assert "secretRef" in found["spec.env[0].value"]


@pytest.mark.parametrize(
    "name", ["PAD_TOKEN", "MAX_TOKENS", "TOKENIZER", "KEY_PATH", "SECRET_NAME"]
)
def test_names_that_only_mention_tokens_keep_plain_values(name):
    job = parse_training_job(put(minimal(), "spec.env", [{"name": name, "value": "x"}]))
    assert [(e.name, e.value, e.secret_ref) for e in job.spec.env] == [(name, "x", None)]


def test_a_url_with_a_password_is_refused_whatever_its_name():
    url = "postgresql://kubetrain:hunter2@db:5432/kubetrain"
    found = problems(put(minimal(), "spec.env", [{"name": "DATABASE_URL", "value": url}]))
    assert "secretRef" in found["spec.env[0].value"]
    # A user name alone is no secret.
    plain = "postgresql://kubetrain@db:5432/kubetrain"
    job = parse_training_job(put(minimal(), "spec.env", [{"name": "DATABASE_URL", "value": plain}]))
    assert job.spec.env[0].value == plain


def test_secret_references_are_checked():
    entry = {"name": "T", "secretRef": {"name": "Bad_Name", "key": "../k"}}
    found = problems(put(minimal(), "spec.env", [entry]))
    assert "DNS-1123" in found["spec.env[0].secretRef.name"]
    assert "Secret key" in found["spec.env[0].secretRef.key"]
    found = problems(put(minimal(), "spec.env", [{"name": "T", "secretRef": {"name": "s"}}]))
    assert found == {"spec.env[0].secretRef.key": "required"}


# -- resources --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["cpu", "memory"])
def test_cpu_and_memory_requests_are_required(field):
    message = refused(f"spec.resources.requests.{field}", DELETE)
    assert message.startswith("required")
    assert field in message


def test_requests_themselves_are_required_even_with_gpus():
    data = put(minimal(), "spec.resources", {"gpus": 1})
    assert "cpu and memory" in problems(data)["spec.resources.requests"]


@pytest.mark.parametrize(
    ("cpu", "cores"),
    [("500m", "0.5"), (0.5, "0.5"), (4, "4"), ("4", "4"), ("1e3", "1000"), ("1.5", "1.5")],
)
def test_cpu_is_parsed_as_kubernetes_parses_it(cpu, cores):
    job = parse_training_job(put(minimal(), "spec.resources.requests.cpu", cpu))
    assert specmod.cpu_value(job.spec.resources.requests.cpu) == Decimal(cores)


@pytest.mark.parametrize(
    ("cpu", "says"),
    [
        ("abc", "not a Kubernetes quantity"),
        ("0", "more than 0"),
        ("-1", "more than 0"),
        ("0.0001", "millicore"),
        ("100u", "millicore"),
        (True, "boolean"),
        ("2e6", "at most"),
        ([], "string"),
    ],
)
def test_bad_cpu_quantities_are_refused(cpu, says):
    assert says in refused("spec.resources.requests.cpu", cpu)
    assert says in refused("spec.resources.limits.cpu", cpu)


@pytest.mark.parametrize(
    ("memory", "size"),
    [("16Gi", 16 * 2**30), ("1e9", 10**9), ("1G", 10**9), (2**30, 2**30), ("1.5Gi", 3 * 2**29)],
)
def test_memory_is_parsed_as_kubernetes_parses_it(memory, size):
    job = parse_training_job(put(minimal(), "spec.resources.requests.memory", memory))
    assert specmod.bytes_value(job.spec.resources.requests.memory) == size


@pytest.mark.parametrize(
    ("memory", "says"),
    [
        ("500m", "half a byte"),
        ("16", "write the unit"),
        (16, "write the unit"),
        ("16GB", "not a Kubernetes quantity"),
        ("2Ei", "over 1Ei"),
        ("-1Gi", "under 1Mi"),
    ],
)
def test_bad_memory_quantities_are_refused(memory, says):
    assert says in refused("spec.resources.requests.memory", memory)


@pytest.mark.parametrize("field", ["cpu", "memory"])
def test_limits_below_requests_are_refused(field):
    data = put(minimal(), "spec.resources.requests", {"cpu": "2", "memory": "2Gi"})
    low = {"cpu": "1999m", "memory": "2047Mi"}[field]
    message = refused(f"spec.resources.limits.{field}", low, data)
    assert "at least the request" in message


def test_limits_equal_to_requests_in_other_spellings_are_accepted():
    data = put(minimal(), "spec.resources.requests", {"cpu": "2", "memory": "2Gi"})
    job = parse_training_job(
        put(data, "spec.resources.limits", {"cpu": "2000m", "memory": 2 * 2**30})
    )
    limits = job.spec.resources.limits
    assert (limits.cpu, limits.memory) == ("2000m", "2147483648")


def test_one_limit_may_be_given_alone():
    job = parse_training_job(put(minimal(), "spec.resources.limits", {"memory": "8Gi"}))
    assert job.spec.resources.limits.cpu is None


@pytest.mark.parametrize("gpus", [0, 1, 8, 64])
def test_whole_gpu_counts_are_accepted(gpus):
    assert (
        parse_training_job(put(minimal(), "spec.resources.gpus", gpus)).spec.resources.gpus == gpus
    )


@pytest.mark.parametrize(
    ("gpus", "says"),
    [
        (1.5, "fraction"),
        (1.0, "fraction"),
        (-1, "from 0"),
        (True, "bool"),
        ("1", "str"),
        (2000, "to 1024"),
        (None, "NoneType"),
    ],
)
def test_fractional_negative_and_odd_gpu_counts_are_refused(gpus, says):
    assert says in refused("spec.resources.gpus", gpus)


def test_gpu_type_is_a_label_value():
    data = put(minimal(), "spec.resources.gpus", 1)
    assert parse_training_job(
        put(data, "spec.resources.gpuType", "nvidia-h100")
    ).spec.resources.gpu_type
    for bad in ("nvidia h100", "-h100", "x" * 64, ""):
        refused("spec.resources.gpuType", bad, data)
    assert "string" in refused("spec.resources.gpuType", False, data)


def test_gpu_type_needs_gpus():
    assert "gpus of 1 or more" in refused("spec.resources.gpuType", "nvidia-h100")


# -- volumes ----------------------------------------------------------------------------------


def test_a_dataset_by_name_and_version_alone_is_accepted():
    job = parse_training_job(put(minimal(), "spec.dataset", {"name": "imagenet", "version": "v3"}))
    assert job.spec.dataset is not None
    assert job.spec.dataset.claim is None


def test_a_dataset_sub_path_needs_a_claim():
    dataset = {"name": "imagenet", "version": "v3", "subPath": "v3"}
    assert (
        "needs claim" in problems(put(minimal(), "spec.dataset", dataset))["spec.dataset.subPath"]
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("name", "ImageNet", "DNS-1123"),
        ("version", 1.1, "quote it"),
        ("version", "v 3", "label value"),
        ("version", "", "empty"),
        ("claim", "Data_Set", "DNS-1123"),
        ("subPath", "/abs", "relative"),
        ("subPath", "a/../../b", "'..'"),
        ("subPath", "a\\b", "'/'"),
        ("subPath", "v3\n", "control"),
    ],
)
def test_dataset_fields_are_checked(field, value, says):
    dataset = {"name": "imagenet", "version": "v3", "claim": "data"}
    assert says in refused(f"spec.dataset.{field}", value, put(minimal(), "spec.dataset", dataset))


@pytest.mark.parametrize("field", ["checkpoints", "output"])
def test_checkpoint_and_output_claims_are_pvc_names(field):
    assert "DNS-1123" in refused(f"spec.{field}.claim", "Ckpt")
    assert problems(put(minimal(), f"spec.{field}", {})) == {f"spec.{field}.claim": "required"}


def test_one_claim_serves_one_purpose():
    data = put(minimal(), "spec.checkpoints", {"claim": "shared"})
    assert "already used by spec.checkpoints" in refused("spec.output.claim", "shared", data)
    dataset = {"name": "d", "version": "v1", "claim": "shared"}
    found = problems(put(data, "spec.dataset", dataset))
    assert "already used by spec.dataset" in found["spec.checkpoints.claim"]


def test_cache_size_is_a_whole_number_of_bytes():
    assert parse_training_job(put(minimal(), "spec.cache", {"size": "100Gi"})).spec.cache
    assert "half a byte" in refused("spec.cache.size", "500m")
    assert "write the unit" in refused("spec.cache.size", 100)


# -- scheduling, run time, retries ------------------------------------------------------------


def test_priority_class_is_a_kubernetes_name():
    assert parse_training_job(put(minimal(), "spec.priorityClass", "batch.low")).spec.priority_class
    assert "DNS-1123" in refused("spec.priorityClass", "Batch")
    assert "Kubernetes' own" in refused("spec.priorityClass", "system-cluster-critical")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("24h", 86400), ("90m", 5400), ("1h30m", 5400), ("1.5h", 5400), ("3600s", 3600), ("1s", 1)],
)
def test_max_runtime_is_a_go_duration(text, seconds):
    job = parse_training_job(put(minimal(), "spec.maxRuntime", text))
    assert duration_seconds(job.spec.max_runtime or "") == seconds


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2d", "no days"),
        ("24", "duration such as"),
        ("-1h", "duration such as"),
        ("", "duration such as"),
        ("1h 30m", "duration such as"),
        ("0s", "from 1s"),
        ("1.5s", "whole number of seconds"),
        ("100ms", "whole number of seconds"),
        ("9000h", "to 8784h"),
        (3600, "string"),
    ],
)
def test_bad_max_runtimes_are_refused(text, says):
    assert says in refused("spec.maxRuntime", text)


@pytest.mark.parametrize(
    ("value", "says"),
    [(-1, "from 0"), (101, "to 100"), (1.0, "fraction"), (True, "bool"), ("3", "str")],
)
def test_retries_are_a_small_whole_number(value, says):
    assert says in refused("spec.retries", value)


@pytest.mark.parametrize(
    ("value", "says"),
    [(0, "from 1"), (257, "to 256"), (2.0, "fraction"), (True, "bool"), ("2", "str")],
)
def test_workers_are_a_whole_number_from_one(value, says):
    assert says in refused("spec.workers", value)


def test_a_gang_of_workers_is_accepted():
    assert parse_training_job(put(minimal(), "spec.workers", 4)).spec.workers == 4


def test_every_problem_is_reported_at_once():
    data = put(put(minimal(), "spec.image", "Bad"), "spec.retries", -1)
    data = put(data, "metadata.name", "Bad")
    assert set(problems(data)) == {"spec.image", "spec.retries", "metadata.name"}


# -- YAML -------------------------------------------------------------------------------------


def yaml_problem(text: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_training_job_yaml(text)
    [problem] = info.value.problems
    return f"{problem.field}|{problem.message}"


def test_one_document_with_markers_is_accepted():
    assert parse_training_job_yaml("---\n" + EXAMPLE_YAML + "...\n").metadata.name


def test_a_second_document_is_refused():
    assert "second YAML document" in yaml_problem(EXAMPLE_YAML + "---\n" + EXAMPLE_YAML)


def test_over_size_documents_are_refused():
    text = EXAMPLE_YAML + "#" + "x" * specmod.MAX_YAML_BYTES + "\n"
    assert "larger than 262144" in yaml_problem(text)
    # Counted in bytes, not characters.
    text = EXAMPLE_YAML + "#" + "é" * (specmod.MAX_YAML_BYTES // 2) + "\n"
    assert "larger than" in yaml_problem(text)


def test_alias_bombs_are_refused_before_they_expand():
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
    for i in range(1, 10):
        prev = chr(ord("a") + i - 1)
        bomb += f"{chr(ord('a') + i)}: &{chr(ord('a') + i)} [{','.join(['*' + prev] * 9)}]\n"
    assert "anchors and aliases" in yaml_problem(bomb)


def test_anchors_and_merge_keys_are_refused():
    text = EXAMPLE_YAML.replace("requests: {", "requests: &r {") + "extra: *r\n"
    assert "anchors and aliases" in yaml_problem(text)
    text = "base: &b {cpu: 1}\nx:\n  <<: *b\n"
    assert "anchors and aliases" in yaml_problem(text)


def test_deep_nesting_is_refused():
    assert "nested deeper" in yaml_problem("[" * 10000 + "]" * 10000)


@pytest.mark.parametrize(
    ("text", "says"),
    [("", "empty"), ("# nothing\n", "empty"), ("- a\n", "got list"), ("job\n", "got str")],
)
def test_documents_that_are_not_mappings_are_refused(text, says):
    assert says in yaml_problem(text)


def test_invalid_yaml_is_refused_with_its_position():
    message = yaml_problem("apiVersion: kubetrain.io/v1\nkind: [TrainingJob\n")
    assert message.startswith("|not valid YAML")
    assert "line" in message


def test_duplicate_keys_are_refused_instead_of_the_last_winning():
    text = EXAMPLE_YAML.replace('cpu: "4", memory: 16Gi}', 'cpu: "4", memory: 16Gi, cpu: "1"}')
    assert "duplicate key 'cpu'" in yaml_problem(text)


def test_python_tags_are_refused():
    assert "not valid YAML" in yaml_problem("!!python/object/apply:os.system [echo hi]\n")


def test_huge_integers_are_refused():
    assert yaml_problem("retries: " + "9" * 5000 + "\n").startswith("|")


def test_yaml_coercions_are_refused_rather_than_taken():
    text = EXAMPLE_YAML.replace("version: v3", "version: 1.10")
    with pytest.raises(SpecError) as info:
        parse_training_job_yaml(text)
    assert [p.field for p in info.value.problems] == ["spec.dataset.version"]


def test_the_yaml_parser_fills_the_project_too():
    text = EXAMPLE_YAML.replace("project: ai-training, ", "")
    assert parse_training_job_yaml(text, project="vision").metadata.project == "vision"


def test_text_is_required():
    with pytest.raises(SpecError):
        parse_training_job_yaml(b"apiVersion: x")


# -- normal forms and the digest --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("4", "4"),
        ("4000m", "4"),
        ("0.5", "500m"),
        ("1500m", "1500m"),
        ("1e3", "1000"),
        ("1k", "1000"),
    ],
)
def test_canonical_cpu(text, canonical):
    assert canonical_cpu(text) == canonical


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("16Gi", "16Gi"),
        ("17179869184", "16Gi"),
        ("1024Mi", "1Gi"),
        ("1.5Gi", "1536Mi"),
        ("1e9", "1G"),
        ("16G", "16G"),
        ("1500", "1500"),
        ("1024000", "1024k"),
        ("1000Ki", "1024k"),
        (2**20 + 1, "1048577"),
    ],
)
def test_canonical_bytes(text, canonical):
    assert canonical_bytes(text) == canonical


def digest(data: dict[str, Any]) -> str:
    return spec_digest(parse_training_job(data))


def test_the_digest_is_a_stable_sha256():
    value = digest(full())
    assert value == digest(full())
    assert len(value) == 64
    assert int(value, 16) >= 0


@pytest.mark.parametrize(
    ("path", "first", "second"),
    [
        ("spec.resources.requests.cpu", "1", "1000m"),
        ("spec.resources.requests.cpu", 4, "4"),
        ("spec.resources.requests.memory", "1Gi", 2**30),
        ("spec.maxRuntime", "90m", "1h30m"),
        ("spec.stallAfter", "90m", "1h30m"),
        ("spec.cancelAfterStall", "90m", "1h30m"),
        ("spec.rendezvousTimeout", "15m", "900s"),
        ("spec.cache", {"size": "1Gi"}, {"size": "1024Mi"}),
        ("spec.args", [], DELETE),
        ("metadata.labels", {"a": "1", "b": "2"}, {"b": "2", "a": "1"}),
    ],
)
def test_the_digest_ignores_spelling(path, first, second):
    assert digest(put(full(), path, first)) == digest(put(full(), path, second))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.image", "registry.example/trainer:2"),
        ("metadata.name", "other"),
        ("spec.resources.gpus", 2),
        ("spec.retries", 0),
        ("spec.workers", 2),
        ("spec.stallAfter", "1h"),
        ("spec.cancelAfterStall", "1h"),
        ("spec.rendezvousTimeout", "20m"),
        ("spec.env", [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]),
    ],
)
def test_the_digest_sees_every_change(path, value):
    assert digest(put(full(), path, value)) != digest(full())


def test_the_digest_of_a_dump_made_already_is_the_same_and_leaves_it_unchanged():
    job = parse_training_job(put(full(), "spec.resources.limits", {"cpu": "8", "memory": "32Gi"}))
    dumped = job.model_dump(mode="json")
    before = copy.deepcopy(dumped)
    assert spec_digest(job, dumped) == spec_digest(job)
    assert dumped == before  # the API stores this very dump as the job's spec


def test_a_job_without_stall_after_keeps_the_digest_it_had_before_the_field():
    # The field is left out of the normalised job, not written as null.
    assert "stallAfter" not in _normalized(parse_training_job(full()))["spec"]
    job = parse_training_job(put(minimal(), "spec.stallAfter", "90m"))
    assert job.spec.stall_after == "90m"
    assert _normalized(job)["spec"]["stallAfter"] == "5400s"


@pytest.mark.parametrize(("text", "says"), [("2d", "no days"), ("0s", "from 1s"), (60, "string")])
def test_bad_stall_afters_are_refused(text, says):
    assert says in refused("spec.stallAfter", text)


def test_a_job_without_cancel_after_stall_keeps_the_digest_it_had_before_the_field():
    assert "cancelAfterStall" not in _normalized(parse_training_job(full()))["spec"]
    job = parse_training_job(put(minimal(), "spec.cancelAfterStall", "2h"))
    assert job.spec.cancel_after_stall == "2h"
    assert _normalized(job)["spec"]["cancelAfterStall"] == "7200s"


@pytest.mark.parametrize(("text", "says"), [("2d", "no days"), ("0s", "from 1s"), (60, "string")])
def test_bad_cancel_after_stalls_are_refused(text, says):
    assert says in refused("spec.cancelAfterStall", text)


def test_a_job_without_rendezvous_timeout_keeps_the_digest_it_had_before_the_field():
    assert "rendezvousTimeout" not in _normalized(parse_training_job(full()))["spec"]
    job = parse_training_job(put(minimal(), "spec.rendezvousTimeout", "15m"))
    assert job.spec.rendezvous_timeout == "15m"
    assert _normalized(job)["spec"]["rendezvousTimeout"] == "900s"


@pytest.mark.parametrize(("text", "says"), [("2d", "no days"), ("0s", "from 1s"), (60, "string")])
def test_bad_rendezvous_timeouts_are_refused(text, says):
    assert says in refused("spec.rendezvousTimeout", text)


def test_one_worker_keeps_the_digest_of_a_job_that_names_none():
    # Every job made before gangs has no workers field: its digest stays what it was.
    assert digest(put(full(), "spec.workers", 1)) == digest(full())


def test_the_digest_keeps_env_order():
    forward = [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)"}]
    assert digest(put(full(), "spec.env", forward)) != digest(
        put(full(), "spec.env", list(reversed(forward)))
    )


def test_a_parsed_job_is_a_training_job():
    assert isinstance(parse_training_job(minimal()), TrainingJob)


def test_testbed_fate_annotations_pass_and_other_kubetrain_subdomains_do_not():
    from kubetrain.domain.manifest import render_job
    from kubetrain.domain.spec import SpecError, parse_training_job

    def body(annotations: dict[str, str]) -> dict[str, object]:
        return {
            "apiVersion": "kubetrain.io/v1",
            "kind": "TrainingJob",
            "metadata": {"name": "a", "project": "p", "annotations": annotations},
            "spec": {
                "image": "registry.example/t:1",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
            },
        }

    job = parse_training_job(body({"testbed.kubetrain.io/exit-code": "1"}))
    manifest = render_job("abc", job, "p", dataset=None)
    pod_annotations = manifest["spec"]["template"]["metadata"]["annotations"]
    assert pod_annotations["testbed.kubetrain.io/exit-code"] == "1"
    with pytest.raises(SpecError, match="reserved for kubetrain"):
        parse_training_job(body({"other.kubetrain.io/x": "1"}))
