"""Fixtures of the probe's tests: an emulator with our package."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from cloudshell_mutex.emulator import Emulator


@pytest.fixture
def emulator(cloudshell_emulator_factory, our_model_package) -> Callable[..., Emulator]:
    """``(**Emulator kwargs) -> Emulator`` with our package imported and a 0.3 s details cache."""

    def make(**kwargs: Any) -> Emulator:
        kwargs.setdefault("packages", [our_model_package])
        kwargs.setdefault("details_cache_seconds", 0.3)
        return cloudshell_emulator_factory(**kwargs)

    return make
