"""Lock names and derived aliases: what may name a lock, and names the lock must read whatever they look like.

* A lock's name is refused before any call when it is blank-padded, carries ``~`` (the mark of the aliases a
  lock derives from its name: reader slots, the closer, queue tickets, breakers), spells ``MUTEX`` in other
  letter cases, or holds anything but printable ASCII: ``MUTEX\\u200b``, a Cyrillic ``\\u041c`` or fullwidth
  letters show as ``MUTEX`` to people and exclude nothing that uses ``MUTEX``. Every place a name enters (the
  lock classes, the driver mixin, the orchestration helpers, ``acquire_all``, ``adopt``) refuses it, and the
  error names the character as a ``\\uXXXX`` escape.
* An administrator's command (``status``, ``release``) still reaches a service whose alias only looks like
  ``MUTEX`` (made by other code), shows it escaped, and says that it is no lock name.
* Queue tickets of any number are tickets (a number with ten digits once made a fair waiter blind to its own
  ticket: it joined again and again, leaving dozens of tickets).
* On a server that takes aliases alike whatever their case (the emulator's ``alias_case="insensitive"``; not
  known of a real server), a waiter whose add is refused while a read shows only another spelling of its
  alias raises at once instead of retrying without end.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue
from fakes import RES, FakeApi

from cloudshell_mutex import MutexUsageError, ReservationMutex, ReservationRWLock, cli, protocol
from cloudshell_mutex.driver import ReservationMutexMixin, with_reservation_mutex
from cloudshell_mutex.lock import acquire_all
from cloudshell_mutex.lock.admin import command
from cloudshell_mutex.lock.cohort.cohort import CohortMutex
from cloudshell_mutex.lock.mutex.handle import HandleInfo, make_handle
from cloudshell_mutex.lock.pacing import DefaultPacing
from cloudshell_mutex.lock.protocol import ticket_alias, ticket_number
from cloudshell_mutex.lock.queue.tickets import queue_view
from cloudshell_mutex.orchestration import (
    report_left_behind_lock,
    sandbox_lock,
    sandbox_mutex,
    sandbox_rwlock,
    with_sandbox_mutex,
)

FAST = dict(pacing=DefaultPacing(first=0.01, base=0.02, cap=0.1), holder_check_interval=0.25)

RESERVED = ["MUTEX~r3", "MUTEX~c", "MUTEX~w", "MUTEX~break", "MUTEX~generation", "MUTEX~q~7", "A~B"]
PADDED = [" MUTEX", "MUTEX ", "\tMUTEX"]
CASE = ["mutex", "Mutex", "mUTEX"]
#: Names that show as MUTEX (or as another ASCII name) to people, each with the character that gives it away.
LOOK_ALIKES = {
    "MUTEX\u200b": "\\u200b",  # zero width space
    "\u200bMUTEX": "\\u200b",
    "MUTEX\u2060": "\\u2060",  # word joiner
    "MU\u00adTEX": "\\u00ad",  # soft hyphen
    "\u041cUTEX": "\\u041c",  # Cyrillic capital EM
    "\uff2d\uff35\uff34\uff25\uff38": "\\uff2d",  # fullwidth MUTEX
    "MUTE\u0425": "\\u0425",  # Cyrillic capital HA
    "MUTEX\u202e": "\\u202e",  # right-to-left override
    "MUTEX\u0301": "\\u0301",  # combining acute accent
    "Sperre \u00e9": "\\u00e9",
    "MUTEX\U0001f512": "\\U0001f512",
}


@pytest.mark.parametrize("name", RESERVED + PADDED + CASE + list(LOOK_ALIKES))
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
    # Says what is wrong and what to use, with the name as people must read it (escaped, never raw).
    assert protocol.shown_name(name) in message and "use " in message, message
    assert message.isascii() and message.isprintable(), message
    assert api.calls == []


@pytest.mark.parametrize("name", ["MUTEX", "MUTEX-connectivity", "Router A", "mutex-config", "A: #1 \\ 100%"])
def test_a_locks_own_names_are_taken(name):
    assert ReservationMutex(FakeApi(), RES, name=name).name == name


class Driver(ReservationMutexMixin):
    """A driver with the mixin; no command runs: a bad name is refused before the session is opened."""


def entry_points(api, name, tmp_path):
    """Every way a name reaches a lock, each a callable that takes it."""
    sandbox = SimpleNamespace(automation_api=api, id=RES)
    context = SimpleNamespace()  # never looked at: the name is checked first
    foreign = SimpleNamespace(name=name, api=api, reservation_id=RES)  # any object acquire_all is given
    handle = make_handle(HandleInfo(RES, name, protocol.SERVICE_MODEL, "adopted@h:1:0123456789abcdef", 0.0))
    return {
        "ReservationMutex": lambda: ReservationMutex(api, RES, name=name),
        "ReservationRWLock": lambda: ReservationRWLock(api, RES, name=name),
        "CohortMutex": lambda: CohortMutex(api, RES, name=name, cohort_dir=tmp_path),
        "adopt": lambda: ReservationMutex.adopt(api, handle),
        "mixin reservation_mutex": lambda: Driver().reservation_mutex(context, name),
        "mixin reservation_rwlock": lambda: Driver().reservation_rwlock(context, name),
        "with_reservation_mutex": lambda: with_reservation_mutex(name=name),
        "sandbox_lock": lambda: sandbox_lock(sandbox, name=name),
        "sandbox_rwlock": lambda: sandbox_rwlock(sandbox, name=name),
        "sandbox_mutex": lambda: sandbox_mutex(sandbox, name=name).__enter__(),
        "with_sandbox_mutex": lambda: with_sandbox_mutex(name=name),
        "report_left_behind_lock": lambda: report_left_behind_lock(sandbox, name=name),
        "acquire_all": lambda: acquire_all(foreign).__enter__(),
    }


@pytest.mark.parametrize("name", list(LOOK_ALIKES))
def test_every_place_a_lock_name_enters_refuses_a_look_alike_naming_the_character_escaped(name, tmp_path):
    api = FakeApi()
    for where, make in entry_points(api, name, tmp_path).items():
        with pytest.raises(ValueError) as raised:
            make()
        message = str(raised.value)
        assert LOOK_ALIKES[name] in message, (where, message)  # the character, as a \uXXXX escape
        assert message.isascii() and message.isprintable(), (where, message)  # never the character itself
        assert "printable ASCII" in message and "excludes nothing" in message, (where, message)
    assert api.calls == []


def test_a_look_alike_says_what_people_read_it_as_and_what_to_use():
    with pytest.raises(ValueError) as raised:
        protocol.check_lock_name("MU\u00adTEX")
    message = str(raised.value)
    assert "contains \\u00ad (SOFT HYPHEN) at position 2" in message
    assert "reads as 'MUTEX'" in message and message.endswith("use 'MUTEX'")
    assert protocol.lock_name_problem("\u041cUTEX").endswith("e.g. 'MUTEX'")  # no ASCII reading: an example


@pytest.mark.integration
def test_while_the_original_code_holds_mutex_no_look_alike_is_acquired(
    cloudshell_emulator_factory, original_package_zip
):
    """The attack: each look-alike was a different alias to the server, so it was granted while the original
    snippet held MUTEX (two parties inside at once). Now none is tried at all."""
    from original_protocol import OriginalMutex

    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation("look-alikes")
    with OriginalMutex(emu.session(), rid, "v1", attempts=1) as original:
        assert original.acquired
        adds = emu.control.call_counts().get("AddServiceToReservation", 0)
        for name in LOOK_ALIKES:
            with pytest.raises(ValueError):
                ReservationMutex(emu.session(), rid, name=name, timeout=5).acquire()
        assert emu.control.call_counts().get("AddServiceToReservation", 0) == adds
        assert [s["alias"] for s in emu.control.reservation(rid)["services"]] == ["MUTEX"]


@pytest.mark.integration
def test_an_administrator_sees_a_look_alike_service_escaped_and_can_remove_it(
    cloudshell_emulator_factory, original_package_zip, monkeypatch, tmp_path, capsys
):
    """Status and release act on a service that exists, whoever made it: a look-alike made by other code is
    shown escaped (never as MUTEX), flagged as no lock name, and removed by its own alias, not MUTEX."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation("look-alike service")
    api = emu.session()
    look_alike = "MUTEX\u200b"
    for alias, owner in ((protocol.DEFAULT_ALIAS, "holder@h:1:0123456789abcdef"), (look_alike, "other code")):
        attributes = [AttributeNameValue(protocol.ATTR_OWNER, owner)]
        api.AddServiceToReservation(rid, protocol.SERVICE_MODEL, alias, attributes)
    monkeypatch.chdir(tmp_path)
    for variable in ("CLOUDSHELL_PORT", "CLOUDSHELL_USERNAME", "CLOUDSHELL_DOMAIN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("CLOUDSHELL_HOST", emu.host)
    monkeypatch.setenv("CLOUDSHELL_API_PORT", str(emu.port))
    monkeypatch.setenv("CLOUDSHELL_PASSWORD", emu.admin_password)

    assert cli.main(["status", rid, "--name", look_alike]) == command.EXIT_OK
    out = capsys.readouterr().out
    assert "'MUTEX\\u200b' (not a lock name: " in out and "is held by 'other code'" in out
    assert cli.main(["status", rid, "--all"]) == command.EXIT_OK
    listing = capsys.readouterr().out
    assert "  'MUTEX\\u200b' (not a lock name: " in listing and "  MUTEX: exclusive" in listing
    assert "\u200b" not in out + listing
    code = cli.main(["release", rid, "--name", look_alike, "--force", "--reason", "a look-alike of MUTEX"])
    assert code == command.EXIT_OK, capsys.readouterr()
    assert [s["alias"] for s in emu.control.reservation(rid)["services"]] == [protocol.DEFAULT_ALIAS]
    record = [line for line in emu.control.output(rid) if "force-released" in line]
    assert len(record) == 1 and "'MUTEX\\u200b'" in record[0]
    # A control character cannot be in any alias: refused before the logon, named escaped.
    assert cli.main(["status", rid, "--name", "MU\x07TEX"]) == command.EXIT_USAGE
    err = capsys.readouterr().err
    assert "\\u0007" in err and "\x07" not in err


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


@pytest.mark.usefixtures("parked_at_once")  # the parked queue's steps
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
    from cloudshell_mutex.lock.lease.lease import ticket_value

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
