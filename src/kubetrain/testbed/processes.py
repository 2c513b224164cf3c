"""Start, probe and stop the testbed's processes, identified by recorded pids."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from kubetrain.errors import KubetrainError


class PortInUseError(KubetrainError, RuntimeError):
    pass


# Each control plane's components and each kubelet hold a few inotify instances
# (certificate reloads, cAdvisor); several testbeds at once (the parallel test
# workers, the real pool) exhaust the kernel's default of 128 per user, and the
# component that finds none exits with "too many open files". kind's documented
# remedy: 512 instances, 524288 watches.
INOTIFY_LIMITS = {
    Path("/proc/sys/fs/inotify/max_user_instances"): 512,
    Path("/proc/sys/fs/inotify/max_user_watches"): 524_288,
}


def raise_inotify_limits() -> None:
    """Raise the per-user inotify limits to INOTIFY_LIMITS where lower (as root; a
    user who is not keeps the machine's limits)."""
    if os.geteuid() != 0:
        return
    for path, wanted in INOTIFY_LIMITS.items():
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) < wanted:
                path.write_text(f"{wanted}\n")


# Listening ports are picked below the kernel's ephemeral range: a port in that
# range can be handed to any outgoing connection (another worker's client, the
# kubelets' watches) between the pick and the component's bind, which CI saw
# ("kube-apiserver could not bind port 33939"); one below it only to a listener.
LISTEN_PORTS_FROM = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _listen_range() -> range:
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768  # Linux's default
    return range(LISTEN_PORTS_FROM, low)


def pick_free_ports(count: int) -> list[int]:
    """Distinct ports free on every address, below the ephemeral range where it leaves
    room (else any the kernel reports free); held open together so none repeats.
    Drawn with the system's randomness: the parallel test workers may share a seed."""
    sockets: list[socket.socket] = []
    candidates = _listen_range()
    drawn = (
        random.SystemRandom().sample(candidates, min(len(candidates), 50 * count))
        if len(candidates) >= 100 * count
        else []
    )
    try:
        for port in [*drawn, *[0] * count]:
            if len(sockets) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                # No SO_REUSEADDR: a port still in TIME_WAIT is passed over too.
                sock.bind(("", port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def check_bindable(port: int, what: str, host: str = "127.0.0.1") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUseError(
                f"port {port} on {host} for {what} cannot be bound: {exc.strerror}"
            ) from None


def start(name: str, argv: Sequence[str], log_path: Path, cwd: Path) -> int:
    """Start a process in its own session (it outlives the CLI); return its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def is_ours(pid: int, binary: Path) -> bool:
    """True when pid is alive and runs `binary` (guards against recycled pids)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A zombie has exited already: only its parent's wait is missing.
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and cmdline == str(binary).encode()


# What a real node's processes run before they exec their binary (realnode.py).
_LAUNCHERS = (b"unshare", b"nsenter", b"/bin/sh")


def is_launching(pid: int) -> bool:
    """True while pid still runs the launcher that will exec a real node's binary."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return cmdline in _LAUNCHERS


def reap(pid: int) -> None:
    """Collect a child we started in this process (tests restart components)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop(pid: int, binary: Path, timeout: float = 15.0) -> bool:
    """SIGTERM, then SIGKILL after `timeout` (at once when 0, as a crash);
    False when it was not running."""
    if not is_ours(pid, binary):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM if timeout > 0 else signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap(pid)
        if not is_ours(pid, binary):
            _wait_exited(pid)
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while is_ours(pid, binary):
        reap(pid)
        time.sleep(0.05)
    _wait_exited(pid)
    return True


def _wait_exited(pid: int, timeout: float = 30.0) -> None:
    """Until the process is gone or a zombie. An exiting process drops its memory
    (so its cmdline reads empty and `is_ours` says no) before it closes its files:
    a restart in that window found the old API server's port still bound."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap(pid)
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.05)


def http_ok(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def insecure_context() -> ssl.SSLContext:
    """For the health ports of the controller manager and scheduler, whose serving
    certificates they sign themselves at start."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def machine_lock(path: Path) -> Iterator[None]:
    """Hold this machine's lock named by the file `path` (released if the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield
