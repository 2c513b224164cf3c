"""`make demo`: start (or reuse) the demo testbed and show its GPU nodes.

Later issues extend it to the whole product: submitting a training job and
watching kubetrain explain why it waits.
"""

from __future__ import annotations

import shlex
import sys

from kubetrain.cli.testbed import node_table
from kubetrain.testbed.cluster import Testbed, TestbedError, state_root


def main() -> int:
    state_dir = state_root() / "demo"
    testbed = Testbed(state_dir)
    try:
        if testbed.state_file.exists() and all(testbed.running().values()):
            print(f"reusing the demo testbed in {state_dir}")
        else:
            testbed.down()
            testbed = Testbed.up(state_dir, "default")
            print(f"demo testbed up in {testbed.status()['ready_seconds']} s: {testbed.server}")
        print()
        print(node_table(testbed))
    except TestbedError as exc:
        print(f"kubetrain demo: {exc}", file=sys.stderr)
        return 1
    print()
    print(f"export KUBECONFIG={shlex.quote(str(testbed.kubeconfig))}")
    print("stop it with: .venv/bin/kubetrain testbed down --name demo")
    return 0


if __name__ == "__main__":
    sys.exit(main())
