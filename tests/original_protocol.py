"""Test peer: the original snippet, both variants, defects kept (see :mod:`cloudshell_mutex.bench.original`).

It lives in the package because the benchmark (``make bench``) runs it too; the tests import it from here.
"""

from __future__ import annotations

from cloudshell_mutex.bench.original import OriginalMutex

__all__ = ["OriginalMutex"]
