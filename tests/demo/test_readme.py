"""Every python block in README.md runs, against the emulator, with a tiny harness that provides what the
text says the reader has: ``api`` and ``reservation_id``, a driver command's ``context``, and the environment
CloudShell sets for an orchestration script."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from cloudshell_mutex import emulated
from cloudshell_mutex.demo.contexts import (
    resource_command_context,
    sandbox_environment,
    scripts_honour_api_port,
)

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)

#: For each block, in order: the lock owners it must have taken (the labels in the Mutex Owner tokens of the
#: locks' own services: MUTEX and named locks, not queue tickets or wait records).
EXPECTED_OWNERS = [
    ["Router A rewire", "Router A reconfigure"],  # Lock a driver command
    ["Setup", "Router A rewire"],  # Try it on the emulator (its own sandbox; the command waits for Setup)
    ["Setup", "Configure routers"],  # Lock an orchestration script
    ["Nightly check", "Nightly check", "Inventory", "Inventory", "Inventory", "Inventory"],  # any other code
]
#: What a block prints that the text around it promises.
EXPECTED_PRINTED = {
    1: ["Router A rewire: waiting for MUTEX held by Setup"],  # the sandbox output, read back
}


def test_every_python_block_is_covered():
    assert len(BLOCKS) == len(EXPECTED_OWNERS), "a README python block was added or removed: update this test"


@pytest.mark.parametrize("index", range(len(EXPECTED_OWNERS)))
def test_readme_block_runs_and_takes_the_lock(
    index, cloudshell_emulator_factory, original_package_zip, tmp_path, monkeypatch, capsys
):
    if "cloudshell.workflow" in BLOCKS[index]:
        pytest.importorskip("cloudshell.workflow.orchestration.sandbox")  # orch-core is in .venv only
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    reservation_id = emu.create_reservation("README")
    token = emu.issue_token()
    for key, value in sandbox_environment(emu.host, emu.port, token, reservation_id).items():
        monkeypatch.setenv(key, value)
    harness = {
        "__name__": f"readme_block_{index}",
        "api": emu.session(),
        "reservation_id": reservation_id,
        "context": resource_command_context(emu.host, emu.port, token, reservation_id, "Router A"),
    }
    # `make emulator`'s address, for EmulatedSite (this emulator listens on free ports).
    monkeypatch.setattr(emulated, "DEFAULT_PORT", emu.port)
    monkeypatch.setattr(emulated, "DEFAULT_QUALI_PORT", emu.quali_port)
    handlers = list(logging.getLogger().handlers)
    try:
        with scripts_honour_api_port():
            exec(compile(BLOCKS[index], f"README.md python block {index + 1}", "exec"), harness)
    finally:  # print_lock_log's handler goes with the block
        for handler in set(logging.getLogger().handlers) - set(handlers):
            logging.getLogger().removeHandler(handler)
    events = [e for e in emu.control.events() if "~" not in e["alias"]]  # every sandbox's locks
    assert [e["op"] for e in events].count("service_removed") == [e["op"] for e in events].count(
        "service_added"
    )
    owners = [
        e["attributes"].get("Mutex Owner", "").split("@")[0] for e in events if e["op"] == "service_added"
    ]
    assert owners == EXPECTED_OWNERS[index]
    assert emu.control.reservation(reservation_id)["services"] == []  # every lock was released
    printed = capsys.readouterr().out
    for text in EXPECTED_PRINTED.get(index, []):
        assert text in printed, printed
