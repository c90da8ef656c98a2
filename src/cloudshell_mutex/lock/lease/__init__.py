"""lease."""
