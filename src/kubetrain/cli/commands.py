"""Every command's arguments, registered with the standard library alone.

`kubetrain --help` and the parsing of any command import nothing more: each
handler is named here by module and function, and its module (which imports
FastAPI, SQLAlchemy, lightkube, pydantic or httpx as it needs) is imported only
when the command runs. bench/cli_start.py times it.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubetrain.cli._args import FORMATS, add_client_options, add_kube_options
from kubetrain.domain.events import EventType
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.runtime import cli as runtime_cli
from kubetrain.testbed import state_root

ROLES = ("viewer", "submitter", "admin")

Handler = Callable[[argparse.Namespace], int]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for add in (
        _testbed,
        _serve,
        _jobs,
        _why,
        _nodes,
        _tokens,
        _datasets,
        _webhooks,
        _usage,
        _logs,
        _queues,
    ):
        add(subparsers)
    runtime_cli.add_run_arguments(subparsers.add_parser("run", help=runtime_cli.RUN_HELP))


def _lazy(module: str, function: str) -> Handler:
    """The handler `kubetrain.cli.<module>.<function>`, imported when it is called."""

    def run(args: argparse.Namespace) -> int:
        handler: Handler = getattr(importlib.import_module(f"kubetrain.cli.{module}"), function)
        return handler(args)

    return run


def _testbed(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "testbed", help="a real local Kubernetes control plane with fake GPU nodes"
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        verb = verbs.add_parser(name, help=help_text)
        if name != "build":
            verb.add_argument(
                "--name",
                default="default",
                help="testbed name, for several side by side (default: default)",
            )
            verb.add_argument(
                "--state-dir", type=Path, help=f"state directory (default: {state_root()}/NAME)"
            )
        return verb

    b = add(
        "build", "build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, kueue"
    )
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    b.add_argument(
        "--without-kueue", action="store_true", help="skip Kueue (needed only by `up --kueue`)"
    )
    b.add_argument("--print-dir", action="store_true", help="print the binaries' directory")
    b.set_defaults(func=_lazy("testbed", "_build"))
    u = add("up", "start a testbed and wait until its nodes are Ready")
    u.add_argument(
        "--pool",
        default="default",
        help="node pool: default, no-gpu, large, or a pool file (.yaml)",
    )
    u.add_argument("--apiserver-port", type=int, help="fixed kube-apiserver port (default: free)")
    u.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for Ready")
    u.add_argument(
        "--kueue",
        action="store_true",
        help="also run Kueue (its CRDs, webhooks and visibility API; jobs queue through it)",
    )
    u.add_argument(
        "--in-cluster",
        action="store_true",
        help="with --pool real: install kubetrain itself from deploy/base (2 replicas on the "
        "real kubelets, PostgreSQL, kube-proxy); `testbed env` then gives its URL and a token",
    )
    u.set_defaults(func=_lazy("testbed", "_up"))
    d = add("down", "stop the testbed's processes and remove its state")
    d.add_argument("--keep", action="store_true", help="keep the state directory")
    d.set_defaults(func=_lazy("testbed", "_down"))
    add("status", "say what runs").set_defaults(func=_lazy("testbed", "_status"))
    add(
        "env",
        "print `export KUBECONFIG=...` for the testbed (and, with --in-cluster, "
        "KUBETRAIN_URL and an admin KUBETRAIN_TOKEN)",
    ).set_defaults(func=_lazy("testbed", "_env"))
    add("nodes", "list the testbed's nodes with their GPUs").set_defaults(
        func=_lazy("testbed", "_nodes")
    )


def _serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help="run the API, dispatcher and syncer")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8080)")
    parser.add_argument(
        "--forwarded-allow-ips",
        help="proxies trusted for X-Forwarded-Proto/-For: comma-separated IPs or CIDRs, or '*' "
        "(default 127.0.0.1); name the TLS-terminating ingress so cookies get Secure",
    )
    parser.add_argument("--database-url", help="default: $KUBETRAIN_DATABASE_URL or SQLite")
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    role = parser.add_mutually_exclusive_group()
    role.add_argument(
        "--no-control",
        action="store_true",
        help="serve the API only (other replicas run the control loops)",
    )
    role.add_argument(
        "--no-api",
        action="store_true",
        help="run the control loops only (serving just /healthz, /livez, /readyz, /metrics)",
    )
    parser.add_argument(
        "--no-leader-elect",
        action="store_true",
        help="act without holding the Lease (one replica only!)",
    )
    parser.add_argument(
        "--lease-namespace",
        default="default",
        help="namespace of the coordination Lease (default: default)",
    )
    parser.add_argument(
        "--resync", type=float, default=30.0, help="seconds between full resyncs of unfinished jobs"
    )
    parser.set_defaults(func=_lazy("serve", "_serve"))


def _jobs(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    submit = subparsers.add_parser("submit", help="submit a TrainingJob from a YAML file")
    submit.add_argument("-f", "--filename", required=True, help="the TrainingJob YAML; - for stdin")
    submit.add_argument(
        "--idempotency-key",
        help="retrying with the same key never makes a second job",
    )
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="submit nothing: validate, and forecast what the job would meet if submitted now",
    )
    submit.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    add_client_options(submit)
    submit.set_defaults(func=_lazy("jobs", "_submit"))

    get = subparsers.add_parser("get", help="show jobs")
    kinds = get.add_subparsers(dest="kind", required=True, metavar="KIND")
    many = kinds.add_parser("jobs", help="a project's jobs, newest first")
    many.add_argument(
        "--state",
        action="append",
        type=_choice(BusinessState),
        help="only this business state (repeatable)",
    )
    many.add_argument(
        "--reason", action="append", type=_choice(ReasonCode), help="only this reason (repeatable)"
    )
    many.add_argument("--name", help="only jobs of this name")
    many.add_argument("--limit", type=int, help="at most this many (default: all)")
    many.add_argument("-o", "--output", choices=(*FORMATS, "wide"), default="table")
    add_client_options(many)
    many.set_defaults(func=_lazy("jobs", "_get_jobs"))
    one = kinds.add_parser("job", help="one job: its state, reason and runtime state")
    one.add_argument("job", metavar="NAME|ID")
    one.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    add_client_options(one)
    one.set_defaults(func=_lazy("jobs", "_get_job"))

    history = subparsers.add_parser("history", help="every change of a job's state, in order")
    history.add_argument("job", metavar="NAME|ID")
    history.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_client_options(history)
    history.set_defaults(func=_lazy("jobs", "_history"))

    cancel = subparsers.add_parser("cancel", help="cancel a job (deletes its Kubernetes Job)")
    cancel.add_argument("job", metavar="NAME|ID")
    add_client_options(cancel)
    cancel.set_defaults(func=_lazy("jobs", "_cancel"))


def _why(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "why",
        help="say why a training job is or is not running",
        description="Say which link of the chain holds a job, why, since when and what to do. "
        "Three ways: `why NAME|ID [-p PROJECT]` asks the kubetrain server; "
        "`why NAME --kubeconfig PATH -n NAMESPACE` reads the cluster directly (NAME is the "
        "Kubernetes Job, kt-<id>); `why --from-file DUMP` reads a kubectl dump.",
    )
    parser.add_argument(
        "ref",
        nargs="?",
        metavar="NAME|ID",
        help="the job: its name or id (server), or the Kubernetes Job's name (direct, dump)",
    )
    parser.add_argument(
        "--from-file",
        dest="files",
        metavar="DUMP",
        nargs="+",
        help="kubectl get job,pods,events,nodes,pvc,resourcequota -o json|yaml output "
        "(several are merged; - is standard input)",
    )
    parser.add_argument("--job", help="the Kubernetes Job in the dump (needed when it has several)")
    parser.add_argument(
        "-n",
        "--namespace",
        help="the Job's namespace: direct mode (default: the kubeconfig's), or in a dump "
        "when names repeat",
    )
    add_kube_options(parser)
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="output format"
    )
    add_client_options(parser)
    parser.set_defaults(func=_lazy("why", "_why"))


def _nodes(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "nodes",
        help="show the nodes' GPUs, cpu, memory and health, and where waiting jobs could go",
        description="Read the cluster directly (read-only): per node the accelerator, GPUs, "
        "cpu and memory (allocatable / requested / free), taints, health and cordon; and "
        "for each kubetrain job waiting to be placed, where it could fit.",
    )
    add_kube_options(parser)
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="output format"
    )
    parser.set_defaults(func=_lazy("nodes", "_nodes"))


def _tokens(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("token", help="API tokens (written to the database directly)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        verb = verbs.add_parser(name, help=help_text)
        verb.add_argument(
            "--database-url", help="the server's database (default: KUBETRAIN_DATABASE_URL)"
        )
        return verb

    create = add("create", "make a token and print it (only it) on stdout")
    create.add_argument("--project", required=True, help="a project, or '*' for every project")
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--name", help="who or what holds it (default: ROLE-PROJECT)")
    create.set_defaults(func=_lazy("tokens", "_create"))
    listing = add("list", "list tokens (never their secret)")
    listing.add_argument("--project", help="only tokens scoped to this project or to '*'")
    listing.add_argument("--all", action="store_true", help="include revoked tokens")
    listing.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    listing.set_defaults(func=_lazy("tokens", "_list"))
    revoke = add("revoke", "revoke a token by its id")
    revoke.add_argument("token_id", metavar="ID")
    revoke.set_defaults(func=_lazy("tokens", "_revoke"))


def _datasets(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("dataset", help="the dataset registry (versions are immutable)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    add = verbs.add_parser("register", help="register where a dataset version lives")
    add.add_argument("name")
    add.add_argument("version")
    add.add_argument("--claim", required=True, help="the PersistentVolumeClaim holding it")
    add.add_argument("--sub-path", help="its directory inside the claim")
    add.add_argument("--checksums", help="path of its checksum manifest, relative to --sub-path")
    add.add_argument("--checksums-sha256", help="sha256 of that manifest, to pin it")
    add_client_options(add, project=False)
    add.set_defaults(func=_lazy("datasets", "_register"))
    listing = verbs.add_parser("list", help="registered dataset versions")
    listing.add_argument("name", nargs="?", help="only the versions of this dataset")
    listing.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_client_options(listing, project=False)
    listing.set_defaults(func=_lazy("datasets", "_list"))
    runtime_cli.add_stamp_arguments(verbs.add_parser("stamp", help=runtime_cli.STAMP_HELP))


WEBHOOK_EVENTS = tuple(str(t) for t in EventType)


def _webhooks(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "webhook", help="a project's receivers of job events (CloudEvents, signed)"
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    create = verbs.add_parser("create", help="add a receiver; prints its signing secret once")
    create.add_argument(
        "--url", dest="url_to_call", metavar="URL", required=True, help="the receiver's http(s) URL"
    )
    create.add_argument(
        "--events",
        nargs="+",
        choices=WEBHOOK_EVENTS,
        metavar="TYPE",
        help=f"event types to send (default: all): {', '.join(WEBHOOK_EVENTS)}",
    )
    create.add_argument(
        "--server", dest="url", help="the kubetrain server (default: KUBETRAIN_URL)"
    )
    create.add_argument("-p", "--project", help="the project (default: KUBETRAIN_PROJECT)")
    create.set_defaults(func=_lazy("webhooks", "_create"))
    listing = verbs.add_parser("list", help="the project's webhooks and their deliveries")
    listing.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_client_options(listing)
    listing.set_defaults(func=_lazy("webhooks", "_list"))
    delete = verbs.add_parser("delete", help="remove a receiver")
    delete.add_argument("id")
    add_client_options(delete)
    delete.set_defaults(func=_lazy("webhooks", "_delete"))


def _logs(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "logs", help="a job's output: the newest attempt's, or the one asked for"
    )
    parser.add_argument("name", metavar="NAME|ID", help="the job (the newest of that name)")
    parser.add_argument("--attempt", type=int, metavar="N", help="attempt N (see `history`)")
    parser.add_argument("--worker", type=int, metavar="R", help="a gang's worker of rank R")
    parser.add_argument("-f", "--follow", action="store_true", help="stream until it ends")
    parser.add_argument("--tail", type=int, metavar="N", help="the last N lines only")
    parser.add_argument("--since", metavar="DURATION", help="only lines newer than 10m, 1h…")
    parser.add_argument("--timestamps", action="store_true", help="each line's time first")
    add_client_options(parser)
    parser.set_defaults(func=_lazy("logs", "_logs"))


def _usage(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "usage", help="GPU-hours per project and GPU type, before training and training"
    )
    parser.add_argument(
        "-p",
        "--project",
        help="one project (default: every project the token covers, which takes an admin)",
    )
    parser.add_argument(
        "--since", help="only GPU time after this: a duration back (24h, 90m, 7d) or a time"
    )
    parser.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_client_options(parser, project=False)
    parser.set_defaults(func=_lazy("usage", "_usage"))


def _queues(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "queues",
        help="Kueue's ClusterQueues: quota per flavor, what is reserved, who waits in what order",
    )
    parser.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_client_options(parser, project=False)
    parser.set_defaults(func=_lazy("queues", "_queues"))


def _choice(enum: type[BusinessState] | type[ReasonCode]) -> Any:
    def parse(text: str) -> str:
        value = text.upper()
        if value not in enum.__members__:
            allowed = ", ".join(enum.__members__)
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {allowed}")
        return value

    parse.__name__ = enum.__name__  # argparse names the type in its messages
    return parse


# -- submit --------------------------------------------------------------------
