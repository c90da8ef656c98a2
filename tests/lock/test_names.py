"""Lock names and derived aliases: what may name a lock, and names the lock must read whatever they look like.

* A lock's name is refused before any call when it is blank-padded, carries ``~`` (the mark of the aliases a
  lock derives from its name: reader slots, the closer, queue tickets, breakers) or spells ``MUTEX`` in other
  letter cases.
* Queue tickets of any number are tickets (a number with ten digits once made a fair waiter blind to its own
  ticket: it joined again and again, leaving dozens of tickets).
* On a server that takes aliases alike whatever their case (the emulator's ``alias_case="insensitive"``; not
  known of a real server), a waiter whose add is refused while a read shows only another spelling of its
  alias raises at once instead of retrying without end.
"""

from __future__ import annotations

import threading
import time

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue
from fakes import RES, FakeApi

from cloudshell_mutex import MutexUsageError, ReservationMutex, ReservationRWLock, protocol
from cloudshell_mutex.lock.cohort import CohortMutex
from cloudshell_mutex.lock.pacing import DefaultPacing
from cloudshell_mutex.lock.protocol import ticket_alias, ticket_number
from cloudshell_mutex.lock.tickets import queue_view

FAST = dict(pacing=DefaultPacing(first=0.01, base=0.02, cap=0.1), holder_check_interval=0.25)

RESERVED = ["MUTEX~r3", "MUTEX~c", "MUTEX~w", "MUTEX~break", "MUTEX~generation", "MUTEX~q~7", "A~B"]
PADDED = [" MUTEX", "MUTEX ", "\tMUTEX"]
CASE = ["mutex", "Mutex", "mUTEX"]


@pytest.mark.parametrize("name", RESERVED + PADDED + CASE)
@pytest.mark.parametrize("kind", ["mutex", "rwlock", "cohort"])
def test_names_that_are_not_a_locks_own_are_refused_before_any_call(name, kind, tmp_path):
    api = FakeApi()
    make = {
        "mutex": lambda: ReservationMutex(api, RES, name=name),
        "rwlock": lambda: ReservationRWLock(api, RES, name=name),
        "cohort": lambda: CohortMutex(api, RES, name=name, cohort_dir=tmp_path),
    }[kind]
    with pytest.raises(ValueError) as raised:
        make()
    message = str(raised.value)
    assert repr(name) in message and "use " in message, message  # says what is wrong and what to use
    assert api.calls == []


@pytest.mark.parametrize("name", ["MUTEX", "MUTEX-connectivity", "Router A", "mutex-config"])
def test_a_locks_own_names_are_taken(name):
    assert ReservationMutex(FakeApi(), RES, name=name).name == name


def test_ticket_numbers_of_any_length_are_tickets_and_only_as_the_queue_writes_them():
    huge = 10**30
    assert ticket_number(ticket_alias("MUTEX", huge), "MUTEX") == huge
    assert ticket_number("MUTEX~q~1000000000", "MUTEX") == 1_000_000_000
    for other in (
        "MUTEX~q~",
        "MUTEX~q~007",
        "MUTEX~q~\u0661\u0662",
        "MUTEX~q~1x",
        "MUTEX~q~-1",
        "MUTEX2~q~1",
    ):
        assert ticket_number(other, "MUTEX") is None, other


