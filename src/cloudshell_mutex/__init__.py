"""cloudshell-mutex: a reservation lock for Quali CloudShell that never proceeds without the lock."""

from __future__ import annotations

__version__ = "0.1.0"
