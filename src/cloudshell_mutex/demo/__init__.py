"""``make demo``: two drivers race to rewire one sandbox, first without the lock, then with it."""
