"""The lock in a sandbox of a domain other than Global: what it needs there (add, read, remove, output).

Against a real server this needs ``CLOUDSHELL_TEST_OTHER_DOMAIN`` (a domain the test user may log on to);
without it the test is skipped. What a session of one domain may do with another domain's sandboxes is not
asserted: it is not documented, and the lock always logs on to the sandbox's own domain.
"""

from __future__ import annotations

import pytest
from cloudshell.api.cloudshell_api import CloudShellAPISession
from contract_support import new_reservation

from cloudshell_mutex import ReservationMutex, protocol

pytestmark = pytest.mark.integration


def test_the_lock_works_in_a_sandbox_of_another_domain(target):
    if not target.other_domain:
        pytest.skip("set CLOUDSHELL_TEST_OTHER_DOMAIN to a domain other than Global the user may log on to")
    api = CloudShellAPISession(
        target.host, target.user, target.password, target.other_domain, port=target.api_port
    )
    reservation_id = new_reservation(api, target, "cloudshell-mutex contract: other domain")
    try:
        details = api.GetReservationDetails(reservation_id, disableCache=True).ReservationDescription
        assert details.DomainName == target.other_domain  # where the CLI's Force Release rule looks
        lock = ReservationMutex(api, reservation_id, owner="contract other domain", timeout=30)
        with lock:
            holder = lock.holder()
            assert holder is not None and holder.token == lock.token
            assert holder.alias == protocol.DEFAULT_ALIAS
            api.WriteMessageToReservationOutput(reservation_id, "cloudshell-mutex contract: other domain")
            assert ReservationMutex(api, reservation_id, owner="second").acquire(blocking=False) is False
        assert lock.holder() is None
    finally:
        api.EndReservation(reservation_id)
