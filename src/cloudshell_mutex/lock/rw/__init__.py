"""ReservationRWLock: many readers or one writer, built from mutexes on the name and derived aliases."""
