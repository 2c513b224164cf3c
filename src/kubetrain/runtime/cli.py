"""`kubetrain run [--preflight] -- CMD ARGS…` and `kubetrain dataset stamp`, standard library only.

`kubetrain.cli.main` hands these two commands here before it imports anything
of the server side, so they work in a training image that has kubetrain
installed without its dependencies (`python -m kubetrain.runtime` too).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kubetrain.runtime.contract import (
    DATASET_STAMP,
    PHASE_PREFLIGHT,
    PHASE_TRAINING,
    PREFLIGHT_EXIT_CODE,
    TERMINATION_LOG_DEFAULT,
)

if TYPE_CHECKING:
    from kubetrain.runtime import progress
    from kubetrain.runtime.redact import Redactor

# Before exec: time for the TRAINING phase to reach the control plane, at most.
EXEC_FLUSH_SECONDS = 2.0
EXIT_NOT_FOUND = 127  # what shells exit with when a command is not found
EXIT_NOT_EXECUTABLE = 126
RUN_HELP = "check the container can train, then exec the training command"
STAMP_HELP = f"write {DATASET_STAMP} (name, version, file checksums) at a dataset's root"


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="only run the checks: print the JSON report, exit 0 or 86, never run CMD",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    parser.set_defaults(func=run_command)


def add_stamp_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="the dataset's root directory")
    parser.add_argument("--name", required=True, help="the dataset's name")
    parser.add_argument("--version", required=True, help="the dataset's version")
    parser.add_argument(
        "--no-files", action="store_true", help="name and version only, no file checksums"
    )
    parser.set_defaults(func=stamp_command)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="kubetrain")
    commands = root.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
    add_run_arguments(commands.add_parser("run", help=RUN_HELP))
    dataset = commands.add_parser("dataset", help="datasets")
    verbs = dataset.add_subparsers(dest="verb", required=True, metavar="VERB")
    add_stamp_arguments(verbs.add_parser("stamp", help=STAMP_HELP))
    return root


def handles(argv: Sequence[str]) -> bool:
    """True for the commands this module runs without the server side."""
    return bool(argv) and (argv[0] == "run" or list(argv[:2]) == ["dataset", "stamp"])


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


def run_command(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command and not args.preflight:
        print("kubetrain run: error: no command: kubetrain run -- CMD ARGS", file=sys.stderr)
        return 2
    # Here, not at the top: parsing any kubetrain command line must stay cheap.
    from kubetrain.runtime import progress
    from kubetrain.runtime.env import termination_log
    from kubetrain.runtime.preflight import Context, run_preflight
    from kubetrain.runtime.redact import Redactor

    environ = dict(os.environ)
    redact = Redactor(environ)
    reporter = progress.default_reporter()
    on_check = None
    if reporter is not None:
        reporter.phase(PHASE_PREFLIGHT)
        on_check = functools.partial(reporter.phase, PHASE_PREFLIGHT)
    report = run_preflight(Context(environ), redact, on_check)
    for result in report.results:
        print(
            f"kubetrain preflight: {result.name} {result.status} ({result.seconds:.3f} s): "
            f"{result.detail}",
            file=sys.stderr,
        )
    line = report.termination_line()
    if line is not None:
        _write_termination_log(termination_log(environ, TERMINATION_LOG_DEFAULT), line, redact)
        print(redact(json.dumps(report.document())))
        if reporter is not None:
            reporter.close(EXEC_FLUSH_SECONDS)
        return PREFLIGHT_EXIT_CODE
    if args.preflight:
        print(redact(json.dumps(report.document())))
        return 0
    return _exec(command, reporter, redact)


def _exec(command: list[str], reporter: progress.Reporter | None, redact: Redactor) -> int:
    from kubetrain.runtime import progress

    if reporter is not None:
        reporter.phase(PHASE_TRAINING)
        reporter.flush(EXEC_FLUSH_SECONDS)
        os.environ[progress.SEQ_ENV] = str(reporter.last_seq)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # exec: the command becomes this process, so it gets the signals and its exit code
        # is the container's.
        os.execvp(command[0], command)  # noqa: S606 - no shell: the arguments are the user's
    except FileNotFoundError:
        print(redact(f"kubetrain run: error: {command[0]}: command not found"), file=sys.stderr)
        return EXIT_NOT_FOUND
    except OSError as exc:
        print(redact(f"kubetrain run: error: {command[0]}: {exc.strerror}"), file=sys.stderr)
        return EXIT_NOT_EXECUTABLE


def _write_termination_log(path: str, line: str, redact: Redactor) -> None:
    try:
        Path(path).write_text(line + "\n")
    except OSError as exc:
        print(
            redact(f"kubetrain preflight: cannot write the termination log {path}: {exc.strerror}"),
            file=sys.stderr,
        )


def stamp_command(args: argparse.Namespace) -> int:
    from kubetrain.runtime.stamp import StampError, write_stamp

    try:
        stamp = write_stamp(Path(args.path), args.name, args.version, with_files=not args.no_files)
    except StampError as exc:
        print(f"kubetrain: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"kubetrain: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"stamped {args.path} as {stamp.name}@{stamp.version} ({len(stamp.files)} files)")
    return 0
