"""queue."""
