"""Bad input through the orchestration helpers, past what ``test_orchestration_input.py`` covers.

Owner labels and aliases with XML specials, non-ASCII, control characters and 10 kB; malformed reservation
ids; ``automation_api`` objects that are not a session; bad durations; a foreign holder whose owner value is
hostile, in the teardown report. Each gets a clear error or works, and leaves no lock behind. Labels are
checked for any text with Hypothesis on the test fake; the rest against the emulator with the real client.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudshell_mutex import MutexTimeout, protocol
from cloudshell_mutex.lock.errors import ReservationNotActive
from cloudshell_mutex.lock.holder import MAX_LABEL_LENGTH, parse_token
from cloudshell_mutex.lock.pacing import DefaultPacing
from cloudshell_mutex.orchestration import (
    report_left_behind_lock,
    sandbox_lock,
    sandbox_mutex,
    with_sandbox_mutex,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lock"))
from fakes import RES, FakeApi, other_holds

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.05)
ODD = ["<MUTEX>&'\"", "Routeur é 東京", "tab\there\x00nul\x07bell\x1b[31m", "x" * 10_000, "@:@:", "   "]
ODD_IDS = ["xml", "non-ascii", "control", "10kB", "token-syntax", "blank"]
CONTROL = {chr(c) for c in range(32)} - {"\n"}


def fake_sandbox(api=None):
    return SimpleNamespace(automation_api=api or FakeApi(), id=RES)


@given(st.text(max_size=400))
@settings(max_examples=150, deadline=None)
def test_any_owner_becomes_a_safe_label_and_the_lock_leaves_nothing(owner):
    sandbox = fake_sandbox()
    with sandbox_mutex(sandbox, owner=owner, pacing=FAST) as lock:
        info = parse_token(lock.token)
        assert info is not None and 0 < len(info.label) <= MAX_LABEL_LENGTH
        assert not any(ord(c) < 32 or c in "<>&'\"" for c in info.label)
    assert sandbox.automation_api.services == {}


@pytest.mark.parametrize("owner", ODD, ids=ODD_IDS)
def test_the_progress_lines_a_waiting_script_writes_are_clean_and_short(owner):
    api = FakeApi()
    other_holds(api)
    lock = sandbox_lock(fake_sandbox(api), owner=owner, pacing=FAST, timeout=1.5, progress_interval=1)
    with pytest.raises(MutexTimeout):
        lock.acquire()
    assert api.output, "a waiting script writes progress to the sandbox output"
    for line in api.output:
        assert not CONTROL & set(line) and len(line) < 400
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Other@host:1:deadbeef"


@pytest.mark.parametrize("api", [None, "cs.example.com", {"host": "cs", "password": "hunter2"}, object()])
def test_an_automation_api_that_is_not_a_session_is_refused_without_echoing_it(api):
    sandbox = SimpleNamespace(automation_api=api, id=RES)
    with pytest.raises(TypeError) as raised, sandbox_mutex(sandbox):
        pass
    assert "hunter2" not in str(raised.value) and "cs.example.com" not in str(raised.value)


@pytest.mark.parametrize("rid", ["line\nbreak", "nul\x00", "x" * 300])
def test_reservation_ids_that_cannot_be_one_are_refused_before_any_call(rid):
    api = FakeApi()
    ran = []
    step = with_sandbox_mutex(lambda sandbox, components: ran.append(1))
    with pytest.raises(ValueError, match="reservation_id"):
        step(SimpleNamespace(automation_api=api, id=rid), None)
    assert ran == [] and api.calls == []


@pytest.mark.parametrize("name", ["", "  ", "MU\nTEX", "nul\x00", "x" * 300, None, 7])
def test_aliases_that_cannot_be_one_are_refused_before_any_call(name):
    api = FakeApi()
    ran = []
    with pytest.raises(ValueError, match="alias"), sandbox_mutex(fake_sandbox(api), name=name):
        ran.append(1)
    with pytest.raises(ValueError, match="alias"):
        with_sandbox_mutex(name=name)(lambda sandbox, components: ran.append(1))(fake_sandbox(api), None)
    with pytest.raises(ValueError, match="alias"):
        report_left_behind_lock(fake_sandbox(api), None, name=name)
    assert ran == [] and api.calls == []


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "10", True], ids=str)
@pytest.mark.parametrize("option", ["timeout", "lease", "request_lifetime", "progress_interval"])
def test_bad_durations_are_refused_before_any_call(option, value):
    api = FakeApi()
    ran = []
    with (
        pytest.raises((TypeError, ValueError), match=option),
        sandbox_mutex(fake_sandbox(api), **{option: value}),
    ):
        ran.append(1)
    step = with_sandbox_mutex(lambda sandbox, components: ran.append(1), **{option: value})
    with pytest.raises((TypeError, ValueError), match=option):
        step(fake_sandbox(api), None)
    assert ran == [] and api.calls == []


@pytest.mark.parametrize("owner", ["evil\x1b[31m<script>&\x00", "y" * 10_000], ids=["control", "10kB"])
def test_the_teardown_report_of_a_hostile_foreign_owner_is_clean_and_short(owner):
    api = FakeApi()
    other_holds(api, token=owner)  # the original snippet writes whatever it was given
    holder = report_left_behind_lock(fake_sandbox(api))
    assert holder is not None and holder.token == owner
    (line,) = api.output
    assert not CONTROL & set(line) and len(line) < 600
    assert protocol.DEFAULT_ALIAS in api.services  # it only reports


# ---------------------------------------------------------------- the real client and the emulator


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip):
    return cloudshell_emulator_factory(packages=[original_package_zip])


def real_sandbox(emu, rid):
    return SimpleNamespace(automation_api=emu.session(), id=rid)


@pytest.mark.integration
@pytest.mark.parametrize("owner", ODD, ids=ODD_IDS)
def test_odd_owners_work_through_the_helper_and_the_wrapper(emu, owner):
    rid = emu.create_reservation()
    sandbox = real_sandbox(emu, rid)
    with sandbox_mutex(sandbox, owner=owner, pacing=FAST) as lock:
        assert lock.holder().token == lock.token
        assert report_left_behind_lock(sandbox).token == lock.token
    step = with_sandbox_mutex(lambda sb, components: sb.automation_api, owner=owner, pacing=FAST)
    assert step(sandbox, None) is sandbox.automation_api
    assert emu.control.reservation(rid)["services"] == []
    for line in emu.control.output(rid):
        assert not CONTROL & set(line) and len(line) < 600


@pytest.mark.integration
@pytest.mark.parametrize("name", ["MUTEX<&>'\"", "A lock: #1 \\ 100%", "a" * 200])
def test_odd_one_line_aliases_work_through_the_helper_and_the_report(emu, name):
    rid = emu.create_reservation()
    sandbox = real_sandbox(emu, rid)
    with sandbox_mutex(sandbox, name=name, pacing=FAST) as lock:
        assert report_left_behind_lock(sandbox, None, name=name).token == lock.token
    assert report_left_behind_lock(sandbox, None, name=name) is None
    assert emu.control.reservation(rid)["services"] == []


@pytest.mark.integration
@pytest.mark.parametrize("rid", ["not-a-uuid", "x' or '1'='1", "<Reservation/>", "é" * 100])
def test_ids_of_no_reservation_get_a_clear_error_and_the_report_says_so(emu, rid):
    sandbox = real_sandbox(emu, rid)
    with (
        pytest.raises(ReservationNotActive, match="was not found"),
        sandbox_mutex(sandbox, timeout=5, pacing=FAST),
    ):
        pass
    assert report_left_behind_lock(sandbox) is None  # reported as unreadable, not raised: teardown goes on
