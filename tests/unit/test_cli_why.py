"""`kubetrain why --from-file`: the human view, -o json, YAML, merged files, and bad files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.cli.main import main
from tests.unit.diagnosis_helpers import SNAPSHOTS, dump

pytestmark = pytest.mark.unit


def why(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["why", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_view_walks_the_chain_and_shows_the_node_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = why(capsys, "--from-file", str(SNAPSHOTS / "untolerated-taint.json"))
    assert (code, err) == (0, "")
    assert "QUEUED · UNTOLERATED_TAINT · waiting will not help" in out
    assert "[ok] control-plane" in out
    assert "[!!] scheduler" in out
    assert "[  ] training" in out
    for label in ("Why", "Do", "Since", "Raw", "Blockers", "Nodes", "Constraints", "Attempts"):
        assert f"  {label}" in out
    assert "taint nvidia.com/gpu=present:NoSchedule not tolerated" in out
    assert "0/4 nodes are available" in out
    assert "(who acts: user)" in out


def test_text_view_of_a_failed_job(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = why(capsys, "--from-file", str(SNAPSHOTS / "real-preflight-failed.json"))
    assert code == 0
    assert "FAILED · PREFLIGHT_FAILED" in out
    assert "[xx] preflight" in out
    assert "exit 86" in out
    assert "  Nodes" not in out


def test_json_output_is_the_documented_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = why(capsys, "--from-file", str(SNAPSHOTS / "gpu-busy.json"), "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert data["job"] == "kt-gpu-busy"
    assert (data["business_status"], data["reason"], data["waitable"]) == (
        "QUEUED",
        "INSUFFICIENT_GPU",
        True,
    )
    assert data["blockers"][0]["nodes"] == 4
    assert len(data["nodes"]) == 4


def test_yaml_and_several_files_are_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = dump("no-gpu-nodes")
    nodes = [i for i in data["items"] if i["kind"] == "Node"]
    rest = [i for i in data["items"] if i["kind"] != "Node"]
    (tmp_path / "nodes.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes})
    )
    (tmp_path / "job.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": rest})
    )
    code, out, _ = why(
        capsys,
        "--from-file",
        str(tmp_path / "job.json"),
        str(tmp_path / "nodes.yaml"),
        "-o",
        "json",
    )
    assert code == 0
    assert json.loads(out)["reason"] == "NO_GPU_NODES"
    # Without the nodes, the dump cannot tell whether any node advertises GPUs, and says so.
    code, out, _ = why(capsys, "--from-file", str(tmp_path / "job.json"), "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert data["reason"] == "INSUFFICIENT_GPU"
    assert any("no Nodes" in n for n in data["notes"])


def test_job_is_chosen_by_name_when_the_dump_has_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = SNAPSHOTS / "running.json", SNAPSHOTS / "succeeded.json"
    code, _, err = why(capsys, "--from-file", str(a), str(b))
    assert code == 1
    assert "several Jobs" in err
    assert "--job NAME" in err
    code, out, _ = why(capsys, "--from-file", str(a), str(b), "--job", "kt-succeeded", "-o", "json")
    assert (code, json.loads(out)["reason"]) == (0, "COMPLETED")
    code, _, err = why(capsys, "--from-file", str(a), "--job", "kt-nope")
    assert code == 1
    assert "no Job named 'kt-nope'" in err
    assert "kt-running" in err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("", "empty"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "array"),
        ("just: [unclosed", "not valid JSON or YAML at line 1"),
        ('{"kind": "List", "items": []}', "holds no Job"),
        ("42", "int"),
        (
            '{"apiVersion": "v1", "kind": "List", '
            '"items": [{"kind": "Pod", "metadata": {"name": "p"}}]}',
            "holds no Job",
        ),
        ("a: 1\n---\n- 2\n", "not a Kubernetes List or object"),
    ],
)
def test_bad_files_are_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    path = tmp_path / "dump.json"
    path.write_text(content)
    code, out, err = why(capsys, "--from-file", str(path))
    assert code == 1
    assert out == ""
    assert err.startswith("kubetrain: error: ")
    assert says in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_missing_and_binary_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = why(capsys, "--from-file", str(tmp_path / "absent.json"))
    assert code == 1
    assert "no such file" in err
    binary = tmp_path / "dump.bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    code, _, err = why(capsys, "--from-file", str(binary))
    assert code == 1
    assert "not a text file" in err
    code, _, err = why(capsys, "--from-file", str(tmp_path))
    assert code == 1
    assert "is a directory" in err


def test_standard_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO((SNAPSHOTS / "real-oom-killed.json").read_text()))
    code, out, _ = why(capsys, "--from-file", "-", "-o", "json")
    assert (code, json.loads(out)["reason"]) == (0, "OOM_KILLED")


# -- the live modes' refusals: one line, non-zero, no traceback ------------------

UNREACHABLE = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: team-a}}]
current-context: x
"""


def one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kubetrain: error: ")
    return lines[0]


def test_why_without_a_job_or_a_dump_says_how_to_name_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = why(capsys)
    assert (code, out) == (1, "")
    assert "name the job" in one_line(err)


