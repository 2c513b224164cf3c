"""kubetrain on real kubelets: real containers, real cgroups, containerd's own words.

The pool is `real` (src/kubetrain/testbed/pools/real.yaml): two kubelets with a
containerd each, bridge CNI, and a device plugin advertising 2 nvidia.com/gpu per
node that are not there.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

import kubetrain
from kubetrain.local_server import CLI, LocalServer
from kubetrain.settings import ServerSettings
from kubetrain.testbed.cluster import Testbed
from kubetrain.testbed.images import TRAINER_IMAGE
from kubetrain.testbed.processes import pick_free_ports
from tests.e2e.conftest import Server
from tests.kube import create, eventually

pytestmark = pytest.mark.realnode


def job(name: str, project: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "project": project},
        "spec": {
            "image": TRAINER_IMAGE,
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
            **spec,
        },
    }


def submit(server: LocalServer, body: dict[str, Any]) -> str:
    project = body["metadata"]["project"]
    with server.client() as http:
        resp = http.post(f"/api/v1/projects/{project}/jobs", json=body)
    assert resp.status_code in (200, 201), resp.text
    return str(resp.json()["id"])


def wait_for(
    server: LocalServer, project: str, job_id: str, state: str, reason: str, timeout: float = 90
) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        with server.client() as http:
            resp = http.get(f"/api/v1/projects/{project}/jobs/{job_id}")
        resp.raise_for_status()
        last.clear()
        last.update(resp.json())
        return last if (last["business_status"], last["reason"]) == (state, reason) else None

    try:
        return eventually(probe, timeout, what=f"{state}/{reason}")
    except pytest.fail.Exception:
        seen = {k: last.get(k) for k in ("business_status", "reason", "raw_reason", "raw_message")}
        pytest.fail(f"job {job_id} never reached {state}/{reason}; last seen {seen}")


def kubectl(testbed: Testbed, *args: str) -> str:
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={testbed.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def project() -> str:
    return f"real-{uuid.uuid4().hex[:8]}"


def test_real_nodes_are_ready_with_containerd_and_advertised_gpus(real_kube: Client):
    nodes = [n for n in real_kube.list(Node) if (n.metadata.labels or {}).get("type") == "real"]
    assert len(nodes) >= 2
    for node in nodes:
        assert node.status.nodeInfo.containerRuntimeVersion.startswith("containerd://")
        assert node.status.nodeInfo.kubeletVersion == "v1.33.13"
        assert node.status.allocatable["nvidia.com/gpu"] == "2"
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        internal = [a.address for a in node.status.addresses if a.type == "InternalIP"]
        assert internal
        assert not internal[0].startswith("127.")


def test_the_kubelets_ignore_the_shared_disks_free_share(real_testbed: Testbed, real_kube: Client):
    # Every node's disk is this machine's: with the default thresholds a machine under 15 %
    # free put both nodes under DiskPressure and evicted every Pod (seen in CI). The kubelet
    # says what it runs with; a misspelt field would leave its default here.
    for node in real_kube.list(Node):
        if (node.metadata.labels or {}).get("type") != "real":
            continue
        raw = kubectl(
            real_testbed, "get", "--raw", f"/api/v1/nodes/{node.metadata.name}/proxy/configz"
        )
        config = json.loads(raw)["kubeletconfig"]
        assert config["evictionHard"]["imagefs.available"] == "1%"
        assert config["evictionHard"]["nodefs.available"] == "1%"
        assert config["imageGCHighThresholdPercent"] == 100
        assert not any(
            c.type == "DiskPressure" and c.status == "True" for c in node.status.conditions
        )


def _pod(name: str, node: str, args: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": TRAINER_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c"],
                    "args": args,
                    "resources": {"limits": {"cpu": "200m", "memory": "128Mi"}},
                }
            ],
        },
    }


def test_pods_on_different_nodes_talk_over_the_pod_network_and_exec_works(
    real_kube: Client, real_testbed: Testbed
):
    ns = f"pod-network-{uuid.uuid4().hex[:5]}"
    kubectl(real_testbed, "create", "namespace", ns)
    eventually(
        lambda: "default" in kubectl(real_testbed, "get", "sa", "-n", ns, "-o", "name"),
        30,
        what="the default ServiceAccount",
    )
    node_names = sorted(
        str(n.metadata.name)
        for n in real_kube.list(Node)
        if (n.metadata.labels or {}).get("type") == "real"
    )
    serve = (
        "import http.server as h; "
        "h.HTTPServer(('', 8000), h.SimpleHTTPRequestHandler).serve_forever()"
    )
    create(real_kube, _pod("server", node_names[0], [serve]), ns)
    server_ip = eventually(
        lambda: (
            (p := real_kube.get(Pod, "server", namespace=ns)).status.phase == "Running"
            and p.status.podIP
        ),
        60,
        what="the server Pod's IP",
    )
    # The API server reaches the kubelet, which streams from containerd.
    exec_out = kubectl(real_testbed, "exec", "-n", ns, "server", "--", "python", "-c", "print(6*7)")
    assert exec_out.strip() == "42"
    fetch = (
        "import urllib.request, sys; "
        f"r = urllib.request.urlopen('http://{server_ip}:8000/', timeout=10); "
        "print('status', r.status)"
    )
    create(real_kube, _pod("client", node_names[1], [fetch]), ns)
    eventually(
        lambda: real_kube.get(Pod, "client", namespace=ns).status.phase == "Succeeded",
        60,
        what="the client Pod to fetch from the server on the other node",
    )
    assert "status 200" in kubectl(real_testbed, "logs", "-n", ns, "client")
    kubectl(real_testbed, "delete", "namespace", ns, "--wait=false")


def test_cluster_dns_resolves_services_by_name_and_nothing_outside(
    real_kube: Client, real_testbed: Testbed
):
    ns = f"dns-{uuid.uuid4().hex[:5]}"
    kubectl(real_testbed, "create", "namespace", ns)
    eventually(
        lambda: "default" in kubectl(real_testbed, "get", "sa", "-n", ns, "-o", "name"),
        30,
        what="the default ServiceAccount",
    )
    node = next(
        str(n.metadata.name)
        for n in real_kube.list(Node)
        if (n.metadata.labels or {}).get("type") == "real"
    )
    lookup = (
        "import socket\n"
        "print('service', socket.gethostbyname('kubernetes.default'))\n"
        "try:\n"
        "    socket.gethostbyname('example.com')\n"
        "except socket.gaierror as exc:\n"
        "    print('outside', exc.__class__.__name__)\n"
    )
    create(real_kube, _pod("lookup", node, [lookup]), ns)
    eventually(
        lambda: real_kube.get(Pod, "lookup", namespace=ns).status.phase == "Succeeded",
        60,
        what="the lookup Pod",
    )
    logs = kubectl(real_testbed, "logs", "-n", ns, "lookup")
    # The API server's Service: the first address of the Service range.
    assert "service 10.96.0.1" in logs
    assert "outside gaierror" in logs
    kubectl(real_testbed, "delete", "namespace", ns, "--wait=false")


def test_a_job_through_kubetrain_prints_to_kubectl_logs(
    real_server: LocalServer, real_testbed: Testbed
):
    p = project()
    line = f"hello from a real container {uuid.uuid4().hex[:6]}"
    job_id = submit(real_server, job("hello", p, args=["python", "-c", f"print({line!r})"]))
    done = wait_for(real_server, p, job_id, "SUCCEEDED", "COMPLETED")
    pods = kubectl(real_testbed, "get", "pods", "-n", done.get("namespace") or p, "-o", "name")
    assert pods.strip(), "no Pod left to read the logs of"
    logs = kubectl(real_testbed, "logs", "-n", done.get("namespace") or p, pods.split()[0])
    assert line in logs


def test_a_job_past_its_memory_limit_is_oom_killed_by_a_real_cgroup(real_server: LocalServer):
    p = project()
    body = job(
        "oom",
        p,
        resources={"requests": {"cpu": "100m", "memory": "64Mi"}},
        args=["python", "-c", "x = b'x' * (512 << 20)"],
    )
    job_id = submit(real_server, body)
    done = wait_for(real_server, p, job_id, "FAILED", "OOM_KILLED")
    assert done["raw_reason"] == "OOMKilled"


def test_an_image_on_a_closed_loopback_port_waits_as_image_pull_failed(
    real_server: LocalServer,
):
    p = project()
    port = pick_free_ports(1)[0]  # nothing listens there
    job_id = submit(real_server, job("pull", p, image=f"127.0.0.1:{port}/trainer:missing"))
    done = wait_for(real_server, p, job_id, "QUEUED", "IMAGE_PULL_FAILED")
    # containerd's own words, through the kubelet
    assert f"127.0.0.1:{port}" in done["raw_message"]
    assert "connection refused" in done["raw_message"]


def test_a_gpu_job_fails_its_preflight_because_the_container_sees_no_gpu(
    real_server: LocalServer,
):
    p = project()
    body = job(
        "gpu",
        p,
        resources={"requests": {"cpu": "100m", "memory": "256Mi"}, "gpus": 1},
        args=["python", "-c", "print('training')"],
    )
    job_id = submit(real_server, body)
    done = wait_for(real_server, p, job_id, "FAILED", "PREFLIGHT_FAILED")
    assert "gpu-visible" in done["raw_message"]
    assert "expected 1 GPU, found 0" in done["raw_message"]


def test_kubetrain_logs_follows_a_real_container_while_it_prints(real_server: Server):
    """`kubetrain logs -f` streams the container's own output as the kubelet serves it:
    lines arrive while the job still runs, in order, and the command ends with the
    container. Afterwards the same lines come back without -f."""
    p = project()
    ticks = 8
    script = (
        "import time\n"
        f"for i in range({ticks}):\n"
        "    print(f'tick {i}', flush=True)\n"
        "    time.sleep(1.5)\n"
    )
    job_id = submit(real_server, job("ticks", p, args=["python", "-c", script]))

    def running() -> bool:
        with real_server.client() as http:
            doc = http.get(f"/api/v1/projects/{p}/jobs/{job_id}").json()
        return bool(doc["business_status"] == "RUNNING")

    eventually(running, 90, what="the job to run")
    env = {
        **real_server.env,
        "KUBETRAIN_URL": real_server.url,
        "KUBETRAIN_TOKEN": real_server.token,
    }
    follow = subprocess.Popen(
        [*CLI, "logs", job_id, "--project", p, "-f"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        seen: list[str] = []
        still_running_when_read: list[bool] = []
        for line in follow.stdout:
            if line.startswith("tick "):
                seen.append(line.rstrip("\n"))
                if len(seen) == 1:
                    still_running_when_read.append(running())
        code = follow.wait(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert code == 0, follow.stderr.read() if follow.stderr else ""
    # The first line came while the job still ran: streamed, not read at the end.
    assert still_running_when_read == [True]
    assert seen[-ticks:] == [f"tick {i}" for i in range(ticks)], seen
    wait_for(real_server, p, job_id, "SUCCEEDED", "COMPLETED")
    again = real_server.cli("logs", job_id, "--project", p)
    assert again.returncode == 0, again.stderr
    assert [x for x in again.stdout.splitlines() if x.startswith("tick ")] == [
        f"tick {i}" for i in range(ticks)
    ]


def test_the_sdk_follows_a_real_container_and_asks_about_the_job_between_lines(
    real_server: Server,
):
    """A notebook's loop: `Client.logs(follow=True)` yields the container's lines as
    they come, and the same Client, asked about the job between two lines, answers
    (the stream keeps its connection, the question takes another)."""
    p = project()
    ticks = 8
    script = (
        "import time\n"
        f"for i in range({ticks}):\n"
        "    print(f'tick {i}', flush=True)\n"
        "    time.sleep(1.5)\n"
        "print('last words', end='')\n"  # no line break after the last line
    )
    sdk = kubetrain.Client(real_server.url, real_server.token, project=p)
    submitted = sdk.submit(job("sdk-ticks", p, args=["python", "-c", script]))
    sdk.wait(submitted.id, until="RUNNING", timeout=90, poll_interval=0.5)
    lines: list[str] = []
    asked: list[str] = []
    for line in sdk.logs("sdk-ticks", follow=True):
        lines.append(line)
        if len(asked) == 0 and line.startswith("tick "):
            asked.append(sdk.get(submitted.id).state)
    assert asked == ["RUNNING"]  # streamed while it ran, not read at the end
    assert [x for x in lines if x.startswith("tick ")] == [f"tick {i}" for i in range(ticks)]
    assert lines[-1] == "last words"
    done = sdk.wait(submitted.id, timeout=60, poll_interval=0.5)
    assert (done.state, done.reason) == ("SUCCEEDED", "COMPLETED")
    why = sdk.why("sdk-ticks")
    assert (why.state, why.reason) == ("SUCCEEDED", "COMPLETED")
    assert list(sdk.logs(submitted.id, tail=1)) == ["last words"]


def test_one_token_holds_at_most_n_follow_streams_and_each_ends_with_the_pod(
    real_server: Server,
):
    """The bound on follow streams is per token, the next one is a 429 with Retry-After,
    a stream closed by its client gives its place back, and every stream ends when the
    Pod does (here: the job cancelled, its Pod deleted)."""
    limit = ServerSettings.model_fields["log_follow_streams_per_token"].default
    p = project()
    script = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"
    job_id = submit(real_server, job("streams", p, args=["python", "-c", script]))
    url = f"/api/v1/projects/{p}/jobs/{job_id}/logs"

    def running() -> bool:
        with real_server.client() as http:
            doc = http.get(f"/api/v1/projects/{p}/jobs/{job_id}").json()
        return bool(doc["business_status"] == "RUNNING")

    eventually(running, 90, what="the job to run")
    with contextlib.ExitStack() as held, real_server.client() as http:

        def follow(token: str | None = None) -> tuple[httpx.Response, Iterator[str]]:
            headers = {"Authorization": f"Bearer {token}"} if token else None
            answer = held.enter_context(
                http.stream("GET", url, params={"follow": "true"}, headers=headers)
            )
            lines = answer.iter_lines()  # one reader per stream: httpx reads a body once
            if answer.status_code == 200:  # the preflight's lines, then the program's
                assert list(_until_ready(lines))[-1] == "ready"
            return answer, lines

        streams = [follow() for _ in range(limit)]
        assert [answer.status_code for answer, _ in streams] == [200] * limit
        refused = http.get(url, params={"follow": "true"})
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["Retry-After"]) > 0
        assert refused.json()["type"] == "urn:kubetrain:problem:too-many-streams"
        # Without follow the log is read and ends: not bounded.
        assert "ready" in http.get(url).text.splitlines()
        # Another token's streams are its own.
        other = follow(real_server.create_token(p, "viewer"))
        assert other[0].status_code == 200
        # A client that goes gives its place back.
        streams.pop(0)[0].close()
        again = eventually(
            lambda: (s := follow())[0].status_code == 200 and s, 20, what="the freed place"
        )
        streams.append(again)
        assert http.post(f"/api/v1/projects/{p}/jobs/{job_id}/cancel").status_code == 200
        # The Pod ends: every stream ends (a read past its last line would time out).
        for _, lines in [*streams, other]:
            assert "ready" not in list(lines)
    # Their places are free again: the next follow is answered for the Pod, not refused.
    with real_server.client() as http:
        assert http.get(url, params={"follow": "true"}).status_code != 429


def _until_ready(lines: Iterator[str]) -> Iterator[str]:
    """The lines up to the program's `ready`, which ends them; fails if the log ends first."""
    for line in lines:
        yield line
        if line == "ready":
            return
    pytest.fail("the log ended before the program's first line")


