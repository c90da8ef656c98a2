"""Waiting in line (the advisory ticket queue) and the deadlocks waiters see: tickets, records, cycles."""
