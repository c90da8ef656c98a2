"""``make bench``: ReservationMutex against the original snippet, measured on the emulator's event log.

Contenders (:mod:`.contenders`) run as separate OS processes against one embedded emulator
(:mod:`.runner`, :mod:`.worker`) in the configurations of a plan (:mod:`.plans`); the figures come from
the server's event log and call counts (:mod:`.metrics`), are summarised over the repeats
(:mod:`.summary`), judged against the default lock's targets (:mod:`.verdicts`) and go into
``docs/benchmarks.md`` with plots (:mod:`.report`). Run it with ``python -m cloudshell_mutex.bench``
(``--help``). It lives in the package, like the demo, because it drives the installed lock and emulator
as a user would and must run from a fresh clone with nothing but ``make bench``; matplotlib (plots only)
comes with the ``dev`` extra.
"""

from __future__ import annotations

from .contenders import BASELINE, CONTENDERS, Contender, Seat
from .plans import DECIDE, FULL, PLANS, QUICK, Cell, Plan

__all__ = ["BASELINE", "CONTENDERS", "DECIDE", "FULL", "PLANS", "QUICK", "Cell", "Contender", "Plan", "Seat"]
