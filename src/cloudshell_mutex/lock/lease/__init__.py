"""Liveness: leases and heartbeats, a waiter's judgement of a holder, and the one breaker of stale holders."""
