"""`kubetrain run`: every preflight check passing and failing, in a real process, on real files."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from kubetrain.runtime import checkpoint_files, preflight
from kubetrain.runtime.contract import CHECK_NAMES, PREFLIGHT_EXIT_CODE
from kubetrain.runtime.preflight import Context, run_preflight
from kubetrain.runtime.redact import Redactor
from kubetrain.runtime.stamp import write_stamp
from tests.runtime.conftest import SRC, base_env, kubetrain

pytestmark = pytest.mark.runtime


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()

    def do_POST(self) -> None:  # progress reports: accepted, not looked at here
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(202)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def status_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def job(volume: Path, status_url: str) -> dict[str, str]:
    """The environment of a job whose every check passes (no GPU expected): rank 0 of a
    gang of two, on this machine."""
    data = volume / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "a.bin").write_bytes(b"a" * 1000)
    (data / "b.txt").write_text("b")
    write_stamp(data, "mnist", "v2")
    (volume / "checkpoints").mkdir()
    (volume / "output").mkdir()
    (volume / "config.json").write_text('{"lr": 0.1}')
    return base_env(
        KUBETRAIN_JOB_ID="job-1",
        KUBETRAIN_EXPECTED_GPUS="0",
        KUBETRAIN_DATASET_PATH=str(data),
        KUBETRAIN_DATASET_NAME="mnist",
        KUBETRAIN_DATASET_VERSION="v2",
        KUBETRAIN_CONFIG_PATH=str(volume / "config.json"),
        KUBETRAIN_CHECKPOINT_DIR=str(volume / "checkpoints"),
        KUBETRAIN_OUTPUT_DIR=str(volume / "output"),
        KUBETRAIN_STATUS_URL=status_url,
        KUBETRAIN_TERMINATION_LOG=str(volume / "termination-log"),
        KUBETRAIN_WORKERS="2",
        KUBETRAIN_WORKER_INDEX="0",
        PET_NNODES="2",
        PET_NPROC_PER_NODE="1",
        PET_NODE_RANK="0",
        PET_MASTER_ADDR="localhost",
        PET_MASTER_PORT=str(_closed_port()),
    )


def test_all_checks_pass_in_order_then_the_command_runs_with_its_exit_code(job):
    done = kubetrain("run", "--", sys.executable, "-c", "print('training'); exit(7)", env=job)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "training\n"  # the report goes to stderr when nothing failed
    lines = [line for line in done.stderr.splitlines() if line.startswith("kubetrain preflight:")]
    assert [line.split()[2] for line in lines] == list(CHECK_NAMES)
    assert all(line.split()[3] == "passed" for line in lines), done.stderr
    assert not Path(job["KUBETRAIN_TERMINATION_LOG"]).exists()


def test_preflight_only_reports_every_check_passed_with_its_own_time(job):
    """How long the checks take is bench/preflight.py's (target: under 2 s in all)."""
    done = kubetrain("run", "--preflight", env=job)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] is True
    assert [c["name"] for c in report["checks"]] == list(CHECK_NAMES)
    assert {c["status"] for c in report["checks"]} == {"passed"}
    assert all(c["seconds"] >= 0 for c in report["checks"])


def test_preflight_only_never_runs_the_command(job, volume):
    marker = volume / "ran"
    done = kubetrain("run", "--preflight", "--", "touch", str(marker), env=job)
    assert done.returncode == 0
    assert not marker.exists()


def test_signals_reach_the_command_since_it_is_execed(job):
    done = kubetrain(
        "run", "--", sys.executable, "-c", "import os; os.kill(os.getpid(), 15)", env=job
    )
    assert done.returncode == -signal.SIGTERM


def test_a_command_not_found_exits_127(job):
    done = kubetrain("run", "--", "no-such-trainer", env=job)
    assert done.returncode == 127
    assert "no-such-trainer: command not found" in done.stderr


def test_unset_variables_skip_their_checks_and_say_so():
    done = kubetrain("run", "--preflight", env=base_env())
    assert done.returncode == 0
    checks = json.loads(done.stdout)["checks"]
    assert [c["status"] for c in checks] == ["skipped"] * len(CHECK_NAMES)
    assert checks[0]["detail"] == "skipped: KUBETRAIN_EXPECTED_GPUS is not set"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _corrupt_checkpoint(root: Path) -> None:
    step = root / checkpoint_files.step_dir_name(10)
    step.mkdir()
    (step / "state.pt").write_bytes(b"x" * 10)
    manifest = {"format": 1, "step": 10, "files": {"state.pt": {"size": 99, "sha256": "0" * 64}}}
    (step / checkpoint_files.MANIFEST).write_text(json.dumps(manifest))


