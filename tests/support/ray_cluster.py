"""A real `rase serve --ray` for tests and benchmarks: its own Ray temp dir (short: Ray's socket
paths live under it), every process it started found and, at the end, gone."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

from tests.support.servers import rase_command, wait_healthy


def pids_of(tmp: str, root: int | None = None) -> set[int]:
    """The CLI process root, its descendants and any process naming the instance's temp dir."""
    parent, found = {}, set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        parent[int(p.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        if tmp.encode() in cmd:
            found.add(int(p.name))
    for pid in parent if root is not None else ():
        q = pid
        while q > 1 and q != root:
            q = parent.get(q, 0)
        if q == root:
            found.add(pid)
    return found


def listening(pids: set[int]) -> list[tuple[int, str, str]]:
    """(pid, process name, address) of every listening TCP socket of pids."""
    inodes = {}
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":  # LISTEN
                inodes[f[9]] = f[1].split(":")[0]
    out = []
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    out.append((pid, comm, inodes[link[8:-1]]))
        except OSError:
            continue
    return out


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::ffff:127.0.0.1, ::1


def rss_mb(pids: set[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total / 2**20


@contextlib.contextmanager
def rase_serve_ray(store, *args: str, start_timeout: float = 240):
    """`rase --store store serve --ray --port P *args`; yields (base, proc, tmp, log) once /health
    answers; after: SIGTERM, wait, then SIGKILL whatever of its Ray instance is left."""
    tmp = tempfile.mkdtemp(prefix="rr", dir="/tmp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(Path(tmp) / "cli.log", "w+")
    proc = subprocess.Popen([*rase_command(), "--store", str(store), "serve", "--ray", "--port", str(port), *args],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_TMPDIR": tmp})
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(base, proc, start_timeout):
            log.seek(0)
            raise RuntimeError(f"rase serve --ray did not start: {log.read()[-3000:]}")
        yield SimpleNamespace(base=base, proc=proc, tmp=tmp, log=log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=120)
        for pid in pids_of(tmp, proc.pid):  # nothing of the instance may outlive its user
            os.kill(pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
