"""kubetrain: a control plane for AI training jobs on Kubernetes."""

__version__ = "0.1.0"
