"""A CloudShell Automation API and Quali API emulator that the unmodified PyPI clients talk to.

It emulates documented and observed behaviour of the real server (see docs/emulator.md); it is not a
CloudShell server. Start it with ``cloudshell-mutex emulator``, from tests with the pytest plugin
``cloudshell_mutex.testing``, or in code::

    with Emulator(port=0, quali_port=0) as emu:
        api = emu.session()
"""

from __future__ import annotations

from .control import EmulatorControl, EmulatorControlError
from .faults import DROP_AFTER_COMMIT, ERROR_BEFORE_COMMIT
from .instance import Emulator

__all__ = ["DROP_AFTER_COMMIT", "ERROR_BEFORE_COMMIT", "Emulator", "EmulatorControl", "EmulatorControlError"]
