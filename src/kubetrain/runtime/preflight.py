"""The preflight: can this container train? Eight checks, in order, each timed.

Each check reads its expectation from a KUBETRAIN_* variable the manifest sets;
an unset variable skips its check, and the report says so. A check that
cannot pass raises `CheckFailed` with a cause one line long; the first failure
becomes the termination message `preflight failed: <check>: <cause>`.
Everything a check says goes through the Redactor before it leaves the process.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kubetrain.runtime import checkpoint_files, env
from kubetrain.runtime.contract import (
    CHECK_NAMES,
    DATASET_STAMP,
    TERMINATION_MESSAGE_LIMIT,
    TERMINATION_PREFIX,
)
from kubetrain.runtime.stamp import StampError, parse_stamp, sha256_file

# Hashing a whole dataset would take hours; the preflight hashes listed files,
# in path order, until this many bytes (every listed file is still stat'ed).
HASH_BUDGET_BYTES = 64 << 20
# Below this much free space a training run fails late, at its first write.
MIN_FREE_BYTES = 1 << 30
# How long the status check waits for kubetrain's server to answer: a busy server or
# one restarting (a rolling update) is no reason to fail a training run; one that
# stays unreachable this long is. Each request gets at most STATUS_ATTEMPT_SECONDS.
STATUS_TIMEOUT_SECONDS = 30.0
STATUS_ATTEMPT_SECONDS = 5.0
GPU_PROBE_TIMEOUT_SECONDS = 5.0  # nvidia-smi, the CUDA driver: a wedged GPU hangs both
PROBE_NAME = ".kubetrain-preflight-probe"
# How long a worker waits for rank 0's name to resolve and its port to answer: the
# ranks of a gang start within seconds of each other when all are placed, but an
# image pull or a slow node can put minutes between them.
# torchrun's own static rendezvous waits 600 s by default (its `timeout` rdzv option,
# torch.distributed.elastic.rendezvous.static_tcp_rendezvous): the check waits as long,
# so a gang still being placed is never failed sooner than torchrun would fail it.
RENDEZVOUS_TIMEOUT_SECONDS = 600.0
RENDEZVOUS_ATTEMPT_SECONDS = 2.0  # one connection attempt (a dropped SYN never answers)
RETRY_SECONDS = 0.5  # between attempts of the checks that wait (status, rendezvous)
LAST_ATTEMPT_SECONDS = 0.1  # the least time an attempt is given

Status = Literal["passed", "failed", "skipped"]


class CheckFailed(Exception):
    """The container cannot train; the message is the cause, one line."""


class CheckSkipped(Exception):
    """Nothing to check (its variable is unset, or an earlier check failed)."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    seconds: float


