"""Every line the product writes to the sandbox output goes one way, ``LockAlias.write_output``, which makes
it one line of visible text and escapes it (the output pane renders HTML; lock messages quote what others
wrote).

* A scan of the source (the library, the Mutex Service driver, the examples users copy) fails on any call of
  ``WriteMessageToReservationOutput`` outside ``lock/server/alias.py`` (and the emulator, which serves it).
* Against the emulator: a holder whose ``Mutex Owner`` and ``Mutex Heartbeat`` are markup reaches the output
  pane as text through ``report_left_behind_lock``, and so does a message passed to ``write_sandbox_output``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, List

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue

from cloudshell_mutex import protocol
from cloudshell_mutex.orchestration import report_left_behind_lock, write_sandbox_output

ROOT = Path(__file__).resolve().parents[2]
WRITE = "WriteMessageToReservationOutput"
#: The one writer, and the emulator that serves the call.
ALLOWED = (
    ROOT / "src" / "cloudshell_mutex" / "lock" / "server" / "alias.py",
    ROOT / "src" / "cloudshell_mutex" / "emulator",
)
SCANNED = (ROOT / "src", ROOT / "drivers", ROOT / "examples")

HOSTILE_OWNER = "<img src=x onerror=alert(1)>@h:1:deadbeef"
HOSTILE_HEARTBEAT = "<script>alert(2)</script>\u202e:x:1"


def python_files() -> Iterator[Path]:
    for folder in SCANNED:
        for path in sorted(folder.rglob("*.py")):
            if not any(path == allowed or allowed in path.parents for allowed in ALLOWED):
                yield path


def writes_around(tree: ast.AST) -> List[int]:
    """The lines of ``tree`` that reach the call: ``x.WriteMessageToReservationOutput`` in any form, or its
    name given to a call (``getattr(api, "WriteMessage...")``, a sender that takes the method's name)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == WRITE:
            lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
            if any(isinstance(a, ast.Constant) and a.value == WRITE for a in arguments):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_nothing_writes_to_the_sandbox_output_around_the_one_escaping_path():
    scanned = list(python_files())
    assert len(scanned) > 50  # the scan sees the source
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in scanned
        for line in writes_around(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert found == [], (
        f"write to the sandbox output through LockAlias.write_output (write_sandbox_output): {found}"
    )


def test_the_scan_finds_every_form_of_the_call():
    source = (
        "api.WriteMessageToReservationOutput(rid, text)\n"
        "send = api.WriteMessageToReservationOutput\n"
        "getattr(api, 'WriteMessageToReservationOutput')(rid, text)\n"
        "self._send('WriteMessageToReservationOutput', (rid, text))\n"
        "NAMES = {'WriteMessageToReservationOutput': 'output'}\n"  # a name in a table writes nothing
    )
    assert writes_around(ast.parse(source)) == [1, 2, 3, 4]


@pytest.mark.integration
def test_a_left_behind_lock_with_markup_in_its_owner_and_heartbeat_reaches_the_output_as_text(
    cloudshell_emulator_factory, our_model_package
):
    emu = cloudshell_emulator_factory(packages=[our_model_package])
    rid = emu.create_reservation("hostile holder")
    api = emu.session()
    attributes = [
        AttributeNameValue(protocol.ATTR_OWNER, HOSTILE_OWNER),
        AttributeNameValue(protocol.ATTR_HEARTBEAT, HOSTILE_HEARTBEAT),
    ]
    api.AddServiceToReservation(rid, protocol.SERVICE_MODEL, protocol.DEFAULT_ALIAS, attributes)
    sandbox = SimpleNamespace(automation_api=api, id=rid)

    holder = report_left_behind_lock(sandbox)

    assert holder is not None and holder.token == HOSTILE_OWNER
    (line,) = [line for line in emu.control.output(rid) if "left behind" in line]
    assert "<" not in line and ">" not in line, line  # no markup at all: not a warning, so no styling either
    assert "&lt;img src=x onerror=alert(1)&gt;" in line
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in line
    assert "\u202e" not in line  # a bidi override cannot turn the rest of the pane around


@pytest.mark.integration
def test_write_sandbox_output_escapes_a_message_and_styles_only_a_warning(cloudshell_emulator_factory):
    emu = cloudshell_emulator_factory()
    rid = emu.create_reservation("output")
    sandbox = SimpleNamespace(automation_api=emu.session(), id=rid)

    assert write_sandbox_output(sandbox, "held by <b>me</b>\nand more")
    assert write_sandbox_output(sandbox, "held by <b>me</b>", warning=True)

    plain, warning = emu.control.output(rid)
    assert plain == "held by &lt;b&gt;me&lt;/b&gt; and more"
    assert warning.startswith("<font color=") and "&lt;b&gt;me&lt;/b&gt;" in warning and "<b>" not in warning
