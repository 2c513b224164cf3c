"""The batch/v1 Job rendered from a TrainingJob: each field the issue asks for, nothing else."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kubetrain.domain import manifest as m
from kubetrain.domain.datasets import DatasetVersion, parse_dataset_version, resolve_dataset
from kubetrain.domain.names import dns1123_label_problem
from kubetrain.domain.spec import TrainingJob, parse_training_job, spec_digest

pytestmark = pytest.mark.unit

JOB_ID = "01J9ZK3T7Q8W2X4Y6A0B1C2D3E"


def base() -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "train", "project": "ai-training"},
        "spec": {
            "image": "registry.example/trainer:1",
            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
        },
    }


def full() -> dict[str, Any]:
    data = base()
    data["metadata"]["labels"] = {"team": "vision", "app.kubernetes.io/name": "policy"}
    data["metadata"]["annotations"] = {"note": "first run\nof v12"}
    data["spec"].update(
        {
            "command": ["python", "train.py"],
            "args": ["--epochs", "$(EPOCHS)"],
            "env": [
                {"name": "EPOCHS", "value": "10"},
                {"name": "WANDB_API_KEY", "secretRef": {"name": "wandb", "key": "token"}},
            ],
            "resources": {
                "requests": {"cpu": "4", "memory": "16Gi"},
                "limits": {"cpu": "8", "memory": "32Gi"},
                "gpus": 1,
                "gpuType": "nvidia-h100",
            },
            "dataset": {"name": "imagenet", "version": "v3", "claim": "ds", "subPath": "v3"},
            "checkpoints": {"claim": "ckpt"},
            "output": {"claim": "out"},
            "cache": {"size": "100Gi"},
            "priorityClass": "batch-normal",
            "maxRuntime": "24h",
            "retries": 3,
        }
    )
    return data


def job(data: dict[str, Any]) -> TrainingJob:
    return parse_training_job(data)


def render(
    data: dict[str, Any],
    options: m.RenderOptions = m.DEFAULT_RENDER_OPTIONS,
    dataset: DatasetVersion | None = None,
) -> dict[str, Any]:
    parsed = job(data)
    if dataset is None and parsed.spec.dataset is not None:
        dataset = resolve_dataset(parsed.spec.dataset, None)
    return m.render_job(JOB_ID, parsed, "ai-training", dataset=dataset, options=options)


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    [only] = manifest["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = only
    return result


def pod(manifest: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return result


def env(manifest: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(manifest)["env"]}


def with_spec(**fields: Any) -> dict[str, Any]:
    data = base()
    data["spec"].update(fields)
    return data


# -- the name ---------------------------------------------------------------------------------


def test_the_job_name_is_the_prefixed_lowercase_id():
    assert m.job_name(JOB_ID) == "kt-" + JOB_ID.lower()
    assert (
        m.job_name("0b5c1d2e-3f40-4a5b-8c6d-7e8f9a0b1c2d")
        == "kt-0b5c1d2e-3f40-4a5b-8c6d-7e8f9a0b1c2d"
    )


def test_the_job_name_is_stable_and_case_insensitive():
    assert m.job_name(JOB_ID) == m.job_name(JOB_ID) == m.job_name(JOB_ID.lower())


@pytest.mark.parametrize("job_id", ["a", JOB_ID, "x" * m.MAX_JOB_ID_LENGTH, "A-1"])
def test_the_job_name_is_a_dns_label(job_id):
    name = m.job_name(job_id)
    assert dns1123_label_problem(name) is None
    assert len(name) <= 63


@pytest.mark.parametrize("job_id", ["", "-a", "a-", "a_b", "a.b", "a b", "x" * 61, "é"])
def test_ids_that_cannot_make_a_name_are_refused(job_id):
    with pytest.raises(ValueError, match="job id"):
        m.job_name(job_id)


# -- the Job ----------------------------------------------------------------------------------


def test_the_job_is_a_batch_v1_job_in_the_namespace_under_our_name():
    manifest = render(base())
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert manifest["metadata"]["name"] == m.job_name(JOB_ID)
    assert manifest["metadata"]["namespace"] == "ai-training"


def test_our_labels_are_on_the_job_and_the_pod_template():
    manifest = render(full())
    ours = {
        "kubetrain.io/job-id": JOB_ID,
        "kubetrain.io/project": "ai-training",
        "kubetrain.io/name": "train",
        "app.kubernetes.io/managed-by": "kubetrain",
    }
    assert manifest["metadata"]["labels"] == ours
    template = manifest["spec"]["template"]["metadata"]
    assert template["labels"] == {"team": "vision", "app.kubernetes.io/name": "policy", **ours}


def test_user_labels_and_annotations_reach_the_pod_template_only():
    manifest = render(full())
    assert "team" not in manifest["metadata"]["labels"]
    assert manifest["spec"]["template"]["metadata"]["annotations"] == {"note": "first run\nof v12"}
    assert "annotations" not in render(base())["spec"]["template"]["metadata"]


def test_the_spec_digest_is_annotated_on_the_job():
    manifest = render(full())
    assert manifest["metadata"]["annotations"] == {
        "kubetrain.io/spec-digest": spec_digest(job(full()))
    }


def test_the_job_fails_fast_on_the_preflight_and_ignores_disruptions():
    spec = render(base())["spec"]
    assert spec["podReplacementPolicy"] == "Failed"
    ignore, fail = spec["podFailurePolicy"]["rules"]
    assert ignore == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert fail == {
        "action": "FailJob",
        "onExitCodes": {
            "containerName": m.CONTAINER_NAME,
            "operator": "In",
            "values": [m.PREFLIGHT_EXIT_CODE],
        },
    }
    assert m.PREFLIGHT_EXIT_CODE == 86


def test_retries_become_the_backoff_limit_and_max_runtime_the_deadline():
    spec = render(full())["spec"]
    assert spec["backoffLimit"] == 3
    assert spec["activeDeadlineSeconds"] == 86400
    spec = render(base())["spec"]
    assert spec["backoffLimit"] == 0
    assert "activeDeadlineSeconds" not in spec
    assert render(with_spec(maxRuntime="1h30m"))["spec"]["activeDeadlineSeconds"] == 5400


def test_the_pod_never_restarts_in_place_and_keeps_its_termination_message():
    manifest = render(base())
    assert pod(manifest)["restartPolicy"] == "Never"
    assert container(manifest)["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container(manifest)["terminationMessagePath"] == m.TERMINATION_LOG


def test_the_pod_gets_no_api_token_and_no_service_links():
    spec = pod(render(base()))
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False


def test_the_container_runs_the_image_command_and_args():
    c = container(render(full()))
    assert c["name"] == "trainer"
    assert c["image"] == "registry.example/trainer:1"
    assert c["command"] == ["python", "train.py"]
    assert c["args"] == ["--epochs", "$(EPOCHS)"]
    bare = container(render(base()))
    assert "command" not in bare
    assert "args" not in bare


def test_priority_class_is_passed_only_when_given():
    assert pod(render(full()))["priorityClassName"] == "batch-normal"
    assert "priorityClassName" not in pod(render(base()))


# -- Kueue ------------------------------------------------------------------------------------


def test_a_job_without_a_queue_is_not_queued():
    rendered = render(full())
    assert m.LABEL_QUEUE not in rendered["metadata"]["labels"]
    assert "suspend" not in rendered["spec"]


def test_spec_queue_labels_the_job_and_creates_it_suspended_as_kueue_expects():
    rendered = render(with_spec(queue="team-gpus"))
    assert rendered["metadata"]["labels"][m.LABEL_QUEUE] == "team-gpus"
    assert rendered["spec"]["suspend"] is True
    # Kueue reads the Job's labels; the Pods carry only kubetrain's.
    assert m.LABEL_QUEUE not in rendered["spec"]["template"]["metadata"]["labels"]


def test_the_namespaces_default_queue_applies_when_the_spec_names_none():
    options = m.RenderOptions(default_queues=(("ai-training", "team-default"), ("other", "x")))
    assert render(base(), options)["metadata"]["labels"][m.LABEL_QUEUE] == "team-default"
    chosen = render(with_spec(queue="team-gpus"), options)
    assert chosen["metadata"]["labels"][m.LABEL_QUEUE] == "team-gpus"
    other = m.RenderOptions(default_queues=(("other", "x"),))
    assert m.LABEL_QUEUE not in render(base(), other)["metadata"]["labels"]


def test_through_a_queue_the_priority_class_is_kueues_workload_priority_class():
    data = full()
    data["spec"]["queue"] = "team-gpus"
    rendered = render(data)
    assert rendered["metadata"]["labels"][m.LABEL_WORKLOAD_PRIORITY] == "batch-normal"
    assert "priorityClassName" not in pod(rendered)


def test_a_queue_name_must_be_a_dns_label():
    with pytest.raises(ValueError, match=r"spec\.queue"):
        job(with_spec(queue="Team_GPUs"))


def test_a_default_queue_must_be_a_dns_label():
    with pytest.raises(ValueError, match="default queue of namespace 'ai-training'"):
        m.RenderOptions(default_queues=(("ai-training", "Bad Queue"),))


# -- resources --------------------------------------------------------------------------------


def test_requests_and_limits_are_rendered():
    resources = container(render(full()))["resources"]
    assert resources["requests"] == {
        "cpu": "4",
        "memory": "16Gi",
        "ephemeral-storage": "102Gi",
        "nvidia.com/gpu": "1",
    }
    assert resources["limits"] == {
        "cpu": "8",
        "memory": "32Gi",
        "ephemeral-storage": "102Gi",
        "nvidia.com/gpu": "1",
    }


def test_limits_left_out_are_the_requests():
    resources = container(render(base()))["resources"]
    assert resources == {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"cpu": "2", "memory": "4Gi"},
    }
    data = base()
    data["spec"]["resources"]["limits"] = {"cpu": "3"}
    assert container(render(data))["resources"]["limits"] == {"cpu": "3", "memory": "4Gi"}


def test_quantities_are_rendered_in_one_spelling():
    data = base()
    data["spec"]["resources"]["requests"] = {"cpu": 0.5, "memory": "17179869184"}
    data["spec"]["resources"]["limits"] = {"cpu": "1000m", "memory": "2e10"}
    resources = container(render(data))["resources"]
    assert resources["requests"] == {"cpu": "500m", "memory": "16Gi"}
    assert resources["limits"] == {"cpu": "1", "memory": "20G"}


def test_a_cpu_job_asks_for_no_gpu_and_tolerates_no_gpu_taint():
    manifest = render(base())
    resources = container(manifest)["resources"]
    assert "nvidia.com/gpu" not in resources["requests"]
    assert "nvidia.com/gpu" not in resources["limits"]
    assert "tolerations" not in pod(manifest)
    assert "nodeSelector" not in pod(manifest)


def test_gpus_are_requested_limited_and_tolerated():
    data = base()
    data["spec"]["resources"]["gpus"] = 8
    manifest = render(data)
    resources = container(manifest)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "8"
    assert resources["requests"]["nvidia.com/gpu"] == "8"
    assert pod(manifest)["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "nodeSelector" not in pod(manifest)


def test_a_gpu_type_selects_nodes_by_the_accelerator_label():
    assert pod(render(full()))["nodeSelector"] == {"accelerator": "nvidia-h100"}
    options = m.RenderOptions(accelerator_label="nvidia.com/gpu.product")
    assert pod(render(full(), options))["nodeSelector"] == {"nvidia.com/gpu.product": "nvidia-h100"}


def test_the_gpu_resource_is_the_platforms_choice():
    manifest = render(full(), m.RenderOptions(gpu_resource="amd.com/gpu"))
    resources = container(manifest)["resources"]
    assert resources["limits"]["amd.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in resources["limits"]
    assert pod(manifest)["tolerations"][0]["key"] == "amd.com/gpu"


# -- volumes ----------------------------------------------------------------------------------


def volumes(manifest: dict[str, Any]) -> dict[str, Any]:
    return {v["name"]: v for v in pod(manifest).get("volumes", [])}


def mounts(manifest: dict[str, Any]) -> dict[str, Any]:
    return {v["name"]: v for v in container(manifest).get("volumeMounts", [])}


def test_a_job_without_volumes_mounts_none():
    manifest = render(base())
    assert "volumes" not in pod(manifest)
    assert "volumeMounts" not in container(manifest)


def test_the_dataset_is_mounted_read_only_with_its_sub_path():
    manifest = render(full())
    assert volumes(manifest)["dataset"] == {
        "name": "dataset",
        "persistentVolumeClaim": {"claimName": "ds", "readOnly": True},
    }
    assert mounts(manifest)["dataset"] == {
        "name": "dataset",
        "mountPath": "/data",
        "readOnly": True,
        "subPath": "v3",
    }


def test_a_registered_dataset_is_mounted_from_its_entry():
    data = with_spec(dataset={"name": "imagenet", "version": "v3"})
    registered = parse_dataset_version(
        {
            "name": "imagenet",
            "version": "v3",
            "claim": "datasets",
            "subPath": "imagenet/v3",
            "checksums": "SHA256SUMS",
            "checksumsSha256": "ab" * 32,
        }
    )
    manifest = render(data, dataset=registered)
    assert volumes(manifest)["dataset"]["persistentVolumeClaim"]["claimName"] == "datasets"
    assert mounts(manifest)["dataset"]["subPath"] == "imagenet/v3"
    variables = env(manifest)
    assert variables["KUBETRAIN_DATASET_CHECKSUMS"] == "/data/SHA256SUMS"
    assert variables["KUBETRAIN_DATASET_CHECKSUMS_SHA256"] == "ab" * 32


def test_a_dataset_without_sub_path_mounts_the_whole_claim():
    data = with_spec(dataset={"name": "imagenet", "version": "v3", "claim": "ds"})
    assert "subPath" not in mounts(render(data))["dataset"]


def test_checkpoints_and_output_are_writable_claims():
    manifest = render(full())
    assert volumes(manifest)["checkpoints"] == {
        "name": "checkpoints",
        "persistentVolumeClaim": {"claimName": "ckpt"},
    }
    assert volumes(manifest)["output"] == {
        "name": "output",
        "persistentVolumeClaim": {"claimName": "out"},
    }
    assert mounts(manifest)["checkpoints"] == {"name": "checkpoints", "mountPath": "/checkpoints"}
    assert mounts(manifest)["output"] == {"name": "output", "mountPath": "/output"}


def test_the_cache_is_a_sized_empty_dir_with_matching_ephemeral_storage():
    manifest = render(with_spec(cache={"size": "10Gi"}))
    assert volumes(manifest)["cache"] == {"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}}
    assert mounts(manifest)["cache"] == {"name": "cache", "mountPath": "/cache"}
    resources = container(manifest)["resources"]
    assert resources["requests"]["ephemeral-storage"] == "12Gi"  # 10Gi + the 2Gi headroom
    assert resources["limits"]["ephemeral-storage"] == "12Gi"


def test_without_headroom_the_ephemeral_storage_is_the_cache_size():
    manifest = render(with_spec(cache={"size": "10Gi"}), m.RenderOptions(ephemeral_headroom="0"))
    resources = container(manifest)["resources"]
    assert resources["requests"]["ephemeral-storage"] == "10Gi"
    assert resources["limits"]["ephemeral-storage"] == "10Gi"


def test_no_cache_no_ephemeral_storage():
    resources = container(render(base()))["resources"]
    assert "ephemeral-storage" not in resources["requests"]
    assert "ephemeral-storage" not in resources["limits"]


# -- environment ------------------------------------------------------------------------------


def test_the_preflight_environment_is_set():
    variables = env(render(full(), m.RenderOptions(status_url="https://kubetrain.example/api")))
    assert variables["KUBETRAIN_JOB_ID"] == JOB_ID
    assert variables["KUBETRAIN_EXPECTED_GPUS"] == "1"
    assert variables["KUBETRAIN_DATASET_PATH"] == "/data"
    assert variables["KUBETRAIN_DATASET_NAME"] == "imagenet"
    assert variables["KUBETRAIN_DATASET_VERSION"] == "v3"
    assert variables["KUBETRAIN_CHECKPOINT_DIR"] == "/checkpoints"
    assert variables["KUBETRAIN_OUTPUT_DIR"] == "/output"
    assert variables["KUBETRAIN_CACHE_DIR"] == "/cache"
    assert variables["KUBETRAIN_STATUS_URL"] == "https://kubetrain.example/api"
    assert variables["KUBETRAIN_TERMINATION_LOG"] == "/dev/termination-log"


@pytest.mark.parametrize(
    ("resource", "expected"),
    [("nvidia.com/gpu", "1"), ("nvidia.com/mig-1g.10gb", "1"), ("amd.com/gpu", None)],
)
def test_the_gpu_check_is_asked_for_only_with_nvidia_devices(resource, expected):
    variables = env(render(full(), m.RenderOptions(gpu_resource=resource)))
    assert variables.get("KUBETRAIN_EXPECTED_GPUS") == expected


def test_a_bare_job_gets_only_the_variables_that_apply():
    variables = env(render(base()))
    assert variables == {
        "KUBETRAIN_JOB_ID": JOB_ID,
        "KUBETRAIN_POD_NAME": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
        "KUBETRAIN_EXPECTED_GPUS": "0",
        "KUBETRAIN_TERMINATION_LOG": "/dev/termination-log",
    }


def test_ours_come_first_so_the_users_can_refer_to_them():
    names = [e["name"] for e in container(render(full()))["env"]]
    assert names[-2:] == ["EPOCHS", "WANDB_API_KEY"]
    assert all(name.startswith("KUBETRAIN_") for name in names[:-2])


def test_secrets_are_referenced_never_inlined():
    entries = {e["name"]: e for e in container(render(full()))["env"]}
    assert entries["WANDB_API_KEY"] == {
        "name": "WANDB_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "token"}},
    }
    assert entries["EPOCHS"] == {"name": "EPOCHS", "value": "10"}


def test_an_empty_value_is_rendered_as_the_api_server_stores_it():
    data = with_spec(env=[{"name": "EMPTY", "value": ""}])
    assert container(render(data))["env"][-1] == {"name": "EMPTY"}


def test_the_pod_proves_who_it_is_with_a_projected_token_for_kubetrain_alone():
    options = m.RenderOptions(status_url="http://kubetrain.kubetrain.svc:8080")
    job = render(base(), options)
    pod = job["spec"]["template"]["spec"]
    entries = {e["name"]: e for e in container(job)["env"]}
    assert entries["KUBETRAIN_STATUS_TOKEN_FILE"] == {
        "name": "KUBETRAIN_STATUS_TOKEN_FILE",
        "value": "/var/run/secrets/kubetrain.io/serviceaccount/token",
    }
    assert entries["KUBETRAIN_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # The kubelet's token for the API server stays out; ours is for kubetrain's audience,
    # short-lived (the API server's floor), renewed by the kubelet.
    assert pod["automountServiceAccountToken"] is False
    assert pod["volumes"] == [
        {
            "name": "kubetrain-token",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": "kubetrain",
                            "expirationSeconds": 600,
                            "path": "token",
                        }
                    }
                ]
            },
        }
    ]
    assert container(job)["volumeMounts"] == [
        {
            "name": "kubetrain-token",
            "mountPath": "/var/run/secrets/kubetrain.io/serviceaccount",
            "readOnly": True,
        }
    ]
    # No Secret is referenced anywhere: the Job is the one object a job needs.
    assert "secretKeyRef" not in str(job)
    other = m.RenderOptions(status_url="http://kubetrain:8080", token_audience="https://kt.example")
    token = render(base(), other)["spec"]["template"]["spec"]["volumes"][0]
    assert (
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "https://kt.example"
    )


def test_without_a_status_url_nothing_reports_and_no_token_is_projected():
    job = render(base())
    entries = {e["name"] for e in container(job)["env"]}
    assert not {"KUBETRAIN_STATUS_URL", "KUBETRAIN_STATUS_TOKEN_FILE"} & entries
    assert "volumes" not in job["spec"]["template"]["spec"]


def test_no_plain_value_carries_a_credential():
    options = m.RenderOptions(status_url="https://kubetrain.example")
    for entry in container(render(full(), options))["env"]:
        if "value" in entry:
            assert entry["name"] in {"EPOCHS"} or entry["name"].startswith("KUBETRAIN_")
            assert "@" not in entry["value"]
        else:
            assert set(entry["valueFrom"]) <= {"secretKeyRef", "fieldRef"}


# -- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"gpu_resource": "gpu"},
        {"gpu_resource": "nvidia.com/"},
        {"accelerator_label": "bad label"},
        {"status_url": "ftp://kubetrain.example"},
        {"status_url": "https://user:secret@kubetrain.example"},
        {"status_url": "https://kubetrain.example/a b"},
        {"status_url": "https:///path"},
        {"ephemeral_headroom": "lots"},
        {"ephemeral_headroom": "-1Gi"},
        {"ephemeral_headroom": "500m"},
        {"token_audience": ""},
        {"token_seconds": 599},
    ],
)
def test_bad_options_are_refused_when_made(fields):
    with pytest.raises(ValueError):  # noqa: PT011 - each message is checked by eye, kinds vary
        m.RenderOptions(**fields)


# -- calls that contradict themselves ---------------------------------------------------------


def test_a_job_naming_a_dataset_needs_it_resolved():
    with pytest.raises(ValueError, match="resolve it"):
        m.render_job(JOB_ID, job(full()), "ai-training", dataset=None)


def test_a_dataset_for_a_job_without_one_is_refused():
    extra = resolve_dataset(job(full()).spec.dataset, None)
    with pytest.raises(ValueError, match="names none"):
        m.render_job(JOB_ID, job(base()), "ai-training", dataset=extra)


def test_a_dataset_of_another_version_is_refused():
    other = parse_dataset_version({"name": "imagenet", "version": "v2", "claim": "ds"})
    with pytest.raises(ValueError, match="is not the job's"):
        m.render_job(JOB_ID, job(full()), "ai-training", dataset=other)


@pytest.mark.parametrize("namespace", ["", "AI", "a_b", "x" * 64])
def test_the_namespace_must_be_a_dns_label(namespace):
    with pytest.raises(ValueError, match="namespace"):
        m.render_job(JOB_ID, job(base()), namespace, dataset=None)


def test_a_bad_job_id_is_refused():
    with pytest.raises(ValueError, match="job id"):
        m.render_job("job_1", job(base()), "ai-training", dataset=None)


# -- plain, deterministic data ----------------------------------------------------------------


def test_the_manifest_is_plain_json_data():
    manifest = render(full())
    assert json.loads(json.dumps(manifest)) == manifest


def test_the_same_input_renders_the_same_bytes():
    first = json.dumps(render(full()))
    assert json.dumps(render(full())) == first


def test_label_order_in_the_spec_does_not_change_the_output():
    forward = full()
    backward = copy.deepcopy(forward)
    backward["metadata"]["labels"] = dict(reversed(forward["metadata"]["labels"].items()))
    backward["metadata"]["annotations"] = {"note": "first run\nof v12"}
    assert json.dumps(render(forward)) == json.dumps(render(backward))


def test_rendering_does_not_change_the_job():
    parsed = job(full())
    before = parsed.model_dump()
    m.render_job(JOB_ID, parsed, "ai-training", dataset=resolve_dataset(parsed.spec.dataset, None))
    assert parsed.model_dump() == before


# -- gangs ------------------------------------------------------------------------------------

GANG_NAME = "kt-" + JOB_ID.lower()
INDEX_REF = {
    "fieldRef": {
        "apiVersion": "v1",
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
    }
}


def gang(workers: int = 2, gpus: int = 8) -> dict[str, Any]:
    data = full()
    data["spec"]["workers"] = workers
    data["spec"]["resources"]["gpus"] = gpus
    if not gpus:
        del data["spec"]["resources"]["gpuType"]
    return render(data)


def test_one_worker_renders_no_gang_fields():
    one = full()
    one["spec"]["workers"] = 1
    assert json.dumps(render(one)) == json.dumps(render(full()))
    spec = render(full())["spec"]
    assert not {"completionMode", "completions", "parallelism"} & set(spec)
    assert "subdomain" not in pod(render(full()))
    assert not [name for name in env(render(full())) if name.startswith("PET_")]


def test_a_gang_is_an_indexed_job_of_its_workers_under_the_services_subdomain():
    manifest = gang(workers=3)
    spec = manifest["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert pod(manifest)["subdomain"] == GANG_NAME == manifest["metadata"]["name"]
    assert container(manifest)["ports"] == [{"containerPort": 29500, "protocol": "TCP"}]


def test_a_gang_gets_the_torchrun_environment_of_trainer_v2():
    variables = env(gang(workers=3, gpus=8))
    assert variables["PET_NNODES"] == "3"
    assert variables["PET_NPROC_PER_NODE"] == "8"
    assert variables["PET_NODE_RANK"] == INDEX_REF
    assert variables["PET_MASTER_ADDR"] == f"{GANG_NAME}-0.{GANG_NAME}.ai-training.svc"
    assert variables["PET_MASTER_PORT"] == "29500"
    assert variables["KUBETRAIN_WORKER_INDEX"] == INDEX_REF
    assert variables["KUBETRAIN_WORKERS"] == "3"
    # The attempt, from the Pod's own label (every attempt of a gang has the name).
    assert variables["KUBETRAIN_ATTEMPT"] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels['kubetrain.io/attempt']"}
    }


def test_a_cpu_gang_runs_one_process_per_worker():
    assert env(gang(gpus=0))["PET_NPROC_PER_NODE"] == "1"


def test_the_user_env_comes_after_the_gang_env_so_it_may_refer_to_it():
    names = list(env(gang()))
    assert names.index("PET_MASTER_ADDR") < names.index("EPOCHS")


def test_a_gangs_rendezvous_timeout_is_the_runtimes_default_unless_the_spec_sets_it():
    assert "KUBETRAIN_RENDEZVOUS_TIMEOUT_SECONDS" not in env(gang())  # the runtime's: 600 s
    data = full()
    data["spec"]["workers"] = 2
    data["spec"]["rendezvousTimeout"] = "15m"
    assert env(render(data))["KUBETRAIN_RENDEZVOUS_TIMEOUT_SECONDS"] == "900"


def test_a_gang_attempt_fails_at_once_on_any_failed_or_disrupted_worker():
    spec = gang()["spec"]
    disrupted, preflight, fail = spec["podFailurePolicy"]["rules"]
    # kubetrain restarts the whole gang as the next attempt, so a disrupted rank is
    # not replaced alone (the others could not rendezvous with it again).
    assert disrupted == {
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    # A rule of its own for the preflight's code, so that the Job's failure message
    # ("matching FailJob rule at index 1") tells it even with the Pod gone.
    assert preflight == {
        "action": "FailJob",
        "onExitCodes": {"containerName": m.CONTAINER_NAME, "operator": "In", "values": [86]},
    }
    assert fail == {
        "action": "FailJob",
        "onExitCodes": {
            "containerName": m.CONTAINER_NAME,
            "operator": "NotIn",
            "values": [0, 86],
        },
    }
    assert spec["backoffLimit"] == 0  # one Job per attempt: kubetrain counts the retries


def test_a_gang_job_carries_its_attempt_and_retries_for_the_restart_decision():
    first = gang()
    assert first["metadata"]["labels"][m.LABEL_ATTEMPT] == "1"
    assert first["spec"]["template"]["metadata"]["labels"][m.LABEL_ATTEMPT] == "1"
    assert first["metadata"]["annotations"][m.ANNOTATION_RETRIES] == "3"
    assert first["metadata"]["annotations"][m.ANNOTATION_RETRIES_USED] == "0"
    data = full()
    data["spec"]["workers"] = 2
    parsed = job(data)
    dataset = resolve_dataset(parsed.spec.dataset, None) if parsed.spec.dataset else None
    third = m.render_job(JOB_ID, parsed, "ai-training", dataset=dataset, attempt=3, retries_used=2)
    assert third["metadata"]["labels"][m.LABEL_ATTEMPT] == "3"
    assert third["metadata"]["annotations"][m.ANNOTATION_RETRIES_USED] == "2"
    with pytest.raises(ValueError, match="4 of 3 retries used"):
        m.render_job(JOB_ID, parsed, "ai-training", dataset=dataset, retries_used=4)


def in_place(retries: int = 1, used: int = 0) -> dict[str, Any]:
    data = full()
    data["spec"]["workers"] = 2
    data["spec"]["retries"] = retries
    data["spec"]["queue"] = "team"
    parsed = job(data)
    dataset = resolve_dataset(parsed.spec.dataset, None) if parsed.spec.dataset else None
    return m.render_job(
        JOB_ID, parsed, "ai-training", dataset=dataset, attempt=used + 1, retries_used=used
    )


def test_a_gang_under_kueue_restarts_in_place_and_its_job_lives_through_a_failure():
    manifest = in_place(retries=1)
    assert manifest["metadata"]["annotations"][m.ANNOTATION_RESTART] == m.IN_PLACE
    disrupted, preflight, fail = manifest["spec"]["podFailurePolicy"]["rules"]
    # A disruption is not the Job's failure, the trainer's is counted, and the preflight's
    # code still fails the Job at once: the same table, kept by kubetrain, not a new Job.
    assert (disrupted["action"], preflight["action"], fail["action"]) == (
        "Ignore",
        "FailJob",
        "Count",
    )
    assert preflight["onExitCodes"]["values"] == [86]
    # With a retry left, the count never fails the Job; kubetrain restarts the gang.
    assert manifest["spec"]["backoffLimit"] == m.UNREACHED_BACKOFF_LIMIT
    # None left: the next failure fails it (the dispatcher sets a resumed last attempt's
    # limit to the failures already counted).
    assert in_place(retries=1, used=1)["spec"]["backoffLimit"] == 0
    assert in_place(retries=0)["spec"]["backoffLimit"] == 0
    # Kueue's labels and suspend as for any queued job.
    assert manifest["spec"]["suspend"] is True
    assert m.ANNOTATION_RESTART not in gang()["metadata"]["annotations"]


def test_a_single_pod_job_carries_no_attempt():
    job = render(full())
    assert m.LABEL_ATTEMPT not in job["metadata"]["labels"]
    assert m.ANNOTATION_RETRIES not in job["metadata"]["annotations"]
    assert job["spec"]["podFailurePolicy"]["rules"][0]["action"] == "Ignore"


def test_the_headless_service_selects_the_jobs_pods_and_goes_with_the_job():
    service = m.render_service(JOB_ID, "ai-training", "uid-1")
    assert service["apiVersion"] == "v1"
    assert service["kind"] == "Service"
    assert service["metadata"]["name"] == GANG_NAME
    assert service["metadata"]["namespace"] == "ai-training"
    assert service["metadata"]["labels"][m.LABEL_JOB_ID] == JOB_ID
    assert service["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": GANG_NAME,
            "uid": "uid-1",
            "blockOwnerDeletion": False,
        }
    ]
    assert service["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        # The Job's own Pods, by its uid: an earlier attempt's Job had the same name.
        "selector": {"batch.kubernetes.io/controller-uid": "uid-1"},
    }
    # And the attempt's only: a gang restarted in place keeps its Job (and uid).
    assert m.render_service(JOB_ID, "ai-training", "uid-1", 2)["spec"]["selector"] == {
        "batch.kubernetes.io/controller-uid": "uid-1",
        m.LABEL_ATTEMPT: "2",
    }


# -- locked down ------------------------------------------------------------------------------


def test_the_container_is_locked_down():
    for manifest in (render(base()), render(full()), render(with_spec(workers=2))):
        context = container(manifest)["securityContext"]
        assert context == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    # Each Job has its own copy: a caller changing one changes no other.
    container(render(base()))["securityContext"]["capabilities"]["drop"].append("x")
    assert container(render(base()))["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_namespaces_get_pod_security_levels_from_the_options():
    assert m.namespace_labels() == {
        "app.kubernetes.io/managed-by": "kubetrain",
        "pod-security.kubernetes.io/enforce": "baseline",
        "pod-security.kubernetes.io/warn": "restricted",
    }
    strict = m.RenderOptions(pod_security_enforce="restricted", pod_security_warn="restricted")
    assert m.namespace_labels(strict)["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("field", ["pod_security_enforce", "pod_security_warn"])
def test_a_pod_security_level_must_be_one_kubernetes_knows(field):
    with pytest.raises(ValueError, match=field):
        m.RenderOptions(**{field: "strict"})
