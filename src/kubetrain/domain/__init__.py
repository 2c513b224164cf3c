"""The pure core: no I/O, no clock reads, no Kubernetes client."""