@pytest.mark.integration
def test_a_fair_waiter_behind_a_ten_digit_ticket_sees_its_own_ticket_and_leaves_none(
    cloudshell_emulator_factory, original_package_zip
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation("names")
    api = emu.session()
    foreign = ticket_alias("MUTEX", 999_999_999)
    api.AddServiceToReservation(
        rid, protocol.SERVICE_MODEL, foreign, [AttributeNameValue(protocol.ATTR_OWNER, "someone else's")]
    )
    holder = ReservationMutex(api, rid, owner="holder", **FAST)
    holder.acquire()
    releaser = threading.Timer(1.5, holder.release)
    releaser.start()
    waiter = ReservationMutex(emu.session(), rid, owner="fair waiter", fair=True, timeout=60, **FAST)
    try:
        with waiter:
            pass
    finally:
        releaser.join()
    tickets = [
        e["alias"]
        for e in emu.control.events(rid)
        if e["op"] == "service_added" and ticket_number(e["alias"], "MUTEX") not in (None, 999_999_999)
    ]
    assert tickets == [ticket_alias("MUTEX", 1_000_000_000)], tickets  # joined once, right after the highest
    services = api.GetReservationDetails(rid, True).ReservationDescription.Services
    assert [s.Alias for s in services] == [foreign]


@pytest.mark.integration
def test_on_a_case_blind_server_a_waiter_refused_for_another_spelling_raises_at_once(
    cloudshell_emulator_factory, original_package_zip
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip], alias_case="insensitive")
    rid = emu.create_reservation("names")
    with ReservationMutex(emu.session(), rid, name="Config", owner="holder", **FAST):
        waiter = ReservationMutex(emu.session(), rid, name="CONFIG", owner="waiter", timeout=60, **FAST)
        started = time.monotonic()
        with pytest.raises(MutexUsageError, match="only in letter case") as raised:
            waiter.acquire()
        assert time.monotonic() - started < 10  # not the 60 s timeout, nor a spin until it
        assert "'Config'" in str(raised.value)
        assert waiter.calls <= 4  # the add, the read that shows the other spelling (and the model's probe)


@pytest.mark.integration
def test_on_a_server_that_tells_cases_apart_two_spellings_are_two_locks(
    cloudshell_emulator_factory, original_package_zip
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation("names")
    first = ReservationMutex(emu.session(), rid, name="Config", **FAST)
    with first, ReservationMutex(emu.session(), rid, name="CONFIG", timeout=5, **FAST) as other:
        assert first.locked() and other.locked()


def test_the_queue_view_reads_tickets_past_nine_digits():
    from cloudshell_mutex.lock.holder import Holder
    from cloudshell_mutex.lock.lease import ticket_value

    token = "w@h:1:0123abcd"
    services = {
        ticket_alias("MUTEX", 1_000_000_000): Holder(
            ticket_alias("MUTEX", 1_000_000_000), ticket_value(token, 120, 0), "w", protocol.SERVICE_MODEL
        )
    }
    view = queue_view(services, "MUTEX", 0.0)
    assert view.highest == 1_000_000_000 and view.position(token) == 1


# ---------------------------------------------------------------- the name table


@pytest.mark.parametrize("name", ["MUTEX", "Rack 7", "A#B"])
def test_every_derived_alias_is_built_and_told_apart_by_the_name_table(name):
    built = {
        protocol.reader_slot_alias(name, 12): "reader slot",
        protocol.closer_alias(name): "closing",
        protocol.writer_waiting_alias(name): "writer waiting",
        protocol.ticket_alias(name, 10**12): "queue ticket",
        protocol.breaker_alias(name): "breaker",
        protocol.generation_alias(name): "generation",
        f"{name}~future": "internal",
        name: "lock",
    }
    for alias, kind in built.items():
        assert protocol.alias_kind(alias) == (name, kind), alias
    assert protocol.reader_slot_number(protocol.reader_slot_alias(name, 12), name) == 12
    assert protocol.ticket_number(protocol.ticket_alias(name, 10**12), name) == 10**12
    for odd in (f"{name}~r٣", f"{name}~r", f"{name}~r3 ", f"{name}~q~٣"):  # not ASCII digits, none, a blank
        assert protocol.alias_kind(odd)[1] == "internal", odd
        assert protocol.reader_slot_number(odd, name) is None


def test_no_module_of_the_lock_spells_a_derived_alias_itself():
    """Aliases derived from a lock's name are built and parsed in protocol.py alone: a second spelling
    elsewhere is how two parts of the lock came to disagree about which services are reader slots."""
    from pathlib import Path

    import cloudshell_mutex.lock as wing

    spelled = {}
    for path in Path(wing.__file__).parent.glob("*.py"):
        if path.name == "protocol.py":
            continue
        lines = [n for n, line in enumerate(path.read_text().splitlines(), 1) if '"~' in line or "'~" in line]
        if lines:
            spelled[path.name] = lines
    assert spelled == {}
