"""The only room that talks to Kubernetes: client setup, list+watch caches,
snapshots for the diagnosis, idempotent create and delete."""
