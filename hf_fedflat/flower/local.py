"""``hf-fedflat flower-local``: a Flower federation on this machine, for trying an App and for tests.

A SuperLink and N SuperNodes on 127.0.0.1, each on a free port, insecure (no TLS: loopback only), with a Flower
home folder of their own (nothing is written to ``~/.flwr``); ``flwr run`` submits the App and streams its log.
Every process is started in its own process group and stopped with its children (the ``flwr-serverapp`` and
``flwr-clientapp`` processes the SuperLink and SuperNodes start) when the run ends, fails, times out or is
interrupted (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .app_folder import toml_value

__all__ = ["LocalFederation", "free_port"]

CONNECTION = "hf-fedflat-local"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-15:] if log.exists() else []
            raise RuntimeError(f"{what} exited with status {process.returncode} before it listened on port {port}; "
                               f"the end of {log}:\n" + "\n".join(tail))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:g}s")


def _bin(name: str) -> str:
    """The Flower command ``name`` beside this Python (the virtual environment's), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


class LocalFederation:
    """A SuperLink and SuperNodes on 127.0.0.1 (a context manager: every process is stopped on exit).

    Args:
        num_supernodes: SuperNodes to start, with ``partition-id`` 0..N-1 and ``num-partitions`` N.
        folder: where the Flower home, the logs and (with ``state_dirs``) the nodes' state folders go; default a
            temporary folder removed at the end.
        state_dirs: give every node a ``state-dir`` (``<folder>/node-<i>``): its client state survives a restart.
        node_config: further ``--node-config`` settings of every node (``{"data-path": ...}``), or a function of
            the partition id returning them.
        output: where the processes' logs go, line by line (default: this process's stdout); the SuperLink's and
            SuperNodes' own logs are files in ``folder``.
    """

    def __init__(self, num_supernodes: int, *, folder: str | os.PathLike | None = None, state_dirs: bool = False,
                 node_config: dict[str, Any] | Callable[[int], dict[str, Any]] | None = None,
                 output: Callable[[str], None] | None = None):
        self.num_supernodes = num_supernodes
        self._temporary = folder is None
        self.folder = Path(folder or tempfile.mkdtemp(prefix="hf_fedflat_flower_"))
        self.state_dirs = state_dirs
        self.node_config = node_config
        self.output = output or (lambda line: print(line, end="", flush=True))
        self.superlink: subprocess.Popen | None = None
        self.nodes: dict[int, subprocess.Popen] = {}
        self.port: int | None = None
        self._stopped: list[int] = []  # processes stopped, whose descendants must be gone too
        self.home = self.folder / "flwr_home"
        # TMPDIR: what the nodes write without a state-dir (working files, the warm workers' sockets and logs) goes to
        # a folder of this federation's, removed when it stops; short, as a Unix socket's path in it must be (under
        # 100 bytes; a worker's is at most 41 bytes within)
        base = tempfile.gettempdir()
        self.tmp = Path(tempfile.mkdtemp(prefix="hf_fedflat_", dir=base if len(base) <= 24 else "/tmp"))
        # PATH: Flower's processes start others by name (flower-superexec, flwr-serverapp): this Python's first
        self.env = {**os.environ, "FLWR_HOME": str(self.home), "FLWR_DISABLE_UPDATE_CHECK": "1",
                    "PYTHONUNBUFFERED": "1", "TMPDIR": str(self.tmp),
                    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}

    # -- processes --------------------------------------------------------------------------------------
    def _popen(self, command: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.folder / log_name, "ab")
        try:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.folder,
                                    start_new_session=True)
        finally:
            log.close()

    def start(self, timeout: float = 60.0) -> "LocalFederation":
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.superlink = self._popen([_bin("flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port",
                                      str(self.port)], "superlink.log")
        _wait_for_port(self.port, self.superlink, timeout, "flower-superlink", self.folder / "superlink.log")
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        for partition_id in range(self.num_supernodes):
            self.start_node(partition_id)
        return self

    def node_settings(self, partition_id: int) -> dict[str, Any]:
        settings: dict[str, Any] = {"partition-id": partition_id, "num-partitions": self.num_supernodes}
        if self.state_dirs:
            settings["state-dir"] = str(self.folder / f"node-{partition_id}")
        extra = self.node_config(partition_id) if callable(self.node_config) else (self.node_config or {})
        settings.update(extra)
        return settings

    def start_node(self, partition_id: int) -> subprocess.Popen:
        """Start (or restart) the SuperNode of ``partition_id``."""
        settings = " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}"
                            for k, v in self.node_settings(partition_id).items())
        node = self._popen([_bin("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                            "--host", "127.0.0.1", "--port", str(free_port()), "--node-config", settings],
                           f"supernode-{partition_id}.log")
        self.nodes[partition_id] = node
        return node

    def kill_node(self, partition_id: int) -> None:
        """SIGKILL the SuperNode of ``partition_id`` and the ClientApp it runs (a machine that went away)."""
        self._stop(self.nodes.pop(partition_id), signal.SIGKILL, 0)

    # -- a run ------------------------------------------------------------------------------------------
    def submit(self, app: str | os.PathLike, run_config: dict[str, Any] | None = None) -> subprocess.Popen:
        """Start ``flwr run`` of the App on this federation (its log on the returned process's stdout)."""
        command = [_bin("flwr"), "run", str(Path(app).resolve()), CONNECTION, "--stream"]
        if run_config:
            command += ["--run-config", " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                cwd=self.folder, start_new_session=True, text=True, bufsize=1)

    def follow(self, process: subprocess.Popen, timeout: float = 3600.0) -> int:
        """Stream a submitted run's log to ``output`` until it ends; its exit status (124 on timeout, after stopping
        it)."""
        import selectors

        deadline = time.monotonic() + timeout
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        try:
            while True:
                if time.monotonic() > deadline:
                    self.output(f"flower-local: the run did not end within {timeout:g}s; stopping it\n")
                    return 124
                if selector.select(timeout=0.5):
                    line = process.stdout.readline()
                    if line:
                        self.output(line)
                        continue
                if process.poll() is not None:
                    for line in process.stdout:
                        self.output(line)
                    return process.returncode
        finally:
            selector.close()
            if process.poll() is None:
                _stop_group(process, signal.SIGTERM, 5)
            process.stdout.close()

    def run(self, app: str | os.PathLike, run_config: dict[str, Any] | None = None, timeout: float = 3600.0) -> int:
        """``flwr run`` the App on this federation, streaming its log to ``output``; returns its exit status (124 on
        timeout, after stopping it)."""
        return self.follow(self.submit(app, run_config), timeout)

    def server_app_processes(self) -> list[int]:
        """The pids of the ``flwr-serverapp`` processes the SuperLink runs."""
        return [pid for pid in _descendants([self.superlink.pid]) if "flwr-serverapp" in _command_line(pid)]

    def processes(self) -> list[int]:
        """Every process this federation started that still runs: the SuperLink, the SuperNodes and what they started
        (the ServerApp, the ClientApps, the nodes' workers), whichever process group they are in."""
        roots = [p.pid for p in [self.superlink, *self.nodes.values()] if p is not None] + self._stopped
        return sorted(set(_descendants(roots, include_roots=True)) | set(self._workers()))

    def _workers(self) -> list[int]:
        """The nodes' warm workers (re-parented to init once the ClientApp that started them exits; their sockets are
        in this federation's TMPDIR)."""
        return [int(name) for name in os.listdir("/proc") if name.isdigit() and _running(int(name))
                and "hf_fedflat.flower.worker" in (line := _command_line(int(name))) and str(self.tmp) in line]

    def stop(self) -> None:
        """Stop every process this federation started (SuperNodes first), with their children."""
        for partition_id in list(self.nodes):
            self._stop(self.nodes.pop(partition_id), signal.SIGTERM, 5)
        if self.superlink is not None:
            self._stop(self.superlink, signal.SIGTERM, 5)
            self.superlink = None
        for pid in self._workers():  # (they end with their SuperNode within seconds; not left to do so)
            _signal(pid, signal.SIGKILL)
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self._temporary:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _stop(self, process: subprocess.Popen, sig: int, grace: float) -> None:
        """Stop ``process``, its process group and every descendant (Flower starts some in sessions of their own)."""
        family = set(_descendants([process.pid]))
        _stop_group(process, sig, grace)
        for pid in family:
            _signal(pid, signal.SIGKILL)
        self._stopped.append(process.pid)

    def log(self, name: str) -> str:
        """A process's log: ``superlink`` or ``supernode-<i>``."""
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> "LocalFederation":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, parent pid, start time)`` of a process (Linux ``/proc``), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _running(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"  # (a zombie has ended)


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# root pid -> {(pid, start time)} of the descendants seen: a process re-parented to init when its parent ended (a
# node's worker, once its ClientApp exits) is still the root's; the start time tells it from a later process that
# reuses its pid
_FAMILY: dict[int, set[tuple[int, int]]] = {}


def _descendants(roots: list[int], include_roots: bool = False) -> list[int]:
    """The processes descending from ``roots``, now or when last looked at, that still run."""
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None:
                children.setdefault(stat[1], []).append((int(name), stat[2]))
    found: set[int] = set()
    for root in roots:
        family = _FAMILY.setdefault(root, set())
        stack = [root]
        while stack:
            for child in children.get(stack.pop(), []):
                if child not in family:
                    family.add(child)
                    stack.append(child[0])
        alive = {(pid, start) for pid, start in family if (_stat(pid) or (None, None, None))[2] == start}
        family &= alive
        found |= {pid for pid, _ in alive} | ({root} if include_roots and _running(root) else set())
    return sorted(found)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(process: subprocess.Popen, sig: int, grace: float) -> int:
    """Signal ``process``'s process group (it and its children), then SIGKILL what is left after ``grace`` s."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the children too, whether the leader is gone or not
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return process.pid
