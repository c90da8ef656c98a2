"""Helpers of the probe's tests: a probe run against an emulator, made as the CLI makes it."""

from __future__ import annotations

from typing import Any, Tuple

from client_features import CLIENT_RESENDS
from cloudshell_mutex.emulator import Emulator
from cloudshell_mutex.probe import Probe, ProbeReport, ProbeSettings, judge
from cloudshell_mutex.probe.run import Observations

#: A short run: the emulator's cache is short too (the ``emulator`` fixture), so a run takes about a second.
QUICK = dict(max_wait=1.5, poll=0.1)


def client_options(**options: Any) -> dict:
    """One request per call, as the CLI's sessions (where the client takes it)."""
    return {"max_attempts": 1, **options} if CLIENT_RESENDS else options


def probe(emu: Emulator, hook=None, session_options=None, **settings: Any) -> Tuple[Probe, ProbeSettings]:
    """A probe of ``emu`` (not run yet) as the admin."""
    chosen = ProbeSettings(**{**QUICK, **settings})
    options = client_options(**(session_options or {}))
    return Probe(lambda: emu.session(**options), chosen, emu.admin_user, emu.admin_domain, hook=hook), chosen


def run(emu: Emulator, **settings: Any) -> Tuple[ProbeReport, Observations]:
    """Run a probe of ``emu``; its report and what it saw."""
    made, chosen = probe(emu, **settings)
    seen = made.run()
    return judge(seen, chosen, f"127.0.0.1:{emu.port}"), seen