def _bound_checkpoint(root: Path, dataset_version: str) -> None:
    step = root / checkpoint_files.step_dir_name(20)
    step.mkdir()
    (step / "state.pt").write_bytes(b"state")
    manifest = {
        "format": 1,
        "step": 20,
        "files": {"state.pt": {"size": 5, "sha256": hashlib.sha256(b"state").hexdigest()}},
        "binding": {"dataset_version": dataset_version},
    }
    (step / checkpoint_files.MANIFEST).write_text(json.dumps(manifest))


def _break(case: str, env: dict[str, str]) -> None:
    data = Path(env["KUBETRAIN_DATASET_PATH"])
    if case == "gpu-missing":
        env.update(KUBETRAIN_EXPECTED_GPUS="1", NVIDIA_VISIBLE_DEVICES="none")
    elif case == "dataset-absent":
        env["KUBETRAIN_DATASET_PATH"] = str(data.parent / "not-there")
    elif case == "dataset-other-version":
        env["KUBETRAIN_DATASET_VERSION"] = "v3"
    elif case == "dataset-unstamped":
        (data / "kubetrain-dataset.json").unlink()
    elif case == "dataset-file-changed":
        (data / "b.txt").write_text("c")
    elif case == "dataset-file-missing":
        (data / "train" / "a.bin").unlink()
    elif case == "checksums-pin-wrong":
        env["KUBETRAIN_DATASET_CHECKSUMS"] = str(data / "kubetrain-dataset.json")
        env["KUBETRAIN_DATASET_CHECKSUMS_SHA256"] = "0" * 64
    elif case == "config-unparseable":
        Path(env["KUBETRAIN_CONFIG_PATH"]).write_text("{not json")
    elif case == "config-absent":
        env["KUBETRAIN_CONFIG_PATH"] = str(data.parent / "nope.toml")
    elif case == "checkpoint-all-corrupt":
        _corrupt_checkpoint(Path(env["KUBETRAIN_CHECKPOINT_DIR"]))
    elif case == "checkpoint-other-dataset":
        _bound_checkpoint(Path(env["KUBETRAIN_CHECKPOINT_DIR"]), "v1")
    elif case == "output-full":
        env["KUBETRAIN_MIN_FREE_BYTES"] = str(1 << 60)
    elif case == "output-absent":
        env["KUBETRAIN_OUTPUT_DIR"] = str(data.parent / "no-output")
    elif case == "status-down":
        env["KUBETRAIN_STATUS_URL"] = f"http://127.0.0.1:{_closed_port()}"
        env["KUBETRAIN_STATUS_TIMEOUT_SECONDS"] = "1"
    elif case == "rank-contradicted":
        env["PET_NODE_RANK"] = "1"
    elif case == "rank-out-of-range":
        env.update(PET_NODE_RANK="2", KUBETRAIN_WORKER_INDEX="2")


