"""Options several commands share; argparse only, so registering a command stays cheap."""

from __future__ import annotations

import argparse

FORMATS = ("table", "json", "yaml")  # -o of the listing commands


def add_client_options(parser: argparse.ArgumentParser, *, project: bool = True) -> None:
    parser.add_argument("--url", help="the kubetrain server (default: KUBETRAIN_URL)")
    if project:
        parser.add_argument("-p", "--project", help="the project (default: KUBETRAIN_PROJECT)")


def add_kube_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="read the cluster directly with this kubeconfig (default: $KUBECONFIG, "
        "~/.kube/config)",
    )
