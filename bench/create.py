"""The dispatcher's CPU per Job made, outside the API server: the render and the create.

On a `default` pool testbed, rounds of `--jobs` suspended Jobs (kubetrain's manifest for
the scale bench's job, no Pods to make) are created 50 in flight, as the dispatcher's
calls, on uvloop as `kubetrain serve` runs. In turn, in every round, side by side:

* **typed**: lightkube's typed client as the dispatcher made them first
  (`Job.from_dict` of the manifest, `create`, the answer decoded into a model);
* **httpx**: `cluster.jobs.create_job` through httpx (the manifest as msgspec's JSON,
  the answer read for the uid alone): the dispatcher's create before cluster/wire.py,
  and still its create where a proxy is named for the API server;
* **wire**: `cluster.jobs.create_job` as the dispatcher makes it now: the same bytes
  through kubetrain's own kept HTTP/1.1 connections over asyncio's TLS (cluster/wire.py).

Measured: this process's CPU (user + system) per create, each round and side; the
first round warms both up and is not counted. Beside it, in-process, `render_job` per
Job with the spec's digest computed and with the stored one given (best of 5).

    .venv/bin/python bench/create.py [--jobs 400] [--rounds 4]

Prints a table and writes bench/results/create.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import tempfile
import timeit
import uuid
from pathlib import Path
from typing import Any, cast

import httpx2 as httpx
import uvloop
from _common import RESULTS, table
from lightkube.config.client_adapter import ConnectionParams
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace
from scale import backlog_job

from kubetrain.cluster import client as client_module
from kubetrain.cluster.client import (
    ClusterConfig,
    CreatingClient,
    TypedClient,
    creating_client,
    load_config,
    typed_client,
)
from kubetrain.cluster.jobs import create_job
from kubetrain.domain.manifest import RenderOptions, render_job
from kubetrain.domain.spec import spec_digest
from kubetrain.testbed.cluster import Testbed

IN_FLIGHT = 50  # the dispatcher's calls in flight (control/dispatcher.py BATCH)
OPTIONS = RenderOptions(status_url="http://127.0.0.1:8000")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def one_round(
    typed: TypedClient, http: dict[str, CreatingClient], side: str, jobs: int
) -> float:
    """CPU ms per create of `jobs` suspended Jobs in a namespace of their own."""
    namespace = f"create-{side}-{uuid.uuid4().hex[:6]}"
    await typed.create(Namespace(metadata=ObjectMeta(name=namespace)))
    job = backlog_job("bench", "1s", 1)
    manifests = [
        render_job(f"create-{i}", job, namespace, dataset=None, options=OPTIONS)
        for i in range(jobs)
    ]
    for manifest in manifests:
        manifest["spec"]["suspend"] = True
    limit = asyncio.Semaphore(IN_FLIGHT)

    async def create(manifest: dict[str, Any]) -> None:
        async with limit:
            if side == "typed":
                made = await typed.create(cast(Job, Job.from_dict(manifest)))
                assert made.metadata is not None
                assert made.metadata.uid
            else:
                assert await create_job(http[side], typed, manifest)

    began = cpu_seconds()
    await asyncio.gather(*(create(m) for m in manifests))
    per_create = 1000 * (cpu_seconds() - began) / jobs
    await typed.delete(Namespace, namespace)
    return per_create


async def creates(testbed: Testbed, jobs: int, rounds: int) -> dict[str, list[float]]:
    config = load_config(testbed.kubeconfig)
    typed = typed_client(config)
    http = {"wire": creating_client(config), "httpx": via_httpx(config)}
    measured: dict[str, list[float]] = {"typed": [], "httpx": [], "wire": []}
    try:
        for number in range(rounds + 1):
            for side in measured:
                ms = await one_round(typed, http, side, jobs)
                print(f"  round {number} {side}: {ms:.3f} ms CPU per create", flush=True)
                if number:  # round 0 warms both up
                    measured[side].append(ms)
    finally:
        for each in http.values():
            await each.aclose()
        await typed.close()
    return measured


def via_httpx(config: ClusterConfig) -> CreatingClient:
    """`creating_client` as where a proxy is named for the server: through httpx (with the
    typed client's kept connections, as before cluster/wire.py)."""
    params = ConnectionParams().httpx_params(config)
    params["transport"] = client_module._transport(config)
    return client_module._ViaHttpx(httpx.AsyncClient(**params))


def renders() -> dict[str, float]:
    """µs per `render_job`, the digest computed and given (best of 5 runs of 2,000)."""
    job = backlog_job("bench", "1s", 1)
    digest = spec_digest(job)
    out = {}
    for name, given in (("digest computed", None), ("digest given", digest)):

        def render(given: str | None = given) -> None:
            render_job("create-1", job, "bench", dataset=None, options=OPTIONS, digest=given)

        runs = timeit.repeat(render, number=2000, repeat=5)
        out[name] = round(min(runs) / 2000 * 1e6, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400, help="Jobs per round and side")
    parser.add_argument("--rounds", type=int, default=4, help="rounds counted (one more warms up)")
    args = parser.parse_args()
    report: dict[str, Any] = {"jobs": args.jobs, "rounds": args.rounds, "in_flight": IN_FLIGHT}
    report["render_us"] = renders()
    print(f"render_job: {report['render_us']} µs per Job", flush=True)
    with tempfile.TemporaryDirectory(prefix="kubetrain-create-") as tmp:
        testbed = Testbed.up(Path(tmp) / "testbed", "default", timeout=600)
        try:
            measured = uvloop.run(creates(testbed, args.jobs, args.rounds))
        finally:
            testbed.down()
    report["cpu_ms_per_create"] = measured
    rows = [
        [side, " ".join(f"{v:.2f}" for v in values), statistics.median(values)]
        for side, values in measured.items()
    ]
    print(table(["create", "CPU ms per create, by round", "median"], rows, [8, 36, 8]))
    median = {side: statistics.median(values) for side, values in measured.items()}
    report["wire_to_httpx"] = round(median["wire"] / median["httpx"], 2)
    report["wire_to_typed"] = round(median["wire"] / median["typed"], 2)
    print(
        f"wire / httpx (medians): {report['wire_to_httpx']:.2f}; "
        f"wire / typed: {report['wire_to_typed']:.2f}"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "create.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {RESULTS / 'create.json'}")


if __name__ == "__main__":
    main()
