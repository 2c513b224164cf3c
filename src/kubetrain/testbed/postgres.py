"""Debian's PostgreSQL server for `testbed up --in-cluster`, started as the tests start
theirs (tests/pg.py shares the helpers here): `initdb` into a directory of its own,
`pg_ctl start`, run as the `postgres` system user when we are root (initdb and
postgres refuse root).

Unlike the tests' server it is reached from Pods: it listens on the Pod network's
gateway, and only there; `pg_hba.conf` lets the Pod network in with a password
(SCRAM), and only to the one database and user kubetrain uses. The data directory
lives outside the testbed's state directory, which may be private to root.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

DATABASE = "kubetrain"
USER = "kubetrain"
# Durability is worthless for a throwaway server, and fsync dominates its cost.
SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def find_pg_bindir() -> Path:
    """The directory holding initdb and pg_ctl, newest major version first."""
    candidates: list[str] = []
    if pg_config := shutil.which("pg_config"):
        result = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if result.returncode == 0:
            candidates.append(result.stdout.strip())
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda path: int(Path(path).parent.name) if Path(path).parent.name.isdigit() else 0,
        reverse=True,
    )
    if initdb := shutil.which("initdb"):
        candidates.append(str(Path(initdb).parent))
    for candidate in candidates:
        if (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    raise FileNotFoundError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: `apt-get install -y postgresql`"
    )


def server_user() -> str | None:
    """The user to run the server as, or None to run it as ourselves (when not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root, and neither a `postgres` nor a `nobody` user exists")


def run_as(user: str | None, cwd: Path, *argv: str) -> None:
    command = ["runuser", "-u", user, "--", *argv] if user is not None else list(argv)
    # cwd: the server user may not be allowed into ours.
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise subprocess.CalledProcessError(
            result.returncode, command, result.stdout, result.stderr
        )


def hba(pod_network: str) -> str:
    """Local socket for the server's own user; the Pod network (the gateway is in it)
    with a password, to kubetrain's database only."""
    return f"local all all trust\nhost {DATABASE} {USER} {pod_network} scram-sha-256\n"


@dataclass
class Postgres:
    directory: str  # data, socket, password file and log
    address: str
    port: int
    bindir: str
    user: str | None

    @property
    def data(self) -> Path:
        return Path(self.directory) / "data"

    @property
    def log(self) -> Path:
        return Path(self.directory) / "server.log"

    def url(self, password: str) -> str:
        return f"postgresql+psycopg://{USER}:{password}@{self.address}:{self.port}/{DATABASE}"

    @classmethod
    def start(cls, address: str, port: int, pod_network: str, password: str) -> Postgres:
        bindir = find_pg_bindir()
        user = server_user()
        base = Path(tempfile.mkdtemp(prefix="kubetrain-testbed-pg-"))
        server = cls(str(base), address, port, str(bindir), user)
        try:
            if user is not None:
                entry = pwd.getpwnam(user)
                os.chown(base, entry.pw_uid, entry.pw_gid)
            pwfile = base / "password"
            pwfile.write_text(password + "\n")
            pwfile.chmod(0o600)
            if user is not None:
                os.chown(pwfile, entry.pw_uid, entry.pw_gid)
            run_as(
                user,
                base,
                str(bindir / "initdb"),
                f"--pgdata={server.data}",
                f"--username={USER}",
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
                "--encoding=UTF8",
                "--locale=C",
            )
            pwfile.unlink()
            (server.data / "pg_hba.conf").write_text(hba(pod_network))
            options = " ".join(
                [f"-c listen_addresses={address} -p {port} -k {base}"]
                + [f"-c {key}={value}" for key, value in SETTINGS.items()]
            )
            pg_ctl = str(bindir / "pg_ctl")
            start = [f"--pgdata={server.data}", f"--log={server.log}", f"--options={options}"]
            run_as(user, base, pg_ctl, "start", "--wait", *start)
            run_as(user, base, str(bindir / "createdb"), "-h", str(base), "-p", str(port),
                   "-U", USER, DATABASE)  # fmt: skip
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        base = Path(self.directory)
        if not base.exists():
            return
        try:
            if (self.data / "postmaster.pid").exists():
                pg_ctl = str(Path(self.bindir) / "pg_ctl")
                run_as(self.user, base, pg_ctl, "stop", f"--pgdata={self.data}", "-m", "fast")
        finally:
            shutil.rmtree(base, ignore_errors=True)
