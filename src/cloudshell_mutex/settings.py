"""Connection settings of the commands that talk to a CloudShell server (install, status, release).

Each setting is taken from the first source that has it: its command-line flag, its environment variable,
the ``install:`` block of shellfoundry's ``cloudshell_config.yml``, its default. This module holds that rule
once; each command names its settings, variables and defaults (``install`` reaches the Quali API,
``status``/``release`` the Automation API, on different ports).
"""

from __future__ import annotations

import argparse
from typing import Collection, Dict, Mapping, Optional


def pick_values(
    args: argparse.Namespace,
    env_vars: Mapping[str, str],
    environ: Mapping[str, str],
    config: Mapping[str, object],
    defaults: Mapping[str, str],
    config_keys: Optional[Collection[str]] = None,
) -> Dict[str, str]:
    """Each setting of ``env_vars`` (setting -> variable) from its flag, variable, config entry or default.

    ``config_keys`` limits what the config file may set (None: every setting). An empty variable counts as
    unset; a setting found nowhere is left out.
    """
    values: Dict[str, str] = {}
    for name, variable in env_vars.items():
        flag = getattr(args, name, None)
        if flag is not None:
            values[name] = str(flag)
        elif environ.get(variable):
            values[name] = environ[variable]
        elif (config_keys is None or name in config_keys) and config.get(name) is not None:
            values[name] = str(config[name])
        elif name in defaults:
            values[name] = defaults[name]
    return values


def parse_port(value: str) -> Optional[int]:
    """``value`` as a TCP port number, or None when it is not one."""
    try:
        port = int(value)
    except ValueError:
        return None
    return port if 0 < port < 65536 else None