@pytest.mark.parametrize("command", [["why", "kt-x", "-n", "team-a"], ["nodes"]])
def test_direct_modes_name_an_unreachable_cluster(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(UNREACHABLE)
    code = main([*command, "--kubeconfig", str(config)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert "cannot reach the Kubernetes API at https://127.0.0.1:1" in one_line(err)


@pytest.mark.parametrize("command", [["why", "kt-x", "-n", "team-a"], ["nodes"]])
@pytest.mark.parametrize("content", [None, "", "not: [a kubeconfig", "kind: Config\n"])
def test_direct_modes_name_a_kubeconfig_they_cannot_use(
    command: list[str], content: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kubeconfig"
    if content is not None:
        config.write_text(content)
    code = main([*command, "--kubeconfig", str(config)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    one_line(err)


def test_a_dump_and_a_kubeconfig_do_not_go_together(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = why(capsys, "--from-file", str(SNAPSHOTS / "gpu-busy.json"), "--kubeconfig", "x")
    assert code == 1
    assert "--from-file and --kubeconfig" in one_line(err)


def test_the_job_may_be_named_as_the_argument_with_a_dump(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = why(capsys, "kt-gpu-busy", "--from-file", str(SNAPSHOTS / "gpu-busy.json"))
    assert code == 0
    assert out.startswith("Job kt-gpu-busy in namespace ")


def test_the_text_view_reads_a_stored_diagnosis_missing_fields() -> None:
    from datetime import UTC, datetime

    from kubetrain.cli.why import render_text
    from kubetrain.domain.diagnosis import JobFacts

    facts = JobFacts(name="j", k8s_name="kt-1", namespace="ns", dispatched=True)
    out = render_text({"reason": "INSUFFICIENT_GPU", "chain": "nonsense"}, facts, datetime.now(UTC))
    assert "? · INSUFFICIENT_GPU" in out


@pytest.mark.parametrize(
    "broken",
    [
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": "oops"},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": ""}},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}},  # no namespace
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": 5, "namespace": "a"}},
    ],
)
def test_a_job_kubetrain_cannot_read_is_refused_never_diagnosed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, broken: dict[str, object]
) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [broken]}))
    code, out, err = why(capsys, "--from-file", str(path))
    assert code != 0
    assert out == ""
    assert err.count("\n") == 1
    assert "holds no Job" in err
    assert "1 object without a readable metadata" in err


def test_an_unreadable_object_beside_readable_ones_is_skipped_with_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = dump("running")
    data["items"].append({"apiVersion": "v1", "kind": "Pod", "metadata": ["not", "a", "map"]})
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(data))
    code, out, _ = why(capsys, "--from-file", str(path))
    assert code == 0
    assert "1 object without a readable metadata" in out
    assert "Pod" in out


class DumpKube:
    """`why --kubeconfig`'s client over a recorded dump: each list answers the dump's
    objects of that kind (a namespace and selectors narrow nothing in these dumps)."""

    def __init__(self, name: str, refuse: frozenset[str] = frozenset()) -> None:
        self.items = dump(name)["items"]
        self.refuse = refuse
        self.asked: set[str] = set()
        self.versions: set[str | None] = set()

    def served_version(self, group: str) -> str | None:
        """Kueue's group is served where the dump holds Kueue's objects."""
        kinds = {i["apiVersion"].split("/")[-1] for i in self.items if group in i["apiVersion"]}
        return min(kinds) if kinds else None

    def job(self, namespace: str, name: str) -> dict[str, object] | None:
        jobs = [i for i in self.items if i["kind"] == "Job"]
        return next((j for j in jobs if j["metadata"]["name"] == name), jobs[0] if jobs else None)

    def list(
        self, resource: str, namespace: str | None = None, version: str | None = None, **_: object
    ) -> list[Any]:
        from kubetrain.cluster.direct import KINDS
        from kubetrain.cluster.errors import ClusterRefused

        self.asked.add(resource)
        if version is not None:
            self.versions.add(version)
        if resource in self.refuse and namespace is None:
            raise ClusterRefused(403, "Forbidden", f"the Kubernetes API refused {resource}")
        return [i for i in self.items if i["kind"] == KINDS[resource][1]]


def test_why_direct_reads_what_a_dump_holds_and_diagnoses_alike(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kubetrain.cli.why import read_job_listing
    from tests.unit.diagnosis_helpers import run

    # The bound PersistentVolume is what tells a volume node conflict from a GPU shortage.
    kube = DumpKube("volume-node-conflict")
    listing = read_job_listing(kube, "kt-x", "ns")
    assert {"persistentvolumes", "storageclasses", "limitranges", "priorityclasses"} <= kube.asked
    assert "PersistentVolume" in {i["kind"] for i in listing["items"]}
    assert run(listing).reason == run(dump("volume-node-conflict")).reason
    # Without read access to a cluster-wide kind the answer still comes, with a note.
    refused = DumpKube("volume-node-conflict", frozenset({"storageclasses"}))
    read_job_listing(refused, "kt-x", "ns")
    assert "read without storageclasses" in capsys.readouterr().err


def test_why_direct_reads_kueues_objects_where_kueue_is_installed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kubetrain.cli.why import read_job_listing
    from tests.unit.diagnosis_helpers import run

    kube = DumpKube("kueue-waiting")
    listing = read_job_listing(kube, "kt-kueue-waiting", "ns")
    assert {"workloads", "clusterqueues", "localqueues", "resourceflavors"} <= kube.asked
    assert kube.versions == {"v1beta2"}  # the one the cluster serves
    kinds = [i["kind"] for i in listing["items"]]
    assert kinds.count("Workload") == 2  # the job's and the one ahead of it
    assert run(listing).to_json("x") == run(dump("kueue-waiting")).to_json("x")
    # Where the kubeconfig may read only its namespace's Workloads, it says so and goes on.
    narrow = DumpKube("kueue-waiting", frozenset({"workloads"}))
    read_job_listing(narrow, "kt-kueue-waiting", "ns")
    assert "workloads of this namespace only" in capsys.readouterr().err
    # No Kueue: nothing asked of it, and no note for a Job that names no queue.
    plain = DumpKube("running")
    read_job_listing(plain, "kt-running", "ns")
    assert not {"workloads", "clusterqueues"} & plain.asked
    assert "Kueue" not in capsys.readouterr().err
