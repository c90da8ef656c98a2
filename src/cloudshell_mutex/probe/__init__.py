"""The site probe: whether a CloudShell server behaves as the lock assumes, and which settings fit it.

``cloudshell-mutex probe`` (:mod:`.command`) runs :class:`~.run.Probe`, which asks each question with a check
of :mod:`.checks` (the contract suite, ``make test-live``, runs the same checks) in a sandbox of its own, and
:func:`~.verdicts.judge` says what each answer means for the lock. docs/deploy.md says when to run it and what
to do with each verdict.
"""

from __future__ import annotations

from .run import Probe, ProbeSettings
from .verdicts import ProbeReport, judge

__all__ = ["Probe", "ProbeReport", "ProbeSettings", "judge"]
