"""Bad input through the lock: a clear error, or correct work; never a corrupted or leaked lock.

Property-based (Hypothesis) for the label and token parsers; through the real client against the emulator
for labels, aliases and reservation ids that an XML API can choke on.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudshell_mutex import MutexError, ReservationMutex
from cloudshell_mutex.lock.errors import ReservationNotActive
from cloudshell_mutex.lock.holder import (
    MAX_LABEL_LENGTH,
    describe_owner,
    make_token,
    parse_token,
    sanitize_label,
)
from cloudshell_mutex.lock.pacing import DefaultPacing

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)


@given(st.text(max_size=300))
def test_any_label_becomes_a_short_safe_label(label):
    cleaned = sanitize_label(label)
    assert 0 < len(cleaned) <= MAX_LABEL_LENGTH
    assert "@" not in cleaned and ":" not in cleaned
    assert not any(ord(c) < 32 or c in "<>&'\"" for c in cleaned)


@given(st.text(max_size=300))
def test_a_token_made_from_any_label_parses_back(label):
    info = parse_token(make_token(label))
    assert info is not None and info.label == sanitize_label(label)


@given(st.text(max_size=500))
@settings(max_examples=300)
def test_parsing_any_owner_value_never_raises(value):
    info = parse_token(value)
    assert info is None or value.startswith(info.label)
    assert len(describe_owner(value)) <= 120


ODD_OWNERS = ["<MUTEX>&'\"", "Routeur é 東京", "tab\there\x00nul\x07bell", "x" * 10_000, "@:@:", "   "]


@pytest.mark.integration
@pytest.mark.parametrize(
    "owner", ODD_OWNERS, ids=["xml", "non-ascii", "control", "10kB", "token-syntax", "blank"]
)
def test_odd_owner_labels_work_and_leave_nothing(cloudshell_emulator_factory, original_package_zip, owner):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    with ReservationMutex(emu.session(), rid, owner=owner, pacing=FAST) as lock:
        assert lock.holder().token == lock.token
        assert parse_token(lock.token) is not None
    assert emu.control.reservation(rid)["services"] == []


@pytest.mark.integration
@pytest.mark.parametrize("alias", ["MUTEX<&>'\"", "A lock: #1 \\ 100%", "a" * 200])
def test_odd_aliases_that_are_one_line_work_and_leave_nothing(
    cloudshell_emulator_factory, original_package_zip, alias
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    with ReservationMutex(emu.session(), rid, name=alias, pacing=FAST) as lock:
        assert lock.holder().alias == alias
    assert emu.control.reservation(rid)["services"] == []


@pytest.mark.parametrize("alias", ["", "  ", "MU\nTEX", "nul\x00", "x" * 300, None, 7])
def test_aliases_that_cannot_be_one_are_refused_before_any_call(alias):
    from fakes import RES, FakeApi

    api = FakeApi()
    with pytest.raises(ValueError, match="alias"):
        ReservationMutex(api, RES, name=alias)
    assert api.calls == []


@pytest.mark.parametrize("rid", ["", "   ", "line\nbreak", "nul\x00", "x" * 300, None, 12])
def test_reservation_ids_that_cannot_be_one_are_refused_before_any_call(rid):
    from fakes import FakeApi

    api = FakeApi()
    with pytest.raises(ValueError, match="reservation_id"):
        ReservationMutex(api, rid)
    assert api.calls == []


@pytest.mark.integration
@pytest.mark.parametrize("rid", ["not-a-uuid", "x' or '1'='1", "<Reservation/>", "é" * 100])
def test_ids_of_no_reservation_get_a_clear_error(cloudshell_emulator_factory, original_package_zip, rid):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    with pytest.raises(ReservationNotActive, match="was not found"):
        ReservationMutex(emu.session(), rid, timeout=5, pacing=FAST).acquire()


@pytest.mark.parametrize("api", [None, {"host": "cs", "password": "hunter2"}, "cs.example.com", object()])
def test_things_that_are_not_an_api_session_are_refused_without_echoing_them(api):
    with pytest.raises(TypeError, match="CloudShellAPISession") as raised:
        ReservationMutex(api, "rid")
    assert "hunter2" not in str(raised.value) and "cs.example.com" not in str(raised.value)
    assert not isinstance(raised.value, MutexError)