DIVERGES = """
import time
from kubetrain.runtime import progress
progress.step(1, loss=0.5)
progress.step(2, loss=float("nan"))
time.sleep(300)
"""


def test_a_real_job_reporting_a_nan_loss_at_step_2_is_loss_not_finite(real_server: Server):
    p = project()
    job_id = submit(real_server, job("diverges", p, args=["python", "-c", DIVERGES]))
    done = wait_for(real_server, p, job_id, "RUNNING", "LOSS_NOT_FINITE")
    assert done["progress"]["step"] == 2
    assert done["progress"]["metrics"]["loss"] == "NaN"
    with real_server.client() as http:
        diagnosis = http.get(f"/api/v1/projects/{p}/jobs/{job_id}/diagnosis").json()
        assert (diagnosis["waitable"], diagnosis["actor"]) == (False, "user")
        assert "Step 2 reported loss = NaN." in diagnosis["explanation"]
        shown = real_server.cli("get", "job", job_id, "-p", p)
        assert "loss NaN" in shown.stdout, shown.stderr
        http.post(f"/api/v1/projects/{p}/jobs/{job_id}/cancel")


# Run inside the container: the token the kubelet projected, sent as the runtime
# sends it, for the Pod's own job (until the syncer has seen the Pod: 503) and for
# another job; only the answers' codes are printed, never the token.
_TOKEN_PROBE = """
import json, os, time, urllib.error, urllib.request
def post(job_id):
    token = open(os.environ["KUBETRAIN_STATUS_TOKEN_FILE"]).read().strip()
    body = json.dumps({"pod": os.environ["KUBETRAIN_POD_NAME"], "events": []}).encode()
    url = os.environ["KUBETRAIN_STATUS_URL"] + "/api/v1/jobs/" + job_id + "/reports"
    headers = {"Content-Type": "application/json", "Authorization": "Bearer " + token}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
for _ in range(120):
    own = post(os.environ["KUBETRAIN_JOB_ID"])
    if own != 503:
        break
    time.sleep(0.5)
print("own", own, "other", post(OTHER), flush=True)
"""


def test_the_kubelets_projected_token_is_heard_for_its_job_and_refused_for_another(
    real_server: Server,
):
    p = project()
    other = submit(real_server, job("other", p, args=["python", "-c", "print('other')"]))
    script = _TOKEN_PROBE.replace("OTHER", repr(other))
    job_id = submit(real_server, job("token", p, args=["python", "-c", script]))
    wait_for(real_server, p, job_id, "SUCCEEDED", "COMPLETED")
    with real_server.client() as http:
        logs = http.get(f"/api/v1/projects/{p}/jobs/{job_id}/logs")
    assert logs.status_code == 200, logs.text
    assert "own 202 other 403" in logs.text, logs.text
