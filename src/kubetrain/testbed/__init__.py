"""A real local Kubernetes control plane for tests, benchmarks and the demo.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run for real
on loopback; KWOK plays the kubelets of fake GPU nodes declared in pool files,
and `kind: real` groups run real kubelets with containerd on this machine.
"""

import os
from pathlib import Path

__all__ = ["state_root"]


def state_root() -> Path:
    """Where testbeds keep their state, one directory per name (standard library only:
    the CLI's help text shows it without importing the testbed)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kubetrain" / "testbed"
