"""The server primitive the protocol rests on: a service alias is unique per sandbox, and the add is atomic.

Asserts only what the facts file calls documented or real: code "100" with "already exists" on a
duplicate and fresh reads that show a change at once; plus that removing a missing alias fails, which
the lock relies on (its wording is not documented, so it is not checked).
"""

from __future__ import annotations

from collections import Counter

import pytest
from cloudshell.api.common_cloudshell_api import CloudShellAPIError
from contract_support import add_mutex, attributes, is_contention, race_size, race_worker, run_processes

from cloudshell_mutex import protocol

pytestmark = [pytest.mark.integration, pytest.mark.contract]


def test_adding_an_existing_alias_fails_with_code_100_already_exists(sandbox, unique) -> None:
    alias = unique("dup")
    add_mutex(sandbox.api, sandbox.id, alias, "first")
    with pytest.raises(CloudShellAPIError) as caught:
        add_mutex(sandbox.api, sandbox.id, alias, "second")
    assert caught.value.code == protocol.CONTENTION_ERROR_CODE
    assert protocol.CONTENTION_MESSAGE_FRAGMENT in caught.value.message
    assert is_contention(caught.value)
    # The loser changed nothing: the first add's owner is still there.
    assert attributes(sandbox.services()[alias])[protocol.ATTR_OWNER] == "first"


def test_add_is_seen_by_a_fresh_read_and_remove_is_too(sandbox, unique) -> None:
    alias = unique("seen")
    before = sandbox.services()
    assert alias not in before

    add_mutex(sandbox.api, sandbox.id, alias, "contract owner")
    service = sandbox.services()[alias]
    assert service.Alias == alias
    assert service.ServiceName == protocol.SERVICE_MODEL
    assert attributes(service)[protocol.ATTR_OWNER] == "contract owner"

    sandbox.api.RemoveServicesFromReservation(sandbox.id, [alias])
    after = sandbox.services()
    assert alias not in after
    assert set(after) == set(before)


def test_removing_a_missing_alias_fails(sandbox, unique) -> None:
    """The lock reads a "not found" remove as "the lock was taken from us", so it must be an error.

    The facts file does not document this (the emulator's docs list it as its stricter choice), and
    the wording is not checked: a live failure here is a finding about the server, see docs/contract.md.
    """
    alias = unique("gone")
    add_mutex(sandbox.api, sandbox.id, alias, "contract owner")
    sandbox.api.RemoveServicesFromReservation(sandbox.id, [alias])
    with pytest.raises(CloudShellAPIError):
        sandbox.api.RemoveServicesFromReservation(sandbox.id, [alias])


def test_the_add_is_atomic_exactly_one_winner_per_round_across_processes(sandbox, unique) -> None:
    """M processes, each with its own session, add one alias per round at a barrier; K rounds.

    Exactly one add per round may succeed; every other one must answer the documented contention
    error. The winner each process reports must be the owner the server stored. Size with
    CLOUDSHELL_TEST_RACE_PROCESSES / CLOUDSHELL_TEST_RACE_ROUNDS for a live run.
    """
    processes, rounds = race_size()
    aliases = [unique(f"race{round_}") for round_ in range(rounds)]
    reports = run_processes(race_worker, [(sandbox.target, sandbox.id, aliases, i) for i in range(processes)])

    stored = sandbox.services()
    for round_, alias in enumerate(aliases):
        answers = [(r["index"], r["outcomes"][round_]) for r in reports]
        winners = [index for index, (kind, _, _) in answers if kind == "ok"]
        assert len(winners) == 1, f"round {round_}: {len(winners)} adds of {alias!r} succeeded: {answers}"
        losers = [(code, message) for _, (kind, code, message) in answers if kind != "ok"]
        unexpected = [
            answer
            for answer in losers
            if answer[0] != protocol.CONTENTION_ERROR_CODE
            or protocol.CONTENTION_MESSAGE_FRAGMENT not in answer[1]
        ]
        assert not unexpected, f"round {round_}: losers got other answers than contention: {unexpected}"
        assert attributes(stored[alias])[protocol.ATTR_OWNER] == f"racer {winners[0]}", f"round {round_}"
    wins = Counter(r["index"] for r in reports for outcome in r["outcomes"] if outcome[0] == "ok")
    print(
        f"\nadd race: {processes} processes x {rounds} rounds, wins per process {dict(sorted(wins.items()))}"
    )
