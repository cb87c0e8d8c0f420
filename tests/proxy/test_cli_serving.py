"""The CLI's life on a real port: listening is said only once bound, a busy port is one clear
line and a non-zero exit, and a shutdown says when it starts draining and when it is done."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.proxy.test_settings import ROOT, run_cli


def _messages(stderr: str) -> list[str]:
    return [json.loads(line)["msg"] for line in stderr.splitlines() if line.startswith("{")]


def test_a_busy_port_is_one_clear_line_and_a_non_zero_exit_without_listening(
    tmp_path: Path,
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("--port", str(port), cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("compaction-proxy: cannot listen on 127.0.0.1:")
    assert "listening" not in lines[0].split(":", 1)[1].replace("cannot listen", "")


def test_listening_is_logged_once_bound_and_shutdown_logs_the_drain(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "--port", str(port)],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        first = json.loads(process.stderr.readline())
        assert first["msg"] == "listening" and first["port"] == port
        # Bound by now: a connection succeeds. The access line of a request made just before
        # the signal waits in the log's buffer (batched) and is written before the exit.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert conn.recv(64).startswith(b"HTTP/1.1 200")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0
    messages = _messages(stderr)
    assert messages[0] == "request" and '"path":"/healthz"' in stderr
    assert messages[1].startswith("shutting down")
    assert messages[-1] == "stopped"


def test_make_run_takes_a_port_and_arguments_from_the_command_line() -> None:
    def dry_run(*args: str, env: dict[str, str] | None = None) -> str:
        result = subprocess.run(
            ["make", "-n", "run", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin", **(env or {})},
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        return next(line.strip() for line in lines if "compaction-proxy " in line)

    assert dry_run("PORT=9000").endswith("--config config.yaml --port 9000")
    assert "--upstream http://127.0.0.1:1/v1" in dry_run("ARGS=--upstream http://127.0.0.1:1/v1")
    assert "--port" not in dry_run(env={"PORT": "5000"})  # an exported PORT is not ours


def test_a_request_still_running_is_cut_once_the_shutdown_timeout_is_over(
    tmp_path: Path,
) -> None:
    with socket.socket() as silent, socket.socket() as probe:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # an upstream that takes the request and never answers
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        upstream = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--port", str(port), "--upstream", upstream],
            cwd=tmp_path,
            env={
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": str(ROOT),
                "COMPACTION_PROXY__SERVER__SHUTDOWN_TIMEOUT_S": "1",
            },
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stderr is not None
            assert json.loads(process.stderr.readline())["msg"] == "listening"
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
                silent.settimeout(5)
                asked, _ = silent.accept()
                with asked:
                    assert asked.recv(64).startswith(b"GET /v1/models")  # now in flight
                    started = time.monotonic()
                    process.send_signal(signal.SIGTERM)
                    _, stderr = process.communicate(timeout=30)
                    stopped_after_s = time.monotonic() - started
                assert conn.recv(64) == b""  # cut: the connection closed without an answer
        finally:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert _messages(stderr)[-1] == "stopped"
    # aiohttp waits its shutdown timeout twice for a handler that does not end on its own (once
    # for it to finish, once more after failing its request body): 2 s here, 60 s by default.
    assert stopped_after_s < 1.8
