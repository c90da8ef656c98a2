"""ReservationMutex and the steps of its acquire and release; passing a hold between lock objects."""
