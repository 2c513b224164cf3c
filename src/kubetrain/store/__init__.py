"""The database: SQLAlchemy 2 models, repositories and Alembic migrations.

SQLite (a file, WAL) is the embedded default; PostgreSQL (psycopg 3) the
production database. Both are tested for real.

    db = Database(url or default_sqlite_url())
    db.upgrade()  # migrations to head; safe to run from every replica at start
    with db.transaction() as session:
        submission = submit_job(session, project=..., name=..., owner=..., ...)

Repository functions take a `Session` in a transaction the caller owns and never
commit; time comes in as `now` (default: the current UTC time).
"""

from kubetrain.store.datasets import (
    dataset_version,
    get_dataset,
    list_datasets,
    register_dataset,
    register_dataset_version,
    resolve_job_dataset,
)
from kubetrain.store.db import Database, default_data_dir, default_sqlite_url, normalize_url
from kubetrain.store.errors import (
    DatasetConflict,
    IdempotencyConflict,
    IllegalTransition,
    InvalidCursor,
    JobNotFound,
    StoreError,
    TerminalStateError,
)
from kubetrain.store.jobs import (
    MATERIAL_FIELDS,
    MAX_PAGE_SIZE,
    JobPage,
    PodObservation,
    RuntimeChange,
    Submission,
    apply_business_change,
    apply_runtime_change,
    current_attempts,
    get_attempt,
    get_job,
    get_job_any_project,
    get_job_by_name,
    job_history,
    list_attempts,
    list_jobs,
    list_unfinished_jobs,
    lock_job,
    record_diagnosis,
    request_cancel,
    spec_digest,
    submit_job,
)
from kubetrain.store.models import (
    ALL_PROJECTS,
    Attempt,
    Base,
    Dataset,
    Job,
    Role,
    Source,
    Token,
    Transition,
    TransitionKind,
)
from kubetrain.store.outbox import (
    claim_due_deletions,
    claim_due_jobs,
    dispatch_backoff,
    mark_deleted,
    mark_dispatched,
    record_dispatch_failure,
)
from kubetrain.store.tokens import (
    authenticate_token,
    create_token,
    find_token,
    hash_token,
    list_tokens,
    revoke_token,
    token_covers,
    use_is_stale,
)

__all__ = [
    "ALL_PROJECTS",
    "MATERIAL_FIELDS",
    "MAX_PAGE_SIZE",
    "Attempt",
    "Base",
    "Database",
    "Dataset",
    "DatasetConflict",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidCursor",
    "Job",
    "JobNotFound",
    "JobPage",
    "PodObservation",
    "Role",
    "RuntimeChange",
    "Source",
    "StoreError",
    "Submission",
    "TerminalStateError",
    "Token",
    "Transition",
    "TransitionKind",
    "apply_business_change",
    "apply_runtime_change",
    "authenticate_token",
    "claim_due_deletions",
    "claim_due_jobs",
    "create_token",
    "current_attempts",
    "dataset_version",
    "default_data_dir",
    "default_sqlite_url",
    "dispatch_backoff",
    "find_token",
    "get_attempt",
    "get_dataset",
    "get_job",
    "get_job_any_project",
    "get_job_by_name",
    "hash_token",
    "job_history",
    "list_attempts",
    "list_datasets",
    "list_jobs",
    "list_tokens",
    "list_unfinished_jobs",
    "lock_job",
    "mark_deleted",
    "mark_dispatched",
    "normalize_url",
    "record_diagnosis",
    "record_dispatch_failure",
    "register_dataset",
    "register_dataset_version",
    "request_cancel",
    "resolve_job_dataset",
    "revoke_token",
    "spec_digest",
    "submit_job",
    "token_covers",
    "use_is_stale",
]
