"""What an administrator does with a lock: its status, a force release on the record, every lock listed."""
