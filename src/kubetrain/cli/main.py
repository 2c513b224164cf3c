"""Entry point: parses the command line, turns known errors into one clear line.

`kubetrain run` and `kubetrain dataset stamp` run inside training images that
have only the standard library: they go to kubetrain.runtime before anything
of the server side is imported, so the imports of the other commands are here,
in the functions, not at the top.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kubetrain import __version__
from kubetrain.runtime import cli as runtime_cli


def parser() -> argparse.ArgumentParser:
    from kubetrain.cli import datasets, jobs, nodes, serve, testbed, tokens, why

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
    runtime_cli.add_run_arguments(commands.add_parser("run", help=runtime_cli.RUN_HELP))
    return root


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if runtime_cli.handles(arguments):
        return runtime_cli.main(arguments)
    return _main(arguments)


def _main(argv: Sequence[str]) -> int:
    from kubetrain.cli._client import CommandError
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
