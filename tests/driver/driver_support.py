"""Helpers of the driver tests."""

from __future__ import annotations

from cloudshell_mutex.demo.contexts import resource_command_context


def context_for(emu, rid, resource="Router A", remote=False, token=None):
    """shell-core's ResourceCommandContext for ``resource`` in ``rid`` on ``emu``, as CloudShell passes it."""
    token = token or emu.issue_token()
    return resource_command_context(emu.host, emu.port, token, rid, resource, remote=remote)
