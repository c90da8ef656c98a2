"""The original snippet (QualiSystemsLab/Reservation-Mutex-Lock), both variants, defects kept.

**Do not lock with this class**: it is the code this project replaces, kept so that tests and the
benchmark (``make bench``) can run it next to ReservationMutex against the emulator. Reimplemented
from its README:

* v1: ``AddServiceToReservation(resid, 'Mutex Service', name, [])`` - no owner at all;
* v2: the add sets ``Mutex Owner`` to a unique name, then reads ``GetReservationDetails(resid)`` -
  *cached* - and raises "Lost race for mutex" if the owner of alias ``'MUTEX'`` differs.

Defects kept on purpose: every exception counts as "busy"; a fixed random sleep between tries
(``randint(2, 5)`` seconds by default; ``sleep_range`` shrinks it for tests); after ``attempts``
failures it carries on **without** the lock; ``__exit__`` always removes the alias, held or not.
The only additions are counters that tests read (``acquired``, ``gave_up``, ``failures``) and the
``sleep`` function its waits go through (``time.sleep`` by default; the benchmark passes one that ends
the run at the end of its measuring window); they do not change the behaviour.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Optional, Tuple

from cloudshell.api.cloudshell_api import AttributeNameValue

from cloudshell_mutex import protocol


class OriginalMutex:
    """The original ``Mutex`` class (variant ``"v1"`` or ``"v2"``)."""

    def __init__(
        self,
        api: Any,
        resid: str,
        variant: str = "v1",
        my_unique_name: str = "",
        mutex_name: str = protocol.DEFAULT_ALIAS,
        logger: Any = None,
        attempts: int = 100,
        sleep_range: Tuple[float, float] = (2, 5),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if variant not in ("v1", "v2"):
            raise ValueError("variant must be 'v1' or 'v2'")
        self.api = api
        self.resid = resid
        self.variant = variant
        self.my_unique_name = my_unique_name
        self.mutex_name = mutex_name
        self.logger = logger
        self.attempts = attempts
        self.sleep_range = sleep_range
        self.sleep = sleep
        self.acquired = False
        self.gave_up = False
        self.failures = 0
        self._rng = random.Random()

    def _sleep(self) -> None:
        low, high = self.sleep_range
        if isinstance(low, int) and isinstance(high, int):
            self.sleep(self._rng.randint(low, high))  # the original: sleep(randint(2, 5))
        else:
            self.sleep(self._rng.uniform(low, high))

    def _try_once(self) -> None:
        if self.variant == "v1":
            self.api.AddServiceToReservation(self.resid, protocol.SERVICE_MODEL, self.mutex_name, [])
            return
        self.api.AddServiceToReservation(
            self.resid,
            protocol.SERVICE_MODEL,
            self.mutex_name,
            [AttributeNameValue(protocol.ATTR_OWNER, self.my_unique_name)],
        )
        # The original reads the *cached* details and checks the hard-coded alias 'MUTEX'.
        for svc in self.api.GetReservationDetails(self.resid).ReservationDescription.Services:
            if svc.Alias == "MUTEX":
                for a in svc.Attributes:
                    if a.Name == protocol.ATTR_OWNER and a.Value != self.my_unique_name:
                        raise Exception(
                            f"Lost race for mutex -- {self.mutex_name} owned by {a.Value} "
                            f"instead of {self.my_unique_name}"
                        )

    def __enter__(self) -> OriginalMutex:
        t0 = time.time()
        for _ in range(self.attempts):
            try:
                self._try_once()
                self.acquired = True
                if self.logger:
                    self.logger.info("Got mutex after %d seconds" % (time.time() - t0))  # noqa: UP031
                break
            except Exception as e:  # the defect: every exception means "busy"
                self.failures += 1
                if self.logger:
                    self.logger.info("Failed to add mutex service: %s; sleeping 2-5 seconds" % str(e))  # noqa: UP031
                self._sleep()
        else:
            self.gave_up = True  # the defect: carry on without the lock
            if self.logger:
                self.logger.info("Waited over 200 seconds without getting the mutex; continuing without it")
        return self

    def __exit__(self, exc_type: Optional[type], exc_val: Any, exc_tb: Any) -> None:
        # The defect: removes the alias whoever holds it.
        self.api.RemoveServicesFromReservation(self.resid, [self.mutex_name])
