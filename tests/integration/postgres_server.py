"""A PostgreSQL server of the tests' own: a temp data dir, loopback TCP plus a unix socket.

Debian's ``postgresql`` package provides the binaries (``make test`` installs it when
``initdb`` is missing: ``.ci/ensure-postgres``). PostgreSQL refuses to run as root, so when
the tests run as root the server runs as the package's ``postgres`` system user
(``runuser -u postgres --``) in a directory handed over to it. Authentication is ``trust``,
for this loopback server only. ``fsync`` is off: the server is thrown away at the end, and
what the tests check (a commit seen by another pool, a reopened store) needs no disk flush.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = (
    "PostgreSQL's server programs (initdb, pg_ctl) were not found on PATH or under "
    "/usr/lib/postgresql/*/bin: run `make test`, which installs Debian's postgresql package"
)
SUPERUSER = "tandem"


class PostgresMissing(RuntimeError):
    pass


def find_bin_dir() -> Path:
    """The directory holding initdb, pg_ctl and postgres (PATH first, then Debian's)."""
    on_path = shutil.which("initdb")
    if on_path:
        # Debian links only some programs onto PATH; the real directory has them all.
        return Path(on_path).resolve().parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if not found:
        raise PostgresMissing(INSTALL_HINT)
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class PostgresServer:
    root: Path
    bin_dir: Path
    port: int
    run_as: list[str] = field(default_factory=list)  # ["runuser", "-u", "postgres", "--"]
    databases: int = 0

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    def url(self, database: str = SUPERUSER) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def socket_url(self, database: str = SUPERUSER) -> str:
        """The same server over its unix socket (asyncpg takes the directory as ``host``)."""
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}&port={self.port}"

    def _server_cmd(self, program: str, *args: str) -> list[str]:
        return [*self.run_as, str(self.bin_dir / program), *args]

    def _run(self, cmd: list[str], timeout: float = 60.0) -> None:
        done = subprocess.run(
            cmd, cwd=self.root, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}{done.stderr}{tail}"
            )

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL (each test gets its own tables)."""
        self.databases += 1
        name = f"t{self.databases}_{uuid.uuid4().hex[:8]}"
        cmd = [str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port)]
        self._run([*cmd, "-U", SUPERUSER, name])
        return self.url(name)

    def start_server(self) -> None:
        """``pg_ctl start`` over the data directory (again, after :meth:`halt`)."""
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.socket_dir} "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            self._server_cmd(
                "pg_ctl", "-D", str(self.data_dir), "-l", str(self.root / "server.log"),
                "-o", options, "-w", "-t", "30", "start",
            )
        )  # fmt: skip

    def halt(self) -> None:
        """Stop the server as a crash would (``-m immediate``), keeping its data: a
        database going away under its clients. :meth:`start_server` brings it back."""
        self._run(self._server_cmd("pg_ctl", "-D", str(self.data_dir), "stop", "-m", "immediate"))

    def stop(self) -> None:
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self._run(
                    self._server_cmd("pg_ctl", "-D", str(self.data_dir), "stop", "-m", "immediate")
                )
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> PostgresServer:
    """initdb + pg_ctl start; a few seconds. The caller stops it (:meth:`PostgresServer.stop`)."""
    bin_dir = find_bin_dir()
    # Not under pytest's tmp dir: that is private to root, and the server may run as postgres.
    root = Path(tempfile.mkdtemp(prefix="tandem-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            raise PostgresMissing(
                f"no `postgres` system user to run the server as; {INSTALL_HINT}"
            ) from None
        os.chown(root, owner.pw_uid, owner.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    server = PostgresServer(root=root, bin_dir=bin_dir, port=_free_port(), run_as=run_as)
    try:
        server.socket_dir.mkdir()
        if run_as:
            os.chown(server.socket_dir, owner.pw_uid, owner.pw_gid)
        server._run(
            server._server_cmd(
                "initdb", "-D", str(server.data_dir), "-U", SUPERUSER, "--auth=trust",
                "--encoding=UTF8", "--locale=C", "--no-sync",
            )
        )  # fmt: skip
        server.start_server()
        server._run(
            [
                str(bin_dir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(server.port),
                "-U",
                SUPERUSER,
                SUPERUSER,
            ]
        )
    except BaseException:
        server.stop()
        raise
    return server
