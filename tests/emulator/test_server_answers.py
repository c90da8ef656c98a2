"""The answers a real server may give to the site probe's questions, as emulator modes (docs/emulator.md):
each mode's both answers, through the real client over HTTP."""

from __future__ import annotations

import threading
from typing import List

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue
from cloudshell.api.common_cloudshell_api import CloudShellAPIError

from cloudshell_mutex.emulator import Emulator
from cloudshell_mutex.emulator.messages import render
from cloudshell_mutex.lock.protocol import ATTR_OWNER, SERVICE_MODEL

pytestmark = pytest.mark.integration


@pytest.fixture
def emu(cloudshell_emulator: Emulator) -> Emulator:
    cloudshell_emulator.add_service_model(SERVICE_MODEL, {ATTR_OWNER: ""})
    return cloudshell_emulator


def add(api, rid: str, alias: str, owner: str = "") -> None:
    api.AddServiceToReservation(rid, SERVICE_MODEL, alias, [AttributeNameValue(ATTR_OWNER, owner)])


def aliases(emu: Emulator, rid: str) -> List[str]:
    return [service["alias"] for service in emu.control.reservation(rid)["services"]]


def race(emu: Emulator, rid: str, racers: int) -> List[str]:
    """``racers`` sessions add one alias at once; what each was told."""
    sessions = [emu.session(max_attempts=1) for _ in range(racers)]
    barrier = threading.Barrier(racers)
    answers = [""] * racers

    def racer(index: int) -> None:
        barrier.wait(timeout=10)
        try:
            add(sessions[index], rid, "RACE", f"racer {index}")
            answers[index] = "ok"
        except CloudShellAPIError as error:
            answers[index] = error.message

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return answers


@pytest.mark.client_resend  # max_attempts: one request per add
def test_a_racy_add_lets_overlapping_adds_of_one_alias_all_succeed(emu: Emulator):
    rid = emu.create_reservation()
    assert race(emu, rid, 3).count("ok") == 1  # atomic, the default
    emu.session().RemoveServicesFromReservation(rid, ["RACE"])

    assert emu.control.configure(add_atomicity="racy")["add_atomicity"] == "racy"
    assert race(emu, rid, 3) == ["ok"] * 3
    [stored] = emu.control.reservation(rid)["services"]  # one service: the last insert's
    added = [e for e in emu.control.events(rid) if e["op"] == "service_added"][-3:]
    assert stored["attributes"][ATTR_OWNER] == added[-1]["attributes"][ATTR_OWNER]
    with pytest.raises(CloudShellAPIError, match="already exists"):  # a later add still sees the alias
        add(emu.session(), rid, "RACE")


@pytest.mark.parametrize(
    "mode, fails, removed",
    [("refuse_all", True, False), ("remove_found", True, True), ("ignore", False, True)],
)
def test_a_remove_that_names_a_missing_alias(emu: Emulator, mode: str, fails: bool, removed: bool):
    emu.control.configure(remove_missing=mode)
    api, rid = emu.session(), emu.create_reservation()
    add(api, rid, "FOUND")
    if fails:
        with pytest.raises(CloudShellAPIError) as caught:
            api.RemoveServicesFromReservation(rid, ["FOUND", "MISSING"])
        assert caught.value.message == render("service_not_found", alias="MISSING", reservation_id=rid)
    else:
        api.RemoveServicesFromReservation(rid, ["FOUND", "MISSING"])
    assert aliases(emu, rid) == ([] if removed else ["FOUND"])


@pytest.mark.parametrize("mode", ["honored", "ignored"])
def test_a_disable_cache_read_is_fresh_unless_the_server_ignores_it(cloudshell_emulator_factory, mode: str):
    emu = cloudshell_emulator_factory(disable_cache=mode, details_cache_seconds=30)
    emu.add_service_model(SERVICE_MODEL, {ATTR_OWNER: ""})
    api, rid = emu.session(), emu.create_reservation()
    api.GetReservationDetails(rid)  # the cached snapshot: no service yet
    add(api, rid, "SEEN")
    fresh = [
        s.Alias for s in api.GetReservationDetails(rid, disableCache=True).ReservationDescription.Services
    ]
    cached = [s.Alias for s in api.GetReservationDetails(rid).ReservationDescription.Services]
    assert cached == []
    assert fresh == (["SEEN"] if mode == "honored" else [])


def test_aliases_with_a_tilde_are_accepted_or_refused(emu: Emulator):
    api, rid = emu.session(), emu.create_reservation()
    add(api, rid, "P~r1")
    emu.control.configure(tilde_aliases="refused")
    with pytest.raises(CloudShellAPIError) as caught:
        add(api, rid, "P~r2")
    assert (caught.value.code, caught.value.message) == ("100", render("alias_not_allowed", alias="P~r2"))
    add(api, rid, "P")  # without a tilde: as before
    assert aliases(emu, rid) == ["P~r1", "P"]


def test_user_details_list_the_groups_with_roles_or_omit_them(emu: Emulator):
    emu.add_user("dana", "pw", domain="Sales", role="DomainAdmin")
    api = emu.session()
    [group] = api.GetUserDetails("dana").Groups
    assert group.GroupRole == "DomainAdmin" and [d.Name for d in group.TestShellDomains] == ["Sales"]
    emu.control.configure(user_groups="omitted")
    details = api.GetUserDetails("dana")
    assert not details.Groups and details.IsAdmin is False
