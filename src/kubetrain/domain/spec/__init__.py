"""The user-facing TrainingJob (kubetrain.io/v1) and everything that is refused in it.

One shape serves as the YAML of `kubetrain submit -f` and the JSON body of the
API, so it reads like a Kubernetes object:

    apiVersion: kubetrain.io/v1
    kind: TrainingJob
    metadata: {name: train-policy-v12, project: ai-training, labels: {}, annotations: {}}
    spec:
      image: registry.example/trainer:2026-08
      command: [python, train.py]
      workers: 2            # a gang of 2 Pods (one Indexed Job); resources are per worker
      env: [{name: EPOCHS, value: "10"},
            {name: WANDB_API_KEY, secretRef: {name: wandb, key: token}}]
      resources: {requests: {cpu: "4", memory: 16Gi}, limits: {cpu: "8", memory: 32Gi},
                  gpus: 1, gpuType: nvidia-h100}
      dataset: {name: imagenet, version: v3, claim: dataset-imagenet, subPath: v3}
      checkpoints: {claim: ckpt-train-policy}
      output: {claim: out-train-policy}
      cache: {size: 100Gi}
      priorityClass: batch-normal
      maxRuntime: 24h
      stallAfter: 30m       # no step for this long: NO_PROGRESS (default: the platform's)
      cancelAfterStall: 2h  # NO_PROGRESS for this long: cancelled (default: never)
      rendezvousTimeout: 15m  # a gang's ranks wait this long for rank 0 (default: 600s)
      cancelOnNonFiniteLoss: true  # LOSS_NOT_FINITE: cancelled (default: false, only said)
      retries: 3

Everything is checked here, before a record exists, so that a mistake is
refused at submission with the field named instead of failing later in a Pod:
unknown fields, types (no YAML coercion: `version: 1.10` is a float and is
refused, not turned into "1.1"), Kubernetes name and quantity syntax, limits
below requests, fractional GPUs, reserved names and oversize values.

Errors:

    * ValueError
      x SpecError            problems: list[FieldProblem(field, message)]

`parse_training_job` and `parse_training_job_yaml` raise nothing else for any
input. A field is a dotted path (`spec.resources.requests.cpu`,
`spec.env[1].name`, `metadata.labels["team"]`); the empty path is the whole
document.

Model attributes are snake_case; the wire names are the camelCase aliases
(`gpu_type` <-> `gpuType`), and only the wire names are accepted as input.

Modules (this package's face re-exports what callers use):

    problems   FieldProblem, SpecError, MAX_PROBLEMS; fail and raise_at for checks;
               problems_from_validation_error (pydantic's errors, translated)
    fields     one value's types and checks: names, keys, image, env, quantities
               (cpu_value, bytes_value), durations (duration_seconds, from
               domain/durations.py), credentials;
               checked_by to make a validator of a check; utf8_size, how every
               size limit is counted; the per-field limits
    models     SpecModel and TrainingJob with its parts; cross-field checks and
               collection limits; API_VERSION, KIND
    parse      parse_training_job (a decoded document) and parse_training_job_yaml
               (the strict YAML loader); MAX_YAML_BYTES
    identity   spec_digest (the job normalised to one spelling per value)

Kubernetes name syntax is `kubetrain.domain.names`; quantities and their one
spelling (canonical_cpu, canonical_bytes) are `kubetrain.domain.quantity`.
"""

from kubetrain.domain.spec.fields import (
    MAX_NAME_LENGTH,
    DatasetName,
    DatasetVersionName,
    ObjectName,
    SubPath,
    bytes_value,
    checked_by,
    cpu_value,
    duration_seconds,
)
from kubetrain.domain.spec.identity import spec_digest
from kubetrain.domain.spec.models import (
    API_VERSION,
    KIND,
    MAX_ANNOTATIONS,
    MAX_ENV_ENTRIES,
    MAX_LABELS,
    Cache,
    DatasetRef,
    EnvVar,
    Limits,
    Metadata,
    Requests,
    Resources,
    SecretKeyRef,
    SpecModel,
    TrainingJob,
    TrainingJobSpec,
    VolumeClaim,
)
from kubetrain.domain.spec.parse import (
    MAX_YAML_BYTES,
    parse_training_job,
    parse_training_job_yaml,
)
from kubetrain.domain.spec.problems import (
    MAX_PROBLEMS,
    FieldProblem,
    SpecError,
    problems_from_validation_error,
    raise_at,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "MAX_ANNOTATIONS",
    "MAX_ENV_ENTRIES",
    "MAX_LABELS",
    "MAX_NAME_LENGTH",
    "MAX_PROBLEMS",
    "MAX_YAML_BYTES",
    "Cache",
    "DatasetName",
    "DatasetRef",
    "DatasetVersionName",
    "EnvVar",
    "FieldProblem",
    "Limits",
    "Metadata",
    "ObjectName",
    "Requests",
    "Resources",
    "SecretKeyRef",
    "SpecError",
    "SpecModel",
    "SubPath",
    "TrainingJob",
    "TrainingJobSpec",
    "VolumeClaim",
    "bytes_value",
    "checked_by",
    "cpu_value",
    "duration_seconds",
    "parse_training_job",
    "parse_training_job_yaml",
    "problems_from_validation_error",
    "raise_at",
    "spec_digest",
]
