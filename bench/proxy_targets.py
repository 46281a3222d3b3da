"""The targets ``bench/proxy.py`` measures, as child processes: the sidecars
(``sidecars``: one ``gatekeeper serve`` per ``http_server``, all in front of one
worker), vllm-router (``--policy round_robin``, the worker as its one static backend)
and nginx (a minimal config: upstream keepalive, HTTP/1.1 to the worker, no buffering,
so a stream's chunks pass as they come); the CPU time of a set of processes; and the
small HTTP/1.1 client that loads them (``Connection``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.serve_process import TOKEN, adopting_state, free_port, sidecar, stop

TICK_SECONDS = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Worker:
    """The simulator worker the sidecar launched."""

    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True, slots=True)
class Running:
    """A proxy in front of the worker: its port and its (main) process."""

    port: int
    pid: int


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of these processes, all their threads, ended ones included: the
    process's CPU-time clock (what ``/proc/PID/stat`` shows as utime + stime, read in
    nanoseconds instead of 10 ms clock ticks, too coarse for the few hundred
    milliseconds a round costs); the clock ticks where that clock cannot be read. A
    process that is gone counts 0."""
    total = 0.0
    for pid in pids:
        try:
            total += time.clock_gettime(_process_clock(pid))
        except OSError:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                fields = _stat(pid)
                total += (int(fields[11]) + int(fields[12])) * TICK_SECONDS
    return total


def _process_clock(pid: int) -> int:
    """Linux's id of a process's CPU-time clock (``clock_getcpuclockid``): the pid
    inverted, shifted by 3, with CPUCLOCK_SCHED (2), the scheduler's exact run time."""
    return (~pid << 3) | 2


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (nginx: the master and its workers)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, IndexError):
                parents[int(entry)] = int(_stat(int(entry))[1])
    tree, grew = {pid}, True
    while grew:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sorted(tree)


@contextlib.contextmanager
def child(
    argv: list[str], port: int, health: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[Running]:
    """Run ``argv`` until the block ends, once ``health`` on ``port`` answers 200."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"{argv[0]} did not start (exit {proc.poll()}):\n{log.read_text()[-2000:]}"
                )
            time.sleep(0.1)
        yield Running(port, proc.pid)
    finally:
        stop(proc, 10)


@contextlib.contextmanager
def vllm_router(path: str, worker: Worker, work: Path) -> Iterator[Running]:
    port = free_port()
    argv = [path, "--worker-urls", worker.url, "--policy", "round_robin"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    with child(argv, port, "/health", work / "vllm-router.log") as running:
        yield running


NGINX_CONF = """\
worker_processes auto;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream worker {{
    server 127.0.0.1:{worker_port};
    keepalive 128;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://worker;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""


@contextlib.contextmanager
def nginx(path: str, worker: Worker, work: Path) -> Iterator[Running]:
    port = free_port()
    conf = work / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=work, worker_port=worker.port, port=port))
    argv = [path, "-c", str(conf), "-p", str(work), "-e", str(work / "nginx-error.log")]
    argv += ["-g", "daemon off;"]
    with child(argv, port, "/health", work / "nginx.log") as running:
        yield running


# --- a small HTTP/1.1 client -----------------------------------------------------------------


class Connection:
    """One keep-alive connection; POSTs and reads the answer, chunked or not."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    def close(self) -> None:
        self.writer.close()

    async def post(self, path: str, body: bytes) -> tuple[int, float, float]:
        """(status, seconds to the first body bytes, seconds to the end)."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        start = time.perf_counter()
        self.writer.write(head.encode() + body)
        headers = (await self.reader.readuntil(b"\r\n\r\n")).lower()
        status = int(headers[9:12])
        if b"transfer-encoding: chunked" not in headers:
            length = int(headers.split(b"content-length:")[1].split(b"\r\n")[0])
            await self.reader.readexactly(length)
            end = time.perf_counter() - start
            return status, end, end
        first = 0.0
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await self.reader.readexactly(size + 2)
            first = first or time.perf_counter() - start
        await self.reader.readuntil(b"\r\n")
        return status, first, time.perf_counter() - start


def idle_seconds() -> float:
    """The machine's idle CPU time so far, all CPUs together (``/proc/stat``)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


# --- the sidecars ----------------------------------------------------------------------------

SERVERS = ("gatekeeper", "uvicorn", "granian")
"""``http_server``'s values (``gatekeeper.settings.Settings``)."""


def wait_worker(port: int, timeout: float = 120) -> Worker:
    """The preloaded deployment's worker, once the admin API lists it ready."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=10) as c:
        while time.monotonic() < deadline:
            for d in c.get("/admin/deployments").raise_for_status().json()["deployments"]:
                if d["state"] == "ready":
                    return Worker(port=int(d["port"]), pid=int(d["pid"]))
            time.sleep(0.2)
    raise SystemExit(f"the sidecar on port {port} had no ready worker after {timeout:.0f} s")


def sidecar_name(server: str) -> str:
    """A sidecar's row: ``gatekeeper`` for the default server, ``gk+SERVER`` for another."""
    return "gatekeeper" if server == "gatekeeper" else f"gk+{server}"


def sidecars(
    stack: ExitStack, work: Path, env: str, servers: list[str]
) -> tuple[Worker, list[tuple[str, Running]]]:
    """One ``gatekeeper serve --rehearsal`` per ``http_server`` in ``servers``, all in
    front of one worker, each running until ``stack`` closes, with its row's name: the
    first launches the worker (its one preloaded model, whose environment is ``env``);
    each other adopts it from a copy of the first's state (``adopting_state``), as a
    restarted sidecar would, and leaves it running when it stops."""
    port = free_port()
    first = stack.enter_context(
        sidecar(work, port, preload=True, worker_env=env, rehearsal=True, http_server=servers[0])
    )
    worker = wait_worker(port)
    found = [(sidecar_name(servers[0]), Running(port, first.pid))]
    for server in servers[1:]:
        own, own_port = work / server, free_port()
        adopting_state(work / "state", own / "state")
        proc = stack.enter_context(
            sidecar(
                own,
                own_port,
                preload=False,
                worker_env=env,
                rehearsal=True,
                http_server=server,
                keep_workers=True,
            )
        )
        if wait_worker(own_port) != worker:
            raise SystemExit(f"the {server} sidecar on port {own_port} adopted another worker")
        found.append((sidecar_name(server), Running(own_port, proc.pid)))
    return worker, found
