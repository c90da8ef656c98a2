"""A probe stopped by Ctrl-C at any of its calls, before the call is sent or after it was answered (the answer
never seen), the calls of its clean-up included, leaves nothing behind and stays within its bound on calls."""

from __future__ import annotations

import time

import pytest
from probe_support import probe
from test_probe import assert_nothing_left

pytestmark = pytest.mark.integration

#: A small run: a short wait for changes to show (the clean-up waits that long after a remove until reads have
#: been measured), a small race.
SMALL = dict(racers=2, rounds=2, max_wait=0.5)


@pytest.mark.parametrize("given", [False, True], ids=["own sandbox", "given sandbox"])
def test_a_probe_interrupted_at_any_call_leaves_nothing_behind(emulator, given: bool):
    emu = emulator(details_cache_seconds=0)  # nothing to wait for: each run is short
    settings = dict(SMALL, reservation_id=emu.create_reservation("in use") if given else None)
    clean, bound = probe(emu, **settings)
    total = clean.run().log.count()
    started, runs = time.monotonic(), 0
    for number in range(1, total + 1):
        for phase in ("before", "after"):

            def interrupt(n: int, method: str, when: str, number: int = number, phase: str = phase) -> None:
                if (n, when) == (number, phase):
                    raise KeyboardInterrupt

            interrupted, _ = probe(emu, hook=interrupt, **settings)
            with pytest.raises(KeyboardInterrupt):
                interrupted.run()
            runs += 1
            seen = interrupted.seen
            assert seen.interrupted
            assert_nothing_left(emu, seen)
            assert seen.log.count() <= bound.max_calls(), (number, phase)
    took = time.monotonic() - started
    print(f"\n{runs} interrupted runs ({total} calls each when not interrupted) in {took:.1f} s")
