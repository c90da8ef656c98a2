"""Property tests of the handle parser (Hypothesis): every handle round-trips; any damage is refused."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")  # a dev dependency; not in the Python 3.9 unit environment
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cloudshell_mutex.lock.errors import MutexHandleError  # noqa: E402
from cloudshell_mutex.lock.holder import make_token  # noqa: E402
from cloudshell_mutex.lock.mutex.handle import HandleInfo, make_handle, parse_handle  # noqa: E402

texts = st.text(min_size=1, max_size=40).filter(lambda s: s.strip())
infos = st.builds(
    HandleInfo,
    reservation_id=texts,
    alias=texts,
    model=texts,
    token=texts.map(make_token),
    lease=st.floats(min_value=0, max_value=1e6, allow_nan=False),
)


@given(infos)
def test_every_exported_handle_parses_back(info):
    assert parse_handle(make_handle(info)) == info


@given(infos, st.data())
def test_a_truncated_handle_is_refused(info, data):
    handle = make_handle(info)
    cut = data.draw(st.integers(min_value=0, max_value=len(handle) - 1))
    with pytest.raises(MutexHandleError):
        parse_handle(handle[:cut])


@given(infos, st.data())
def test_a_changed_character_is_refused(info, data):
    handle = make_handle(info)
    index = data.draw(st.integers(min_value=0, max_value=len(handle) - 1))
    replacement = data.draw(st.characters().filter(lambda c: c != handle[index]))
    with pytest.raises(MutexHandleError):
        parse_handle(handle[:index] + replacement + handle[index + 1 :])


@given(st.text(max_size=300))
def test_arbitrary_text_never_parses_or_crashes(text):
    with pytest.raises(MutexHandleError):
        parse_handle(text)
