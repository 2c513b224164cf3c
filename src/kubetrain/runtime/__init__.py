"""What runs inside the training container: preflight, checkpoints, progress, dataset cache.

Standard library only (torch where checkpoints need it): nothing here imports
the server side (FastAPI, SQLAlchemy, pydantic, the Kubernetes client), so a
training image installs kubetrain without its dependencies and runs
`kubetrain run -- CMD` or `python -m kubetrain.runtime run -- CMD`.
tests/unit/test_runtime_imports.py keeps it so.

Errors, drawn once (their root, kubetrain.errors.KubetrainError, imports
nothing; kubetrain/errors.py draws the whole tree):

    * RuntimeFailure
      + CheckpointError
        - CorruptCheckpoint        (partial, truncated, checksum mismatch)
        - IncompatibleCheckpoint   (bound to another dataset version, code, params, world size)
      + CacheError
"""
