"""Entry point: parses the command line, turns known errors into one clear line.

`kubetrain run` and `kubetrain dataset stamp` run inside training images that
have only the standard library: they go to kubetrain.runtime before anything
of the server side is imported, so the imports of the other commands are here,
in the functions, not at the top.

Whatever a command raises ends here as one line on stderr and a non-zero exit:
kubetrain's own errors (kubetrain.errors) as `kubetrain: error: ...`, anything
else as an internal error (70). `--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from kubetrain import __version__
from kubetrain.runtime import cli as runtime_cli


def parser() -> argparse.ArgumentParser:
    from kubetrain.cli import commands

    root = argparse.ArgumentParser(
        prog="kubetrain",
        description="Training jobs on Kubernetes, and why they are not running.",
    )
    root.add_argument("--version", action="version", version=f"kubetrain {__version__}")
    root.add_argument(
        "--debug", action="store_true", help="on an unexpected error, print its traceback"
    )
    commands.register(root.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return root


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if runtime_cli.handles(arguments):
        return runtime_cli.main(arguments)
    return _main(arguments)


def _main(argv: Sequence[str]) -> int:
    from kubetrain.errors import KubetrainError

    # Known before parsing: a failure while building the parser is reported the same way.
    debug = "--debug" in argv[: argv.index("--")] if "--" in argv else "--debug" in argv
    try:
        args = parser().parse_args(argv)
        return int(args.func(args))
    except KubetrainError as exc:
        _report(exc, debug)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # A bug, or a failure nothing anticipated: one line, never a traceback
        # unless asked for.
        if debug:
            traceback.print_exc()
        print(
            f"kubetrain: internal error: {type(exc).__name__}: {_first_line(exc)}"
            + ("" if debug else " (run `kubetrain --debug ...` for the traceback)"),
            file=sys.stderr,
        )
        return EXIT_INTERNAL


EXIT_INTERNAL = 70  # EX_SOFTWARE, as `why` answers a diagnosis that failed


def _report(exc: BaseException, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    print(f"kubetrain: error: {exc}", file=sys.stderr)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:300]


if __name__ == "__main__":
    sys.exit(main())
