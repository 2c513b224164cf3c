"""Entry point: parses the command line, turns known errors into one clear line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kubetrain import __version__
from kubetrain.cli import datasets, jobs, nodes, serve, testbed, tokens, why
from kubetrain.cli._client import CommandError


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="kubetrain",
        description="Training jobs on Kubernetes, and why they are not running.",
    )
    root.add_argument("--version", action="version", version=f"kubetrain {__version__}")
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    testbed.register(commands)
    serve.register(commands)
    jobs.register(commands)
    why.register(commands)
    nodes.register(commands)
    tokens.register(commands)
    datasets.register(commands)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    from kubetrain.domain.quantity import QuantityError
    from kubetrain.testbed.build import BuildError
    from kubetrain.testbed.cluster import TestbedError
    from kubetrain.testbed.pools import PoolError
    from kubetrain.testbed.processes import PortInUseError

    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (BuildError, TestbedError, PoolError, PortInUseError, QuantityError) as exc:
        print(f"kubetrain: error: {exc}", file=sys.stderr)
        return 1
    except CommandError as exc:
        print(f"kubetrain: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
