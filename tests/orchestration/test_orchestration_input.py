"""Bad input to the orchestration helpers (no server needed: runs in the Python 3.9 unit run too)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloudshell_mutex.orchestration import report_left_behind_lock, sandbox_mutex, with_sandbox_mutex


@pytest.mark.parametrize(
    "thing", [None, SimpleNamespace(id="r"), SimpleNamespace(automation_api=object(), id="")]
)
def test_something_that_is_not_a_sandbox_is_refused(thing):
    with pytest.raises(TypeError, match=r"\.automation_api .* and \.id"), sandbox_mutex(thing):
        pass


def test_the_wrapper_refuses_a_non_sandbox_when_the_step_runs():
    ran = []
    step = with_sandbox_mutex(lambda sandbox, components: ran.append(1))
    with pytest.raises(TypeError, match="Sandbox"):
        step(object(), None)
    assert ran == []


def test_the_teardown_report_refuses_a_non_sandbox():
    with pytest.raises(TypeError, match="Sandbox"):
        report_left_behind_lock(SimpleNamespace(automation_api=None, id="r"))


def test_options_given_positionally_to_the_wrapper_are_refused():
    with pytest.raises(TypeError, match=r"by keyword: @with_sandbox_mutex\(owner=...\)"):
        with_sandbox_mutex("Setup")
