"""What the installed cloudshell-automation-api can do.

The oldest clients the dependency range allows (before 2024.1) neither re-send a dropped request, nor log on
again after a 401, nor take a socket timeout. Tests of behaviour that exists only with those features say so
(markers ``client_resend`` and ``client_timeout``) and are skipped there.
"""

from __future__ import annotations

import inspect

from cloudshell.api.cloudshell_api import CloudShellAPISession

_SESSION_PARAMETERS = inspect.signature(CloudShellAPISession.__init__).parameters
#: The client re-sends dropped requests (and logs on again after a 401).
CLIENT_RESENDS = "max_attempts" in _SESSION_PARAMETERS
#: The client hands keyword arguments such as ``timeout`` to urllib3.
CLIENT_TAKES_TIMEOUT = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _SESSION_PARAMETERS.values())