@dataclass
class Context:
    """What the checks read: the environment, and the places they look (tests move them)."""

    environ: Mapping[str, str]
    rootfs: Path = Path("/")
    dev: Path = Path("/dev")
    passed: set[str] = field(default_factory=set)
    failed: list[str] = field(default_factory=list)  # the checks that failed so far

    def get(self, name: str) -> str | None:
        value = self.environ.get(name, "").strip()
        return value or None

    def require(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise CheckSkipped(f"{name} is not set")
        return value


@dataclass(frozen=True)
class PreflightReport:
    results: tuple[CheckResult, ...]

    @property
    def failure(self) -> CheckResult | None:
        return next((r for r in self.results if r.status == "failed"), None)

    def termination_line(self) -> str | None:
        failure = self.failure
        if failure is None:
            return None
        return fit_termination_line(f"{TERMINATION_PREFIX}{failure.name}: {failure.detail}")

    def document(self) -> dict[str, Any]:
        failure = self.failure
        return {
            "passed": failure is None,
            "failedCheck": failure.name if failure else None,
            "checks": [
                {
                    "name": r.name,
                    "status": r.status,
                    "detail": r.detail,
                    "seconds": round(r.seconds, 4),
                }
                for r in self.results
            ],
        }


def fit_termination_line(text: str) -> str:
    """One line within the kubelet's limit (bytes, not characters)."""
    line = " ".join(text.split())
    encoded = line.encode()
    if len(encoded) <= TERMINATION_MESSAGE_LIMIT:
        return line
    return encoded[: TERMINATION_MESSAGE_LIMIT - 3].decode(errors="ignore") + "..."


def run_preflight(
    context: Context,
    redact: Callable[[str], str],
    on_check: Callable[[str], None] | None = None,
) -> PreflightReport:
    """Every check in order; `on_check(name)` is told before each one starts."""
    results = []
    for name in CHECK_NAMES:
        if on_check is not None:
            on_check(name)
        started = time.perf_counter()
        status: Status
        try:
            detail, status = CHECKS[name](context), "passed"
            context.passed.add(name)
        except CheckFailed as exc:
            detail, status = str(exc), "failed"
        except CheckSkipped as exc:
            detail, status = f"skipped: {exc}", "skipped"
        except Exception as exc:  # a broken check fails its check, not the run
            detail, status = f"{type(exc).__name__}: {exc}", "failed"
        if status == "failed":
            context.failed.append(name)
        detail = redact(" ".join(detail.split()))
        results.append(CheckResult(name, status, detail, time.perf_counter() - started))
    return PreflightReport(tuple(results))


# gpu-visible ---------------------------------------------------------------


def check_gpu_visible(context: Context) -> str:
    expected_text = context.require("KUBETRAIN_EXPECTED_GPUS")
    try:
        expected = int(expected_text)
    except ValueError:
        raise CheckFailed(
            f"KUBETRAIN_EXPECTED_GPUS must be a whole number, not {expected_text!r}"
        ) from None
    if expected == 0:
        return "no GPU expected"
    counts = gpu_counts(context)
    checked = ", ".join(counts)
    seen = {source: n for source, n in counts.items() if n is not None}
    # The narrowest view wins: a device node without the runtime's consent,
    # or a visible-devices list without its device node, is no usable GPU.
    found = min(seen.values(), default=0)
    if found != expected:
        plural = "" if expected == 1 else "s"
        raise CheckFailed(f"expected {expected} GPU{plural}, found {found} (checked {checked})")
    return f"{found} visible (" + ", ".join(f"{s}: {n}" for s, n in seen.items()) + ")"


def gpu_counts(context: Context) -> dict[str, int | None]:
    """GPU count per source; None where a source has nothing to say (unset, not installed)."""
    return {
        "NVIDIA_VISIBLE_DEVICES": _nvidia_visible(context.environ.get("NVIDIA_VISIBLE_DEVICES")),
        "CUDA_VISIBLE_DEVICES": _cuda_visible(context.environ.get("CUDA_VISIBLE_DEVICES")),
        "/dev/nvidia*": _device_nodes(context.dev),
        "nvidia-smi -L": _nvidia_smi(context.environ),
        "cuDeviceGetCount": _cuda_driver_count(context.environ),
        "torch CUDA build": _torch_cuda_build(),
    }


def _nvidia_visible(value: str | None) -> int | None:
    if value is None or value.strip() == "all":  # "all" names no count
        return None
    items = [v for v in value.split(",") if v.strip() and v.strip() not in ("none", "void")]
    return len(items)


def _cuda_visible(value: str | None) -> int | None:
    if value is None:
        return None
    count = 0
    for item in value.split(","):
        # CUDA stops at the first invalid or negative entry.
        if not item.strip() or item.strip().startswith("-"):
            break
        count += 1
    return count


def _device_nodes(dev: Path) -> int:
    try:
        return sum(1 for entry in os.listdir(dev) if re.fullmatch(r"nvidia\d+", entry))
    except OSError:
        return 0


def _nvidia_smi(environ: Mapping[str, str]) -> int | None:
    binary = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if binary is None:
        return None
    out = _probe([binary, "-L"], environ)
    return sum(1 for line in (out or "").splitlines() if line.startswith("GPU "))


def _probe(argv: list[str], environ: Mapping[str, str]) -> str | None:
    """The stdout of a GPU probe; None when it could not run or hung."""
    try:
        done = subprocess.run(
            argv,
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=GPU_PROBE_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout


# What any CUDA program here (torch's device_count() among them) would count: the
# driver API itself, with CUDA_VISIBLE_DEVICES applied. In a process of its own, so
# that a driver that hangs or crashes costs a timeout, not the preflight.
_CUDA_COUNT_SCRIPT = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")  # missing: an error, and no count printed
count = ctypes.c_int(0)
if cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0:
    print(count.value)
"""


def _cuda_driver_count(environ: Mapping[str, str]) -> int:
    """0 also when libcuda.so.1 is not there: no CUDA program here could use a GPU.

    Measured on an H200 image: 0.3 s, where `import torch` alone took 4.3-5.2 s
    (this check used to ask torch.cuda.device_count(), over the 2 s budget)."""
    out = (_probe([sys.executable, "-S", "-c", _CUDA_COUNT_SCRIPT], environ) or "").strip()
    return int(out) if out.isdigit() else 0


def _torch_cuda_build() -> int | None:
    """0 for a CPU-only torch (it would train on the CPU whatever GPUs the Pod has); None
    without torch or for a CUDA build (the driver's count speaks for it). Read from
    torch/version.py, not by importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version.read_text()
    except OSError:
        return None
    built_for = re.search(r"^cuda\b[^=]*=\s*(.+)$", text, re.MULTILINE)
    return 0 if built_for is not None and built_for.group(1).strip() == "None" else None


# dataset-mounted, dataset-version --------------------------------------------


def check_dataset_mounted(context: Context) -> str:
    path = Path(context.require("KUBETRAIN_DATASET_PATH"))
    if not path.is_dir():
        raise CheckFailed(f"{path} does not exist or is not a directory")
    if not (os.path.ismount(path) or on_separate_filesystem(path, context.rootfs)):
        raise CheckFailed(
            f"{path} is not a mounted volume: it is a directory of the container's root "
            "filesystem (is the dataset's PersistentVolumeClaim mounted there?)"
        )
    try:
        entries = len(os.listdir(path))
    except OSError as exc:
        raise CheckFailed(f"{path} is not readable: {exc.strerror}") from None
    return f"{path} mounted, {entries} entries"


def check_dataset_version(context: Context) -> str:
    root = Path(context.require("KUBETRAIN_DATASET_PATH"))
    if "dataset-mounted" not in context.passed:
        raise CheckSkipped("the dataset is not mounted")
    name = context.require("KUBETRAIN_DATASET_NAME")
    version = context.require("KUBETRAIN_DATASET_VERSION")
    manifest = Path(context.get("KUBETRAIN_DATASET_CHECKSUMS") or root / DATASET_STAMP)
    try:
        raw = manifest.read_bytes()
    except OSError as exc:
        raise CheckFailed(
            f"{manifest} cannot be read ({exc.strerror}): the volume does not hold a "
            f"stamped dataset (`kubetrain dataset stamp` writes {DATASET_STAMP})"
        ) from None
    pin = context.get("KUBETRAIN_DATASET_CHECKSUMS_SHA256")
    if pin is not None and hashlib.sha256(raw).hexdigest() != pin.lower():
        raise CheckFailed(f"{manifest} does not match KUBETRAIN_DATASET_CHECKSUMS_SHA256")
    try:
        stamp = parse_stamp(raw, str(manifest))
    except StampError as exc:
        raise CheckFailed(str(exc)) from None
    if (stamp.name, stamp.version) != (name, version):
        raise CheckFailed(
            f"the volume holds dataset {stamp.name}@{stamp.version}, the job asks for "
            f"{name}@{version}"
        )
    hashed, budget = 0, HASH_BUDGET_BYTES
    for relative in sorted(stamp.files):
        path = root / relative
        try:
            size = path.stat().st_size
        except OSError:
            raise CheckFailed(f"{relative} is listed in {manifest.name} but missing") from None
        if size <= budget:
            if sha256_file(path) != stamp.files[relative].lower():
                raise CheckFailed(f"{relative} does not match its sha256 in {manifest.name}")
            budget -= size
            hashed += 1
    return (
        f"{name}@{version}; {len(stamp.files)} files listed, all present, {hashed} hashed "
        f"(budget {HASH_BUDGET_BYTES >> 20} MiB)"
    )


# config-readable -------------------------------------------------------------


def check_config_readable(context: Context) -> str:
    path = Path(context.require("KUBETRAIN_CONFIG_PATH"))
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckFailed(f"{path} cannot be read: {exc.strerror}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            json.loads(raw)
        elif suffix == ".toml":
            tomllib.loads(raw.decode())
        elif suffix in (".yaml", ".yml"):
            if importlib.util.find_spec("yaml") is None:
                return f"{path} read ({len(raw)} bytes); not parsed: PyYAML is not installed"
            import yaml

            yaml.safe_load(raw)
        else:
            return f"{path} read ({len(raw)} bytes); format unknown, not parsed"
    except Exception as exc:  # every parser has its own error types
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckFailed(f"{path} is not valid {suffix[1:].upper()}: {first}") from None
    return f"{path} parsed as {suffix[1:].upper()}"


# checkpoint-readable, output-writable ------------------------------------------


def check_checkpoint_readable(context: Context) -> str:
    path = Path(context.require("KUBETRAIN_CHECKPOINT_DIR"))
    _volume_directory(path, context.rootfs)
    try:
        found = checkpoint_files.scan(path)
    except OSError as exc:
        raise CheckFailed(f"{path} is not readable: {exc.strerror}") from None
    if not found:
        _probe_write(path)
        return f"{path} writable, no checkpoint yet"
    valid = [c for c in found if c.problem is None]
    if not valid:
        problems = "; ".join(f"{c.path.name}: {c.problem}" for c in found[:3])
        raise CheckFailed(f"{len(found)} checkpoints in {path}, none valid ({problems})")
    newest = valid[0]
    want = context.get("KUBETRAIN_DATASET_VERSION")
    have = newest.binding.get("dataset_version")
    if want is not None and have is not None and have != want:
        raise CheckFailed(
            f"the newest valid checkpoint (step {newest.step}) is bound to dataset version "
            f"{have}, the job asks for {want}"
        )
    _probe_write(path)
    return f"{path} writable; newest valid checkpoint: step {newest.step} (sizes verified)"


def check_output_writable(context: Context) -> str:
    path = Path(context.require("KUBETRAIN_OUTPUT_DIR"))
    _volume_directory(path, context.rootfs)
    _probe_write(path)
    usage = shutil.disk_usage(path)
    floor = int(context.get("KUBETRAIN_MIN_FREE_BYTES") or MIN_FREE_BYTES)
    if usage.free < floor:
        raise CheckFailed(
            f"{path} has {usage.free >> 20} MiB free, below the {floor >> 20} MiB needed"
        )
    return f"{path} writable, {usage.free >> 20} MiB free"


def _volume_directory(path: Path, rootfs: Path) -> None:
    if not path.is_dir():
        raise CheckFailed(f"{path} does not exist or is not a directory")
    if not on_separate_filesystem(path, rootfs):
        raise CheckFailed(
            f"{path} is on the container's root filesystem, where it would vanish with the "
            "Pod: mount a volume there"
        )


def on_separate_filesystem(path: Path, rootfs: Path) -> bool:
    """True when `path` lives on another filesystem than `rootfs` (a mounted volume)."""
    return os.stat(path).st_dev != os.stat(rootfs).st_dev


def _probe_write(directory: Path) -> None:
    # A name of its own: the ranks of a gang share the checkpoint volume and, each in its
    # own container, often have the same pid; one rank's unlink took the other's probe.
    probe = directory / f"{PROBE_NAME}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"kubetrain preflight\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        raise CheckFailed(f"{directory} is not writable: {exc.strerror}") from None


# status-reachable ----------------------------------------------------------------


def check_status_reachable(context: Context) -> str:
    """kubetrain's server answers `GET /readyz`, within a bounded wait: a timeout, a
    refused connection or a 5xx (a server starting) is tried again until the deadline;
    any other answer fails at once, since asking again cannot change it."""
    base = context.require("KUBETRAIN_STATUS_URL").rstrip("/")
    url = f"{base}/readyz"
    if not url.startswith(("http://", "https://")):
        raise CheckFailed(f"KUBETRAIN_STATUS_URL must be an http(s) URL, not {base!r}")
    timeout = _seconds(context, "KUBETRAIN_STATUS_TIMEOUT_SECONDS", STATUS_TIMEOUT_SECONDS)
    started = time.monotonic()
    deadline = started + timeout
    tries = 0
    while True:
        tries += 1
        attempt = max(0.05, min(STATUS_ATTEMPT_SECONDS, deadline - time.monotonic()))
        try:
            with urllib.request.urlopen(url, timeout=attempt) as reply:  # noqa: S310
                status = reply.status
            break
        except urllib.error.HTTPError as exc:
            if exc.code < 500 and exc.code not in (408, 429):
                raise CheckFailed(f"GET {url} answered {exc.code}") from None
            failure = f"answered {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            failure = str(getattr(exc, "reason", exc))
        if not _wait_to_retry(deadline):
            raise CheckFailed(
                f"GET {url} failed within {timeout:g} s ({tries} tries; last: {failure})"
            )
    took = time.monotonic() - started
    token = context.get("KUBETRAIN_STATUS_TOKEN_FILE")
    if not token:
        note = "; KUBETRAIN_STATUS_TOKEN_FILE is not set"
    elif not os.access(token, os.R_OK):
        note = "; KUBETRAIN_STATUS_TOKEN_FILE is not readable"
    else:
        note = ""
    tried = f" after {tries} tries" if tries > 1 else ""
    return f"GET {url} answered {status} in {took * 1000:.0f} ms{tried}{note}"


# rendezvous-reachable ------------------------------------------------------------


def check_rendezvous_reachable(context: Context) -> str:
    """In a gang: rank 0's name resolves and, from the other ranks, its port answers.

    Waits (bounded) instead of failing at the first refusal: cluster DNS publishes
    a Pod's name only once it has an address, and rank 0 listens only once its own
    preflight has passed and torchrun runs. Rank 0 itself cannot connect to its
    port (nothing listens there before this check ends and torchrun starts), so it
    checks that the port is free to listen on here instead."""
    try:
        gang = env.gang(context.environ)
    except ValueError as exc:
        raise CheckFailed(str(exc)) from None
    if gang is None:
        raise CheckSkipped("a single worker (KUBETRAIN_WORKERS and PET_NNODES unset or 1)")
    host = gang.master_addr
    if host is None:
        raise CheckFailed("PET_MASTER_ADDR is not set: the other ranks cannot find rank 0")
    timeout = _seconds(context, "KUBETRAIN_RENDEZVOUS_TIMEOUT_SECONDS", RENDEZVOUS_TIMEOUT_SECONDS)
    if context.failed:
        # This Pod cannot train anyway: one try, not a wait of up to the timeout that
        # would only hold back the failure (and the gang's end) that much longer.
        timeout = min(timeout, RENDEZVOUS_ATTEMPT_SECONDS)
    deadline = time.monotonic() + timeout
    where = f"rank {gang.rank} of {gang.workers}"
    if gang.rank == 0:
        addresses = _resolve_until(host, gang.master_port, deadline, timeout)
        _port_free(gang.master_port)
        return (
            f"{where}: {host} resolves to {_shown(addresses)}; port {gang.master_port} is free "
            "to listen on (the other ranks connect once torchrun listens)"
        )
    started = time.monotonic()
    address, unplaced = _connect_until(host, gang.master_port, deadline, timeout)
    waited = (
        f" (rank 0 was not placed yet, its name without an address, for {unplaced:.1f} s)"
        if unplaced
        else ""
    )
    return (
        f"{where}: rank 0 at {host}:{gang.master_port} ({address}) answered after "
        f"{time.monotonic() - started:.2f} s{waited}"
    )


def _seconds(context: Context, name: str, default: float) -> float:
    text = context.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise CheckFailed(f"{name} must be a positive number of seconds, not {text!r}")
    return value


Address = tuple[int, Any]  # (family, sockaddr) as getaddrinfo gives them


def _lookup(host: str, port: int, wait: float) -> list[Address]:
    """getaddrinfo within `wait` seconds. It has no timeout of its own (resolv.conf's
    timeouts, times attempts, times search domains): it runs on a daemon thread that
    is left behind if it hangs."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, name="kubetrain-resolve", daemon=True)
    thread.start()
    thread.join(max(wait, 0.0))
    if not outcome:
        raise OSError(f"the lookup did not answer within {wait:.1f} s")
    if isinstance(outcome[0], OSError):
        raise outcome[0]
    return [(family, sockaddr) for family, _, _, _, sockaddr in outcome[0]]


def _resolve_until(host: str, port: int, deadline: float, timeout: float) -> list[Address]:
    while True:
        try:
            return _lookup(host, port, deadline - time.monotonic())
        except OSError as exc:
            cause = _cause(exc)
        if not _wait_to_retry(deadline):
            raise CheckFailed(
                f"rank 0's address {host} did not resolve within {timeout:g} s: {cause} "
                "(is rank 0's Pod running, with the headless Service its name belongs to?)"
            )


def _connect_until(host: str, port: int, deadline: float, timeout: float) -> tuple[str, float]:
    """Resolves again before each round: a restarted rank 0 comes back with another address.
    Returns the address that answered and how long rank 0's name had none (rank 0 not
    placed: cluster DNS names a Pod once it has an address)."""
    started = time.monotonic()
    unplaced = 0.0
    while True:
        try:
            addresses = _lookup(host, port, deadline - time.monotonic())
        except OSError as exc:
            unplaced = time.monotonic() - started
            failure = (
                f"rank 0 is not placed: its address {host} did not resolve within {timeout:g} s: "
                f"{_cause(exc)} (its Pod has no node or no address yet, or the headless Service "
                "its name belongs to is missing; a gang still waiting for nodes may be given "
                "longer with spec.rendezvousTimeout)"
            )
        else:
            failure, refused = "", []
            for family, sockaddr in addresses:
                try:
                    with socket.socket(family, socket.SOCK_STREAM) as sock:
                        sock.settimeout(
                            max(0.05, min(RENDEZVOUS_ATTEMPT_SECONDS, deadline - time.monotonic()))
                        )
                        sock.connect(sockaddr)
                    return str(sockaddr[0]), unplaced
                except OSError as exc:
                    refused.append(f"{sockaddr[0]}: {_cause(exc)}")
            failure = (
                f"rank 0 at {host}:{port} did not answer within {timeout:g} s "
                f"({'; '.join(refused)})"
            )
        if not _wait_to_retry(deadline):
            raise CheckFailed(failure)


def _wait_to_retry(deadline: float) -> bool:
    """Sleeps before the next attempt; False when too little time is left for one."""
    left = deadline - time.monotonic() - LAST_ATTEMPT_SECONDS
    if left <= 0:
        return False
    time.sleep(min(RETRY_SECONDS, left))
    return True


def _port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            raise CheckFailed(
                f"port {port} (PET_MASTER_PORT) cannot be listened on here, on rank 0: "
                f"{_cause(exc)}"
            ) from None


def _cause(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer (timed out: a firewall or NetworkPolicy dropping it?)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens there yet)"
    return exc.strerror or str(exc)


def _shown(addresses: list[Address]) -> str:
    return ", ".join(dict.fromkeys(str(sockaddr[0]) for _, sockaddr in addresses))


CHECKS: dict[str, Callable[[Context], str]] = {
    "gpu-visible": check_gpu_visible,
    "dataset-mounted": check_dataset_mounted,
    "dataset-version": check_dataset_version,
    "config-readable": check_config_readable,
    "checkpoint-readable": check_checkpoint_readable,
    "output-writable": check_output_writable,
    "status-reachable": check_status_reachable,
    "rendezvous-reachable": check_rendezvous_reachable,
}
