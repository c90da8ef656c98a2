"""mutex."""
