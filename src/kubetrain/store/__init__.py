"""The database: SQLAlchemy 2 models, repositories and Alembic migrations.

SQLite (a file, WAL) is the embedded default; PostgreSQL (psycopg 3) the
production database. Both are tested for real.

    db = Database(url or default_sqlite_url())
    db.upgrade()  # migrations to head; safe to run from every replica at start
    with db.transaction() as session:
        submission = submit_job(session, project=..., name=..., owner=..., ...)

Repository functions take a `Session` in a transaction the caller owns and never
commit; time comes in as `now` (default: the current UTC time). Importing the
package registers store/metrics.py's listeners, which count each stay in a
business state once its transaction commits.
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
    MAX_PAGE_SIZE,
    JobPage,
    Submission,
    apply_business_change,
    apply_locked_business_change,
    count_jobs,
    current_attempts,
    get_attempt,
    get_job,
    get_job_any_project,
    job_history,
    list_attempts,
    list_jobs,
    list_projects,
    list_unfinished_jobs,
    lock_job,
    lock_jobs,
    request_cancel,
    submit_job,
)
from kubetrain.store.metrics import JobCounts
from kubetrain.store.models import (
    ALL_PROJECTS,
    Attempt,
    Base,
    Dataset,
    Job,
    Progress,
    Report,
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
    record_dispatch_outcomes,
    retry_backed_off_now,
)
from kubetrain.store.progress import (
    MAX_DROPPED,
    MAX_REPORTS,
    MAX_STEP_REPORTS,
    ReportEvent,
    Resume,
    checkpoint_reports,
    get_progress,
    job_id_of_status_token,
    progress_by_job,
    record_reports,
    resume_lineage,
    set_status_token,
    step_series,
)
from kubetrain.store.tokens import (
    authenticate_token,
    create_token,
    find_live_token_by_id,
    find_token,
    hash_token,
    list_tokens,
    revoke_token,
    use_is_stale,
)
from kubetrain.store.transitions import MATERIAL_FIELDS, PodObservation
from kubetrain.store.web_sessions import close_web_session, open_web_session, web_session_token

__all__ = [
    "ALL_PROJECTS",
    "MATERIAL_FIELDS",
    "MAX_DROPPED",
    "MAX_PAGE_SIZE",
    "MAX_REPORTS",
    "MAX_STEP_REPORTS",
    "Attempt",
    "Base",
    "Database",
    "Dataset",
    "DatasetConflict",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidCursor",
    "Job",
    "JobCounts",
    "JobNotFound",
    "JobPage",
    "PodObservation",
    "Progress",
    "Report",
    "ReportEvent",
    "Resume",
    "Role",
    "Source",
    "StoreError",
    "Submission",
    "TerminalStateError",
    "Token",
    "Transition",
    "TransitionKind",
    "apply_business_change",
    "apply_locked_business_change",
    "authenticate_token",
    "checkpoint_reports",
    "claim_due_deletions",
    "claim_due_jobs",
    "close_web_session",
    "count_jobs",
    "create_token",
    "current_attempts",
    "dataset_version",
    "default_data_dir",
    "default_sqlite_url",
    "dispatch_backoff",
    "find_live_token_by_id",
    "find_token",
    "get_attempt",
    "get_dataset",
    "get_job",
    "get_job_any_project",
    "get_progress",
    "hash_token",
    "job_history",
    "job_id_of_status_token",
    "list_attempts",
    "list_datasets",
    "list_jobs",
    "list_projects",
    "list_tokens",
    "list_unfinished_jobs",
    "lock_job",
    "lock_jobs",
    "normalize_url",
    "open_web_session",
    "progress_by_job",
    "record_dispatch_outcomes",
    "record_reports",
    "register_dataset",
    "register_dataset_version",
    "request_cancel",
    "resolve_job_dataset",
    "resume_lineage",
    "retry_backed_off_now",
    "revoke_token",
    "set_status_token",
    "status_token_matches",
    "step_series",
    "submit_job",
    "use_is_stale",
    "web_session_token",
]