FAILURES = {
    "gpu-missing": (
        "gpu-visible",
        "expected 1 GPU, found 0 (checked NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, "
        "/dev/nvidia*, nvidia-smi -L, cuDeviceGetCount, torch CUDA build)",
    ),
    "dataset-absent": ("dataset-mounted", "not-there does not exist or is not a directory"),
    "dataset-other-version": (
        "dataset-version",
        "the volume holds dataset mnist@v2, the job asks for mnist@v3",
    ),
    "dataset-unstamped": ("dataset-version", "kubetrain-dataset.json cannot be read"),
    "dataset-file-changed": (
        "dataset-version",
        "b.txt does not match its sha256 in kubetrain-dataset.json",
    ),
    "dataset-file-missing": ("dataset-version", "train/a.bin is listed in"),
    "checksums-pin-wrong": (
        "dataset-version",
        "kubetrain-dataset.json does not match KUBETRAIN_DATASET_CHECKSUMS_SHA256",
    ),
    "config-unparseable": ("config-readable", "config.json is not valid JSON"),
    "config-absent": ("config-readable", "nope.toml cannot be read: No such file or directory"),
    "checkpoint-all-corrupt": (
        "checkpoint-readable",
        "1 checkpoints in",  # ... none valid (step-000000000010: state.pt has 10 bytes ...)
    ),
    "checkpoint-other-dataset": (
        "checkpoint-readable",
        "the newest valid checkpoint (step 20) is bound to dataset version v1, the job asks for v2",
    ),
    "output-full": ("output-writable", "MiB needed"),
    "output-absent": ("output-writable", "no-output does not exist or is not a directory"),
    "status-down": ("status-reachable", "failed within 1 s"),
    "rank-contradicted": (
        "rendezvous-reachable",
        "KUBETRAIN_WORKER_INDEX is 0 but PET_NODE_RANK is 1",
    ),
    "rank-out-of-range": ("rendezvous-reachable", "PET_NODE_RANK is 2, not below the 2 workers"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failed_check_exits_86_with_one_termination_line_and_a_json_report(job, case):
    check, cause = FAILURES[case]
    _break(case, job)
    done = kubetrain("run", "--", "touch", "/never-run", env=job)
    assert done.returncode == PREFLIGHT_EXIT_CODE, done.stderr
    line = Path(job["KUBETRAIN_TERMINATION_LOG"]).read_text()
    assert line.startswith(f"preflight failed: {check}: "), line
    assert cause in line
    assert line.count("\n") == 1
    assert line.endswith("\n")
    report = json.loads(done.stdout)
    assert report["passed"] is False
    assert report["failedCheck"] == check
    assert not Path("/never-run").exists()


def test_a_dataset_directory_of_the_root_filesystem_is_not_a_mounted_volume(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    environ = {"KUBETRAIN_DATASET_PATH": str(data), "KUBETRAIN_OUTPUT_DIR": str(tmp_path)}
    # rootfs=tmp_path: the directories are on "the root filesystem" whatever this machine mounts.
    report = run_preflight(Context(environ, rootfs=tmp_path), Redactor({}))
    by_name = {r.name: r for r in report.results}
    assert by_name["dataset-mounted"].status == "failed"
    assert "is not a mounted volume" in by_name["dataset-mounted"].detail
    assert by_name["dataset-version"].detail == "skipped: the dataset is not mounted"
    assert by_name["output-writable"].status == "failed"
    assert "on the container's root filesystem" in by_name["output-writable"].detail
    # The same directories against the real root, where /dev/shm is another filesystem:
    assert os.path.ismount("/dev/shm")


def test_a_read_only_output_directory_fails_the_probe(job, monkeypatch):
    if os.geteuid() == 0:
        # root writes through mode bits; a read-only bind mount needs privileges we
        # cannot count on, so the probe's failure is driven through a file in the way.
        monkeypatch.setattr("kubetrain.runtime.preflight.secrets.token_hex", lambda n: "in-the-way")
        output = Path(job["KUBETRAIN_OUTPUT_DIR"])
        name = f"{preflight.PROBE_NAME}-{socket.gethostname()}-{os.getpid()}-in-the-way"
        (output / name).mkdir()
    else:
        Path(job["KUBETRAIN_OUTPUT_DIR"]).chmod(0o500)
    report = run_preflight(Context(job), Redactor(job))
    output_check = next(r for r in report.results if r.name == "output-writable")
    assert output_check.status == "failed"
    assert "is not writable" in output_check.detail


def test_ranks_probing_one_shared_volume_with_the_same_pid_do_not_take_each_others_probe(
    tmp_path,
):
    """The ranks of a gang share the checkpoint volume and, each in its own container,
    often have the same pid: threads of one process stand in for them (one pid). With a
    probe named by the pid alone, one rank's unlink took the other's probe (757 of 4,000
    probes failed so) and a real gang failed its preflight in CI."""
    failures: list[str] = []

    def probe() -> None:
        for _ in range(500):
            try:
                preflight._probe_write(tmp_path)
            except preflight.CheckFailed as exc:
                failures.append(str(exc))

    ranks = [threading.Thread(target=probe) for _ in range(2)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join()
    assert failures == []
    assert list(tmp_path.iterdir()) == []


class _Starting(BaseHTTPRequestHandler):
    """A server that is starting: 503 to its first two readiness probes, then 200."""

    answers: ClassVar[list[int]] = [503, 503, 200]

    def do_GET(self) -> None:
        self.send_response(self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _status_check(job: dict[str, str], url: str, timeout: str) -> tuple[str, str]:
    job.update(KUBETRAIN_STATUS_URL=url, KUBETRAIN_STATUS_TIMEOUT_SECONDS=timeout)
    report = run_preflight(Context(job), Redactor(job))
    status = next(r for r in report.results if r.name == "status-reachable")
    return status.status, status.detail


def test_a_server_still_starting_is_waited_for_not_failed(job):
    server = _serve(_Starting)
    try:
        status, detail = _status_check(job, f"http://127.0.0.1:{server.server_address[1]}", "30")
    finally:
        server.shutdown()
        server.server_close()
    assert status == "passed", detail
    assert "answered 200" in detail
    assert "after 3 tries" in detail


def test_a_wrong_status_url_fails_at_once_without_waiting_out_the_deadline(job):
    class NotHere(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = _serve(NotHere)
    try:
        status, detail = _status_check(job, f"http://127.0.0.1:{server.server_address[1]}", "600")
    finally:
        server.shutdown()
        server.server_close()
    assert status == "failed"  # had it waited for the 600 s deadline, pytest's timeout ends it
    assert detail.endswith("/readyz answered 404")


def test_a_long_cause_is_cut_to_the_kubelets_limit(job):
    job["KUBETRAIN_CONFIG_PATH"] = "/" + "x" * 5000 + ".json"
    done = kubetrain("run", "--preflight", env=job)
    assert done.returncode == PREFLIGHT_EXIT_CODE
    line = Path(job["KUBETRAIN_TERMINATION_LOG"]).read_bytes()
    assert len(line.rstrip(b"\n")) <= 4096
    assert line.startswith(b"preflight failed: config-readable: ")


def test_planted_secrets_appear_in_no_output(job, volume):
    secrets = ["tok-5f1e9a77c0", "hunter2-pass", "s3cr3t-api-key", "userpw-1234", "bear-ab12cd"]
    job.update(
        HF_TOKEN=secrets[0],
        DB_PASSWORD=secrets[1],
        WANDB_API_KEY=secrets[2],
        # Every failing check, each naming a secret in what it says:
        KUBETRAIN_STATUS_URL=f"http://trainer:{secrets[3]}@127.0.0.1:{_closed_port()}",
        KUBETRAIN_CONFIG_PATH=str(volume / f"{secrets[1]}.json"),
        KUBETRAIN_DATASET_VERSION=secrets[2],
        KUBETRAIN_OUTPUT_DIR=f"/tmp/Bearer {secrets[4]}",
        KUBETRAIN_EXPECTED_GPUS="1",
        PET_MASTER_ADDR=f"{secrets[2]}.invalid",
        PET_NODE_RANK="1",
        KUBETRAIN_WORKER_INDEX="1",
        KUBETRAIN_RENDEZVOUS_TIMEOUT_SECONDS="0.5",
    )
    done = kubetrain("run", "--", "true", env=job)
    assert done.returncode == PREFLIGHT_EXIT_CODE
    outputs = [done.stdout, done.stderr, Path(job["KUBETRAIN_TERMINATION_LOG"]).read_text()]
    report = json.loads(done.stdout)
    failed = {c["name"] for c in report["checks"] if c["status"] == "failed"}
    assert failed == set(CHECK_NAMES) - {"dataset-mounted", "checkpoint-readable"}
    for secret in secrets:
        for output in outputs:
            assert secret not in output
    assert "***" in done.stdout


def _as_rank_1(job: dict[str, str], timeout: float) -> None:
    job.update(
        PET_NODE_RANK="1",
        KUBETRAIN_WORKER_INDEX="1",
        KUBETRAIN_RENDEZVOUS_TIMEOUT_SECONDS=str(timeout),
    )


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        (
            "name-unknown",
            "rank 0 is not placed: its address rank-0.kubetrain-test.invalid did not resolve "
            "within 1 s",
        ),
        ("port-closed", "did not answer within 1 s (127.0.0.1: connection refused"),
    ],
)
def test_a_rank_that_cannot_reach_rank_0_fails_its_preflight_within_the_bound(job, case, cause):
    """Where torchrun would wait out its rendezvous timeout (600 s by default): the
    process is given 30 s here; how soon it fails is bench/preflight.py's."""
    _as_rank_1(job, timeout=1)
    if case == "name-unknown":  # .invalid never resolves (RFC 2606)
        job["PET_MASTER_ADDR"] = "rank-0.kubetrain-test.invalid"
    done = kubetrain("run", "--", "touch", "/never-run", env=job, timeout=30)
    assert done.returncode == PREFLIGHT_EXIT_CODE, done.stderr
    line = Path(job["KUBETRAIN_TERMINATION_LOG"]).read_text()
    assert line.startswith("preflight failed: rendezvous-reachable: "), line
    assert cause in line
    report = json.loads(done.stdout)
    assert report["failedCheck"] == "rendezvous-reachable"
    assert [c["status"] for c in report["checks"]][:-1] == ["passed"] * (len(CHECK_NAMES) - 1)


def test_a_worker_waits_for_rank_0_to_listen(job, monkeypatch):
    _as_rank_1(job, timeout=30)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen() -> None:  # rank 0's torchrun, a second after this rank began to look
        listener.bind(("127.0.0.1", int(job["PET_MASTER_PORT"])))
        listener.listen()

    timer = threading.Timer(1.0, listen)
    check = preflight.CHECKS["rendezvous-reachable"]

    def rendezvous_then_listen(context: Context) -> str:
        timer.start()  # counted from the check's start, whatever the checks before took
        return check(context)

    monkeypatch.setitem(preflight.CHECKS, "rendezvous-reachable", rendezvous_then_listen)
    try:
        report = run_preflight(Context(job), Redactor(job))
    finally:
        timer.join()
        listener.close()
    rendezvous = report.results[-1]
    assert rendezvous.status == "passed", rendezvous.detail
    assert rendezvous.detail.startswith("rank 1 of 2: rank 0 at localhost:")
    assert rendezvous.seconds >= 1.0  # it was refused, and kept trying until rank 0 listened


def test_rank_0_fails_when_its_port_is_taken(job):
    with socket.socket() as taken:
        taken.bind(("", int(job["PET_MASTER_PORT"])))
        taken.listen()
        report = run_preflight(Context(job), Redactor(job))
    rendezvous = report.results[-1]
    assert rendezvous.status == "failed"
    assert rendezvous.detail.startswith(
        f"port {job['PET_MASTER_PORT']} (PET_MASTER_PORT) cannot be listened on here, on rank 0"
    )


def test_the_rendezvous_waits_torchruns_own_default_unless_the_job_says(job):
    from kubetrain.runtime import preflight

    # torchrun's static rendezvous: `timeout` 600 s unless its rdzv options say otherwise.
    assert preflight.RENDEZVOUS_TIMEOUT_SECONDS == 600
    _as_rank_1(job, timeout=0.5)
    job["PET_MASTER_ADDR"] = "rank-0.kubetrain-test.invalid"
    rendezvous = run_preflight(Context(job), Redactor(job)).results[-1]
    assert rendezvous.status == "failed"
    assert "within 0.5 s" in rendezvous.detail
    assert "spec.rendezvousTimeout" in rendezvous.detail


def test_a_single_worker_skips_the_rendezvous(job):
    for name in ("KUBETRAIN_WORKERS", "PET_NNODES"):
        job[name] = "1"
    rendezvous = run_preflight(Context(job), Redactor(job)).results[-1]
    assert rendezvous.status == "skipped"


PRINT_TORCH_CUDA_BUILD = (
    "from kubetrain.runtime import preflight as p; print(p._torch_cuda_build())"
)


@pytest.mark.parametrize(("cuda", "says"), [("None", "0"), ("'12.4'", "None")])
def test_a_cpu_only_torch_counts_no_gpu_without_being_imported(tmp_path, cuda, says):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('imported')\n")
    (fake / "version.py").write_text(f"from typing import Optional\ncuda: Optional[str] = {cuda}\n")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from kubetrain.runtime import preflight as p; print(p._torch_cuda_build())",
        ],
        env=base_env(PYTHONPATH=f"{tmp_path}:{SRC}"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == says


def test_a_rank_that_failed_a_check_already_does_not_wait_for_rank_0(job):
    # It cannot train anyway: waiting up to the rendezvous timeout for an unplaced rank 0
    # would only hold back its failure, and the gang's.
    _as_rank_1(job, timeout=600)
    job["PET_MASTER_ADDR"] = "rank-0.kubetrain-test.invalid"
    job["KUBETRAIN_EXPECTED_GPUS"] = "1"
    report = run_preflight(Context(job), Redactor(job))
    assert report.failure is not None
    assert report.failure.name == "gpu-visible"
    rendezvous = report.results[-1]
    assert rendezvous.status == "failed"
    assert "did not resolve within 2 s" in rendezvous.detail  # one try, not 600 s
