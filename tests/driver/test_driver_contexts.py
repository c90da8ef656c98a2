"""Which contexts have a reservation lock (no server needed: runs in the Python 3.9 unit run too)."""

from __future__ import annotations

import pytest

from cloudshell_mutex import MutexUsageError
from cloudshell_mutex.demo.contexts import autoload_context, resource_command_context
from cloudshell_mutex.driver import ReservationMutexMixin, context_reservation


def test_reservation_of_a_command_context_and_of_a_remote_command_context():
    local = resource_command_context("cs", 8029, "t0ken", "res-1", "Router A")
    remote = resource_command_context("cs", 8029, "t0ken", "res-2", "Port 3", remote=True)
    assert context_reservation(local).reservation_id == "res-1"
    assert context_reservation(remote).reservation_id == "res-2"


@pytest.mark.parametrize("reservation_id", ["", "  ", None])
def test_a_context_with_an_empty_reservation_is_refused(reservation_id):
    context = resource_command_context("cs", 8029, "t0ken", "res-1", "Router A")
    context.reservation.reservation_id = reservation_id
    with pytest.raises(MutexUsageError, match="belongs to no reservation"):
        context_reservation(context)


def test_autoload_is_refused_and_the_message_names_the_context_and_never_the_token():
    context = autoload_context("cs", 8029, "s3cret-t0ken", "Router A")
    with pytest.raises(MutexUsageError) as caught:
        ReservationMutexMixin().reservation_mutex(context)
    assert "AutoLoadCommandContext" in str(caught.value)
    assert "get_inventory" in str(caught.value)
    assert "s3cret-t0ken" not in str(caught.value)


@pytest.mark.parametrize("port", ["0", "70000", "eighty"])
def test_an_impossible_api_port_is_refused_before_any_connection(port):
    context = resource_command_context("cs", 8029, "t0ken", "res-1", "Router A")
    context.connectivity.cloudshell_api_port = port
    with pytest.raises(MutexUsageError, match="cloudshell_api_port"):
        ReservationMutexMixin().reservation_mutex(context)


def test_missing_connectivity_is_refused():
    context = resource_command_context("cs", 8029, "", "res-1", "Router A")
    with pytest.raises(MutexUsageError, match="admin_auth_token"):
        ReservationMutexMixin().reservation_mutex(context)
