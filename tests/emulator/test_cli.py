"""``cloudshell-mutex emulator`` runs in the foreground, says where it listens, and stops on Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cloudshell.api.cloudshell_api import CloudShellAPISession

from cloudshell_mutex.emulator import EmulatorControl
from cloudshell_mutex.lock.protocol import SERVICE_MODEL

pytestmark = pytest.mark.integration

PASSWORD = "Pw-never-printed-7319"


def test_cli_serves_until_interrupted_and_never_prints_the_password(original_package_zip: Path):
    command = [
        sys.executable, "-m", "cloudshell_mutex.cli", "emulator", "--port", "0", "--quali-port", "0",
        "--admin-password", PASSWORD, "--package", str(original_package_zip), "--latency-ms", "1:2",
        "--catalog", "permissive",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = [process.stdout.readline() for _ in range(4)]
        match = re.search(r"http://127\.0\.0\.1:(\d+)/ResourceManagerApiService/", lines[0])
        assert match, lines
        port = int(match.group(1))
        assert re.search(r"http://127\.0\.0\.1:\d+/API/", lines[1]), lines
        api = CloudShellAPISession("127.0.0.1", "admin", PASSWORD, "Global", port=port)
        assert [s.Name for s in api.GetServices("", "").Services] == [SERVICE_MODEL]
        settings = EmulatorControl(f"http://127.0.0.1:{port}").settings()
        assert settings["latency"] == {
            "distribution": "uniform",
            "low": 0.001,
            "high": 0.002,
            "commit_fraction": 0.5,
        }
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    output = "".join(lines) + rest
    assert "emulator stopped" in output
    assert PASSWORD not in output


def test_cli_refuses_a_bad_package_clearly(tmp_path: Path):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"nonsense")
    result = subprocess.run(
        [sys.executable, "-m", "cloudshell_mutex.cli", "emulator", "--port", "0", "--quali-port", "0",
         "--package", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot start" in result.stderr and "zip" in result.stderr
