"""lock.admin (status and force release) on the in-memory fake: each outcome, deterministically."""

from __future__ import annotations

import urllib3.exceptions
from fakes import RES, Clock, FakeApi, api_error, other_holds

from cloudshell_mutex import protocol
from cloudshell_mutex.lock.admin.admin import (
    MAX_REASON_LENGTH,
    Outcome,
    clean_reason,
    force_release,
    lock_status,
)
from cloudshell_mutex.lock.pacing import CallBudget
from cloudshell_mutex.lock.server.alias import LockAlias
from cloudshell_mutex.lock.text import WARNING_TEMPLATE

ACTOR = "ops-alice (test)"


def setup(holder: bool = True):
    clock = Clock()
    api = FakeApi(clock=clock)
    if holder:
        other_holds(api, "Router A driver@exec-02:4711:9f3a1c2b")
    alias = LockAlias(api, RES, budget=CallBudget(rate=1000, burst=1000, clock=clock), clock=clock)
    return api, clock, alias


def test_release_reads_removes_once_and_records_who_whose_and_why():
    api, _, alias = setup()
    report = force_release(alias, ACTOR, "driver\ncrashed ")
    assert report.outcome is Outcome.RELEASED and report.output_written is True
    assert api.services == {}
    assert api.count("RemoveServicesFromReservation") == 1
    (line,) = api.output
    assert line == WARNING_TEMPLATE.format(report.message)  # a forced release stands out in the output
    assert report.message.startswith(f"{ACTOR} force-released 'MUTEX' in reservation {RES}, held by Router A")
    assert "Router A driver@exec-02:4711:9f3a1c2b" in line
    assert report.message.endswith("Reason: driver crashed")


MARKUP = '<script>alert("x")</script><img src=x onerror=boom()>&amp;\u202e\u2028\x1b[31m'


def test_a_reason_and_an_owner_full_of_markup_reach_the_output_as_text():
    api, _, alias = setup(holder=False)
    other_holds(api, MARKUP * 5000)  # 100 kB of markup and invisible characters, written by other code
    report = force_release(alias, f"<b>{ACTOR}</b>", f"\u200b{MARKUP}\u200b")
    assert report.outcome is Outcome.RELEASED
    (line,) = api.output
    assert line.startswith('<font color="#f48342">WARNING: ') and line.endswith("</font>")
    inner = line[len('<font color="#f48342">WARNING: ') : -len("</font>")]
    assert "<" not in inner and ">" not in inner  # every bracket is escaped: no markup but our own
    assert "&lt;script&gt;" in inner and "&amp;amp;" in inner
    assert not any(ch in inner for ch in "\u202e\u2028\u200b\x1b\n")
    assert len(line) < 2 * 1000 + 100  # cut to about MAX_OUTPUT_LENGTH (escaping lengthens what is left)
    assert len(report.message) < 1500


def test_a_reason_of_invisible_characters_is_blank():
    api, _, alias = setup()
    report = force_release(alias, ACTOR, "\u200b\u200b")
    assert report.outcome is Outcome.REFUSED and api.calls == []
    assert clean_reason("\u200b\u202e\x00 ") == ""


def test_a_blank_reason_is_refused_before_any_call():
    api, _, alias = setup()
    assert force_release(alias, ACTOR, " \t\n").outcome is Outcome.REFUSED
    assert api.calls == [] and protocol.DEFAULT_ALIAS in api.services


def test_nothing_held_removes_nothing_and_says_so():
    api, _, alias = setup(holder=False)
    report = force_release(alias, ACTOR, "cleanup")
    assert report.outcome is Outcome.NO_LOCK and api.count("RemoveServicesFromReservation") == 0
    assert "nobody held it" in api.output[0]


def test_released_between_read_and_remove():
    api, _, alias = setup()
    # The holder releases just before our remove reaches the server.
    api.faults["RemoveServicesFromReservation"] = [lambda *args: api.services.clear() or False]
    report = force_release(alias, ACTOR, "stuck")
    assert report.outcome is Outcome.GONE_MEANWHILE and "released before the remove landed" in api.output[0]
    assert report.held is False


def test_a_remove_without_answer_is_reported_as_unknown_never_resent():
    api, _, alias = setup()

    def reset(*args):
        raise urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError())

    api.faults["RemoveServicesFromReservation"] = [reset]
    report = force_release(alias, ACTOR, "stuck")
    assert report.outcome is Outcome.UNKNOWN and "may still be applied" in report.message
    assert report.held is None and report.as_dict()["held"] is None  # nobody can tell yet
    assert api.count("RemoveServicesFromReservation") == 1
    assert "Check with Lock Status" in api.output[0]


def test_a_refused_remove_fails_and_is_still_recorded():
    api, _, alias = setup()

    def refuse(*args):
        raise api_error("You do not have permission to remove services")

    api.faults["RemoveServicesFromReservation"] = [refuse]
    report = force_release(alias, ACTOR, "stuck")
    assert report.outcome is Outcome.FAILED and "refused" in report.message
    assert "and failed" in api.output[0]


def test_output_that_cannot_be_written_is_said():
    api, _, alias = setup()

    def refuse(*args):
        raise api_error("Internal error")

    api.faults["WriteMessageToReservationOutput"] = [refuse]
    report = force_release(alias, ACTOR, "stuck")
    assert report.outcome is Outcome.RELEASED and report.output_written is False
    assert "could not write this to the reservation output" in report.message


def test_ended_and_unknown_reservations():
    api, _, alias = setup()
    api.ended = True
    assert lock_status(alias).outcome is Outcome.RESERVATION_ENDED
    assert force_release(alias, ACTOR, "x").outcome is Outcome.RESERVATION_ENDED
    assert protocol.DEFAULT_ALIAS in api.services
    other = LockAlias(api, "nope")
    assert lock_status(other).outcome is Outcome.RESERVATION_MISSING


def test_status_watch_measures_the_same_token_on_the_observers_clock():
    api, clock, alias = setup()
    report = lock_status(alias, watch=5.0, clock=clock, sleep=clock.sleep)
    assert report.outcome is Outcome.HELD and report.seen_held_for == 5.0 and report.holder_changes == 0

    def hand_over(method):
        if method == "GetReservationDetails" and clock.now >= 1003.0 + 5.0:
            other_holds(api, "Router B driver@exec-03:99:0badc0de")

    api.on_call = hand_over
    report = lock_status(alias, watch=5.0, clock=clock, sleep=clock.sleep)
    assert report.holder.token == "Router B driver@exec-03:99:0badc0de"
    assert report.holder_changes == 1 and report.seen_held_for == 2.0


def test_one_read_says_held_now_only():
    _, _, alias = setup()
    report = lock_status(alias)
    assert report.seen_held_for == 0.0 and "held now" in report.message


def test_reasons_are_one_line_and_bounded():
    assert clean_reason("a\r\nb\x00c") == "a bc"
    assert len(clean_reason("x" * 10_000)) == MAX_REASON_LENGTH
    assert clean_reason(None) == ""
