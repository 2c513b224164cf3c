"""`kubetrain dataset register | list`: the dataset registry, through the API.

Registering takes an admin token scoped to `*` (the registry serves every
project); listing takes any valid token. `kubetrain dataset stamp`, which
writes the stamp on a dataset's files, is kubetrain.runtime's (listed here).
"""

from __future__ import annotations

import argparse

from kubetrain.cli._client import CommandError, connect
from kubetrain.cli._output import emit, short_time, table

DATASETS = "/api/v1/datasets"


def _register(args: argparse.Namespace) -> int:
    # Here: the check is the TrainingJob models' (pydantic), which `list` does without.
    from kubetrain.domain.datasets import parse_dataset_version
    from kubetrain.domain.spec import SpecError

    document = {
        "name": args.name,
        "version": args.version,
        "claim": args.claim,
        "subPath": args.sub_path,
        "checksums": args.checksums,
        "checksumsSha256": args.checksums_sha256,
    }
    document = {key: value for key, value in document.items() if value is not None}
    try:
        parse_dataset_version(document)  # refuse here, naming the option, before any request
    except SpecError as exc:
        options = {"subPath": "--sub-path", "checksumsSha256": "--checksums-sha256"}
        lines = ["the dataset version is not valid:"]
        lines += [f"  {options.get(p.field, p.field)}: {p.message}" for p in exc.problems]
        raise CommandError("\n".join(lines)) from None
    with connect(args) as client:
        reply = client.request("POST", DATASETS, json=document)
    dataset = reply.body["dataset"]
    where = dataset["claim"] + (f":{dataset['subPath']}" if dataset.get("subPath") else "")
    verb = "registered" if reply.status == 201 else "was registered already"
    print(f"dataset {dataset['name']}@{dataset['version']} {verb} ({where})")
    return 0


def _list(args: argparse.Namespace) -> int:
    params = {"name": args.name} if args.name else None
    with connect(args) as client:
        items = client.request("GET", DATASETS, params=params).body["items"]
    if args.output != "table":
        emit(items, args.output)
        return 0
    table(
        ["NAME", "VERSION", "CLAIM", "SUB-PATH", "CREATED", "BY"],
        [
            [
                e["dataset"]["name"],
                e["dataset"]["version"],
                e["dataset"]["claim"],
                e["dataset"].get("subPath"),
                short_time(e["created_at"]),
                e["created_by"],
            ]
            for e in items
        ],
    )
    return 0
