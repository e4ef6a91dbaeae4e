"""A throwaway PostgreSQL server for the tests: Debian's binaries (build.sh installs them),
a fresh cluster in a temp dir, listening on 127.0.0.1 on a free port with its unix socket in
that dir, superuser ``postgres`` without a password. Started as root, it runs as the
``postgres`` system user (PostgreSQL refuses to run as root). The end-to-end suite's
``postgres`` fixture uses it, and so does ``build.sh test`` for the control plane's tests:

    python tests/e2e/pg_server.py DATABASE -- COMMAND...

runs COMMAND with TEST_DATABASE_URL naming the new, empty DATABASE, then stops the server
(also when COMMAND fails or the run is interrupted) and exits with COMMAND's status.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class StartFailed(Exception):
    """PostgreSQL is missing or did not start; the message says why (with its log)."""


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def stop_group(proc: subprocess.Popen) -> None:
    """Stops the process group ``proc`` leads (started with ``start_new_session``)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
    else:  # the leader is gone; children it left in the group get the signal too
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass


class Postgres:
    """A PostgreSQL server on 127.0.0.1:``port`` whose superuser ``postgres`` needs no password."""

    def __init__(self, port: int, psql: str, data: Path, start):
        self.port = port
        self.psql = psql
        self._data = data
        self._start = start  # starts the server on ``data`` and ``port``: its process (group leader)
        self.proc = start()

    def database(self, name: str) -> str:
        """Creates database ``name`` (empty) and returns its URL."""
        subprocess.run([self.psql, "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                        "-v", "ON_ERROR_STOP=1", "-c", f'CREATE DATABASE "{name}"'],
                       check=True, capture_output=True, timeout=30)
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def restart(self) -> None:
        """An immediate shutdown (SIGQUIT: as after a crash, every connection cut and nothing
        flushed on the way out; what was committed is recovered from the WAL) and a start
        on the same data and port, ready once it accepts connections."""
        postmaster = int((self._data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGQUIT)
        self.proc.wait(timeout=30)
        self.proc = self._start()


@contextmanager
def running_postgres(log_path: Path) -> Iterator[Postgres]:
    """A fresh server, its output in ``log_path``; stopped and removed on exit."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise StartFailed("PostgreSQL is not installed (build.sh test installs Debian's postgresql)")
    bindir = Path(found[-1]).parent
    # Its own directory: when started as root, PostgreSQL runs as its system user and must own it.
    base = Path(tempfile.mkdtemp(prefix="gateway-test-pg-"))
    run_as = []
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    data = base / "data"
    (port,) = free_ports(1)

    def start() -> subprocess.Popen:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(run_as + [str(bindir / "postgres"), "-D", str(data), "-p", str(port),
                                              "-c", "listen_addresses=127.0.0.1", "-k", str(base), "-c", "fsync=off"],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        deadline = time.monotonic() + 60
        while subprocess.run([str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)]).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_group(proc)
                raise StartFailed("PostgreSQL did not start; its log:\n" + log_path.read_text(errors="replace")[-4000:])
            time.sleep(0.2)
        return proc

    try:
        init = subprocess.run(run_as + [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
                                        "-E", "UTF8", "--no-sync"], capture_output=True, text=True, timeout=120)
        if init.returncode != 0:
            raise StartFailed(f"initdb failed:\n{init.stdout}\n{init.stderr}")
        server = Postgres(port, str(bindir / "psql"), data, start)
        try:
            yield server
        finally:
            stop_group(server.proc)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _stop_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through running_postgres, which stops the server


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    database, command = argv[0], argv[2:]
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    with tempfile.TemporaryDirectory(prefix="gateway-test-pg-log-") as logs:
        log_path = Path(logs) / "postgres.log"
        try:
            with running_postgres(log_path) as server:
                url = server.database(database)
                print(f"[pg_server] PostgreSQL on 127.0.0.1:{server.port}: TEST_DATABASE_URL={url}", file=sys.stderr)
                child = subprocess.Popen(command, env={**os.environ, "TEST_DATABASE_URL": url})
                try:
                    return child.wait()
                finally:  # stopped early (SIGTERM): the command goes too
                    if child.poll() is None:
                        child.terminate()
                        child.wait()
        except StartFailed as e:
            print(f"[pg_server] {e}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
