"""``cloudshell-mutex probe`` against the emulator in each of its answers, with the real client over HTTP:
each fact reported as the emulator answers it, nothing left behind, a bounded number of calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from probe_support import probe, run

from cloudshell_mutex import ReservationMutex, cli
from cloudshell_mutex.probe.run import PROBE_PREFIX
from cloudshell_mutex.probe.verdicts import NOT_SAFE, SAFE, SETTING, UNMEASURED, recommended_lifetime

pytestmark = pytest.mark.integration


def facts(report):
    return {fact.key: fact for fact in report.facts}


def assert_nothing_left(emu, seen) -> None:
    """Every sandbox the probe made is ended and empty; no service of the run anywhere."""
    assert not seen.left_behind
    for rid, reservation in emu.runtime.state.reservations.items():
        left = [alias for alias in reservation.services if alias.upper().startswith(PROBE_PREFIX.upper())]
        assert not left, f"{left} left in {rid}"
        if reservation.name.startswith("cloudshell-mutex probe"):
            assert reservation.ended_at is not None and not reservation.services


def assert_bounded(emu, seen, settings) -> None:
    made = sum(emu.control.call_counts().values())
    assert made == seen.log.count() <= settings.max_calls()


def test_a_server_that_behaves_as_the_lock_assumes_is_safe_and_left_as_it_was(emulator):
    emu = emulator()
    report, seen = run(emu)
    assert report.exit_code == 0, report.lines()
    assert {fact.verdict for fact in report.facts} == {SAFE}
    assert set(facts(report)) == {
        "model", "contention", "atomic", "fresh_read", "cached_read", "case", "remove", "tilde", "roles",
        "lifetime", "latency", "ended",
    }  # fmt: skip
    assert report.emulator() == {
        "add_atomicity": "atomic",
        "alias_case": "exact",
        "disable_cache": "honored",
        "details_cache_seconds": "1",
        "remove_missing": "refuse_all",
        "tilde_aliases": "accepted",
        "user_groups": "listed",
        "ended_reservations": "readable",
    }
    assert report.settings() == {}
    assert_nothing_left(emu, seen)
    assert_bounded(emu, seen, probe(emu)[1])
    text = "\n".join(report.lines())
    assert "Verdict: the lock is safe on this server" in text and "Nothing was left behind" in text
    print(f"\nclean probe: {seen.log.count()} calls in {seen.seconds:.1f} s")


#: (emulator modes, fact, verdict, what the fact's emulator setting must say)
VARIANTS = [
    ({"add_atomicity": "racy"}, "atomic", NOT_SAFE, {"add_atomicity": "racy"}),
    ({"alias_case": "insensitive"}, "case", SAFE, {"alias_case": "insensitive"}),
    ({"remove_missing": "remove_found"}, "remove", SAFE, {"remove_missing": "remove_found"}),
    ({"remove_missing": "ignore"}, "remove", SAFE, {"remove_missing": "ignore"}),
    (
        {"disable_cache": "ignored", "details_cache_seconds": 0.5},
        "fresh_read",
        SAFE,
        {"disable_cache": "ignored"},
    ),
    ({"tilde_aliases": "refused"}, "tilde", SETTING, {"tilde_aliases": "refused"}),
    ({"user_groups": "omitted"}, "roles", SAFE, {"user_groups": "omitted"}),
    ({"ended_reservations": "closed"}, "ended", SAFE, {"ended_reservations": "closed"}),
    ({"details_cache_seconds": 0}, "cached_read", SAFE, {"details_cache_seconds": "0"}),
]


@pytest.mark.parametrize("modes, key, verdict, emulator_setting", VARIANTS, ids=lambda v: str(v)[:40])
def test_each_answer_of_the_server_is_reported(emulator, modes, key, verdict, emulator_setting):
    emu = emulator(**modes)
    report, seen = run(emu)
    fact = facts(report)[key]
    assert fact.verdict == verdict, fact
    assert fact.emulator == emulator_setting
    others = [f for f in report.facts if f.key != key and f.verdict != SAFE]
    assert not others, others  # the other facts are measured right on this server too
    assert_nothing_left(emu, seen)


def test_fresh_reads_that_lag_beyond_a_second_are_not_safe(emulator):
    emu = emulator(disable_cache="ignored", details_cache_seconds=2.5)
    report, seen = run(emu)
    fact = facts(report)["fresh_read"]
    assert fact.verdict == NOT_SAFE and "not shown within 1.5 s" in fact.seen
    assert report.exit_code == 1
    assert_nothing_left(emu, seen)


def test_a_model_without_leases_or_without_mutex_owner_or_none(
    cloudshell_emulator_factory, original_package_zip, original_package_no_attributes_zip
):
    for packages, verdict, others in (
        ([original_package_zip], SETTING, True),
        ([original_package_no_attributes_zip], NOT_SAFE, False),
        ([], NOT_SAFE, False),
    ):
        emu = cloudshell_emulator_factory(packages=packages, details_cache_seconds=0.3)
        report, seen = run(emu)
        model = facts(report)["model"]
        assert model.verdict == verdict, model
        assert ("atomic" in facts(report)) is others  # without Mutex Owner nothing else is judged
        assert_nothing_left(emu, seen)
    assert model.settings == {"package": "cloudshell-mutex install"}


def test_a_proxy_that_holds_a_request_is_seen_in_the_latency_and_the_lifetime_that_covers_it(emulator):
    emu = emulator()
    emu.control.inject_fault("GetUserDetails", "spike", seconds=1.2)  # held 1.2 s before the server sees it
    report, _ = run(emu, request_lifetime=2)
    lifetime = facts(report)["lifetime"]
    assert "took 1.2 s" in lifetime.seen
    assert lifetime.verdict == SETTING and lifetime.settings == {"request_lifetime": "120"}
    assert facts(report)["latency"].verdict == SAFE  # a 60 s lease covers a 1.2 s call 16 times over
    assert recommended_lifetime(40) == 163  # a site whose calls take 40 s needs more than the default


@pytest.mark.client_timeout
def test_an_add_held_past_the_client_timeout_is_watched_until_it_lands_and_removed(emulator):
    emu = emulator()
    emu.control.inject_fault("AddServiceToReservation", "spike", seconds=1.0)  # the model check's first add
    report, seen = run(emu, session_options={"timeout": 0.5})
    assert facts(report)["model"].verdict == UNMEASURED  # its add got no answer
    assert seen.late_landings and 0.9 <= seen.late_landings[0] <= 1.5
    assert "landed" in facts(report)["lifetime"].seen
    assert report.exit_code == 4
    assert_nothing_left(emu, seen)


def test_in_a_given_sandbox_it_touches_only_its_own_services(emulator):
    emu = emulator()
    rid = emu.create_reservation("in use")
    holder = ReservationMutex(emu.session(), rid, owner="a driver")
    holder.acquire()
    report, seen = run(emu, reservation_id=rid)
    assert report.exit_code == 0 and "ended" not in facts(report)
    [service] = emu.control.reservation(rid)["services"]
    assert (service["alias"], service["attributes"]["Mutex Owner"]) == ("MUTEX", holder.token)
    assert emu.control.reservation(rid)["status"] == "Started"
    added = {e["alias"] for e in emu.control.events(rid) if e["op"] == "service_added"} - {"MUTEX"}
    assert added and all(a.upper().startswith(PROBE_PREFIX.upper()) for a in added)
    assert any(f"cloudshell-mutex probe {seen.run}" in line for line in emu.control.output(rid))
    holder.release()
    assert_nothing_left(emu, seen)


def test_the_command_prints_the_table_or_json_and_says_by_its_exit_code(emulator, capsys, monkeypatch):
    emu = emulator(alias_case="insensitive", admin_password="Probe-S3cret-pw")
    monkeypatch.setenv("CLOUDSHELL_PASSWORD", emu.admin_password)
    base = ["probe", "--host", "127.0.0.1", "--api-port", str(emu.port), "--max-wait", "1.5"]
    assert cli.main(base) == 0
    out = capsys.readouterr().out
    assert "Letter case of aliases" in out and "--alias-case insensitive" in out and "Verdict:" in out
    assert cli.main([*base, "--json", "--request-lifetime", "5"]) == 3
    document = json.loads(capsys.readouterr().out)
    assert document["verdict"] == SETTING and document["settings"] == {"request_lifetime": "120"}
    assert document["calls"] <= 200 and document["left_behind"] == []
    assert emu.admin_password not in out
    monkeypatch.setenv("CLOUDSHELL_PASSWORD", "wrong")
    assert cli.main(base) == 7  # logon refused, before anything is created
    assert cli.main([*base, "--racers", "1"]) == 2


def test_the_docs_state_the_bound_on_calls():
    from cloudshell_mutex.probe import ProbeSettings

    deploy = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert f"at most {ProbeSettings().max_calls()} calls" in deploy
    assert f"at most {ProbeSettings(reservation_id='x').max_calls()} calls" in deploy


def test_a_sandbox_given_that_has_ended_or_does_not_exist_is_refused_before_anything_is_added(emulator):
    from cloudshell_mutex.probe.run import ProbeAborted

    emu = emulator()
    ended = emu.create_reservation("over")
    emu.session().EndReservation(ended)
    for rid, words in ((ended, "has ended"), ("0b9c3d1e-0000-4000-8000-000000000000", "cannot be probed")):
        made, _ = probe(emu, reservation_id=rid)
        with pytest.raises(ProbeAborted, match=words):
            made.run()
        assert not [e for e in emu.control.events() if e["op"] == "service_added"]


def test_the_command_says_when_the_server_cannot_be_reached(capsys):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: every connection is refused
        port = sock.getsockname()[1]
        code = cli.main(["probe", "--host", "127.0.0.1", "--api-port", str(port), "--password", "x"])
    assert code == 6 and "cannot connect" in capsys.readouterr().err


def test_every_fact_is_reported_once_and_an_unmeasured_one_says_why():
    from cloudshell_mutex.probe.run import Observations, ProbeSettings
    from cloudshell_mutex.probe.verdicts import judge

    seen = Observations(run="00000000", failures={"model": "ReadTimeoutError: timed out"})
    report = judge(seen, ProbeSettings(), "nowhere")
    keys = [fact.key for fact in report.facts]
    assert len(keys) == len(set(keys)) and keys[0] == "model"
    assert report.facts[0].verdict == UNMEASURED and "timed out" in report.facts[0].seen
    assert report.exit_code == 4
