"""CohortMutex: the processes of one execution server pass the server lock among themselves, with no call."""
