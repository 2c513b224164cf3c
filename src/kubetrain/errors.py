"""kubetrain's exceptions, as one tree: catch at the level you care about.

```
* KubetrainError                 - the root: kubetrain refused, or could not do, what was asked
  + StoreError (store.errors)    - what the store refuses
    x JobNotFound
    x IdempotencyConflict
    x IllegalTransition
      x TerminalStateError
    x InvalidCursor
    x DatasetConflict
  + ClusterError (cluster.errors) - a call to Kubernetes failed; the client library's
    |                               error is chained as __cause__
    x ClusterUnreachable         - no answer (connection, TLS, timeout): an outage
    x ClusterRefused             - the API server answered with an error status
    x JobConflictError           - a Job or Secret of our name exists and is not ours
    x ClusterConfigError         - no usable kubeconfig or in-cluster account
  + SpecError (domain.spec)      - a TrainingJob that is not valid, the field named
  + QuantityError (domain.quantity) - a Kubernetes quantity that does not parse
  + SnapshotError (domain.snapshot) - a dump of cluster objects that cannot be read
  + RuntimeFailure (runtime.errors) - what runs in the training container cannot do
    x CheckpointError
      x CorruptCheckpoint
      x IncompatibleCheckpoint
    x CacheError
  + ClientError (client.errors)  - the SDK (kubetrain.Client) cannot do what was asked
    x ApiError                   - the server refused; `problem` is its RFC 9457 answer
      x NotFound                 - 404
    x WaitTimeout                - Client.wait ran out of time (also a TimeoutError)
    x JobEnded                   - Client.wait saw the job end in a state not waited for
  + CommandError (cli._errors)   - a command cannot do what was asked; the CLI prints it
  + WhyError (cli.why)           - a dump or a job name `why` cannot use
  + TestbedError, BuildError, PoolError, PortInUseError (testbed) - the local cluster
```

SpecError, QuantityError, SnapshotError and PoolError are also `ValueError`s, and
the other testbed errors `RuntimeError`s, as they were before the tree.

This module imports nothing: kubetrain.runtime, which runs in training images
with the standard library only, roots its tree here without pulling in anything
of the server side (the package is installed whole, `pip install --no-deps`).

Not in the tree, on purpose: database driver errors (`sqlalchemy.exc.*`: the
database is down, not a request wrong), the API's `ProblemError` (an HTTP
answer, not a failure).
"""

from __future__ import annotations

__all__ = ["KubetrainError"]


class KubetrainError(Exception):
    """The root of every error kubetrain raises on purpose; its message is for a user."""

    exit_code = 1  # what the CLI exits with after printing the message
