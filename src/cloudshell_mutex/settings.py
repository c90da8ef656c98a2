"""Connection settings of the commands that talk to a CloudShell server: flags, ``CLOUDSHELL_*`` variables,
``cloudshell_config.yml``.

``install`` reaches the Quali API (port 9000); ``status`` and ``release`` reach the Automation API (port
8029): each command names its settings, but the rule is held here once. Each setting comes from its flag,
else its environment variable, else the ``install:`` block of a shellfoundry-style
``cloudshell_config.yml``, else the default. Every value is checked here, before any
request, and a bad one gets a message that names where it came from and what to write instead. No message
quotes a password: not the password setting, not a ``user:password@`` written into another setting, and not
shellfoundry's scrambled form of it.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import ipaddress
import json
import math
import os
import platform
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple
from urllib.parse import quote, quote_plus, urlsplit

import yaml

CONFIG_FILE_NAME = "cloudshell_config.yml"
CONFIG_SECTION = "install"
#: A cloudshell_config.yml is a few lines; anything much larger is not one.
MAX_CONFIG_BYTES = 64 * 1024

#: Setting -> environment variable.
ENV_VARS = {
    "host": "CLOUDSHELL_HOST",
    "port": "CLOUDSHELL_PORT",
    "username": "CLOUDSHELL_USERNAME",
    "password": "CLOUDSHELL_PASSWORD",
    "domain": "CLOUDSHELL_DOMAIN",
}
#: shellfoundry's defaults, except the password, which must be given.
DEFAULTS = {"host": "localhost", "port": "9000", "username": "admin", "domain": "Global"}

QUALI_API_PORT = 9000
#: The Automation API's port (CloudShellAPISession): the usual wrong answer to "which port?".
AUTOMATION_API_PORT = 8029

#: What to write, per setting, in messages that refuse a value.
_EXAMPLES = {
    "host": "cloudshell.example.com",
    "port": str(QUALI_API_PORT),
    "username": "admin",
    "password": "...",
    "domain": "Global",
}

_MASK = "********"
# user:password@ in a URL-like value (RFC 3986 userinfo), after an optional scheme. The password runs to
# the last @ before a space, since a hand-written one may hold : / or @ itself.
_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<user>[^\s:/@]*):(?P<secret>\S*)@")
# A DNS label: letters and digits (any script), with - or _ inside.
_HOST_LABEL_RE = re.compile(r"^[^\W_]([\w-]*[^\W_])?$")


class InstallError(Exception):
    """The package could not be imported; the message says why and never contains the password."""


@dataclass(frozen=True)
class InstallSettings:
    """Where and as whom to import which package."""

    host: str
    port: int
    username: str
    password: str = field(repr=False)
    domain: str
    package: Path
    timeout: float = 30.0

    @property
    def api_url(self) -> str:
        """The Quali API's base URL."""
        return f"http://{self.host}:{self.port}/API/"


def redact_userinfo(text: str) -> str:
    """``text`` with the password of every ``user:password@`` masked."""
    return _USERINFO_RE.sub(
        lambda match: f"{match.group('scheme') or ''}{match.group('user')}:{_MASK}@", text
    )


def shown(value: str) -> str:
    """A setting's value as messages may quote it: repr'd, with any ``user:password@`` masked."""
    return repr(redact_userinfo(value))


class _ConfigLoader(yaml.SafeLoader):
    """Reads every plain scalar as a string, except null.

    With YAML's other implicit types a password such as 0123, yes or 12:30 would reach the server as
    83, True or 750.
    """


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag == "tag:yaml.org,2002:null"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _refuse_anchors(text: str, path: Path) -> None:
    """Refuse YAML anchors and aliases before anything is built.

    An alias shares a node, so a few lines of nested aliases ("billion laughs") stand for billions of values;
    turning one into a string then takes forever and all the memory. A config never needs them.
    """
    for event in yaml.parse(text, Loader=_ConfigLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            mark = event.start_mark
            raise InstallError(
                f"{path}: YAML anchors and aliases (& and *) are not supported (line {mark.line + 1}, "
                f"column {mark.column + 1}); write each value out"
            )


def load_config(path: Path) -> Dict[str, Any]:
    """The ``install:`` block of a cloudshell_config.yml (empty when the file has none)."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise InstallError(
                f"{path}: {size} bytes is too large for a cloudshell_config.yml "
                f"(at most {MAX_CONFIG_BYTES}); is this the right file?"
            )
        text = path.read_text(encoding="utf-8")
        _refuse_anchors(text, path)
        document = yaml.load(text, Loader=_ConfigLoader)  # a SafeLoader
    except FileNotFoundError:
        raise InstallError(f"{path}: not found") from None
    except OSError as error:
        raise InstallError(f"{path}: cannot be read: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise InstallError(f"{path}: not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    except yaml.YAMLError as error:
        # Only the position and the problem: YAML's own message quotes the line, which may hold the password.
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise InstallError(f"{path}: not valid YAML{where}: {problem}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise InstallError(f"{path}: expected a mapping with an {CONFIG_SECTION}: block")
    section = document.get(CONFIG_SECTION) or {}
    if not isinstance(section, dict):
        raise InstallError(f"{path}: {CONFIG_SECTION}: must be a mapping of host, port, username, ...")
    for name in ENV_VARS:
        value = section.get(name)
        if value is not None and not isinstance(value, str):
            kind = "a list" if isinstance(value, list) else "a mapping"
            raise InstallError(
                f"{path}: {CONFIG_SECTION}: {name}: is {kind}; write a single value, "
                f"like {name}: {_EXAMPLES[name]}"
            )
    return section


def shellfoundry_password(value: str, origin: str, machine_name: Optional[str] = None) -> str:
    """The password that shellfoundry would use for ``value`` as read from cloudshell_config.yml.

    ``shellfoundry config password X`` stores X scrambled (shellfoundry's ``PasswordModification``): each
    character XOR-ed with the machine name (``platform.node()``, repeated), UTF-8 encoded, then base64. It is
    a fixed scheme, so it is decoded here. shellfoundry decodes every value that is base64; here only a
    value that is canonical base64 of UTF-8 text counts as scrambled, and anything else is a password written
    by hand. A scrambled value that does not decode to printable text with this machine's name was written
    on another machine: that is an error, since sending it would fail as a wrong password.
    """
    if not re.fullmatch(r"(?:[A-Za-z0-9+/]{4})+(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?", value):
        return value
    try:
        raw = base64.b64decode(value, validate=True)
        scrambled = raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return value
    if base64.b64encode(raw).decode("ascii") != value:
        return value  # non-canonical padding bits: not something b64encode wrote
    key = platform.node() if machine_name is None else machine_name
    decoded = "".join(chr(ord(char) ^ ord(k)) for char, k in zip(scrambled, key * 100)) if key else ""
    if decoded and decoded.isprintable():
        return decoded
    raise InstallError(
        f"the password in {origin} looks scrambled by shellfoundry, but does not decode on this machine "
        "(shellfoundry scrambles it with the name of the machine that wrote it): run "
        "`shellfoundry config password <password>` here, or set CLOUDSHELL_PASSWORD instead"
    )


def _has_control(text: str) -> bool:
    return any(unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp") for char in text)


def _host_name_error(host: str) -> Optional[str]:
    """Why ``host`` is not a host name or IPv4 address (None when it is one)."""
    if len(host) > 253:
        return "is longer than a host name can be (253 characters)"
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if any(not label or len(label) > 63 or not _HOST_LABEL_RE.match(label) for label in labels):
        return "is not a host name or IP address"
    if all(label.isdecimal() for label in labels):
        try:
            ipaddress.IPv4Address(host.rstrip("."))
        except ValueError:
            return "is not a valid IPv4 address"
    return None


def _bare_host(host: str, origin: str) -> str:
    """A host without port: a name, an IPv4 address, or an IPv6 address (bracketed or not)."""
    hint = "write a host name or address, e.g. cloudshell.example.com, 192.0.2.10 or ::1"
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in inner:
        try:
            address = ipaddress.IPv6Address(inner)
        except ValueError:
            raise InstallError(f"{origin} {shown(host)} is not a valid IPv6 address; {hint}") from None
        if "%" in inner:
            raise InstallError(
                f"{origin} {shown(host)} has a zone (%...), which the HTTP client cannot use; "
                "write the server's name or a global address"
            )
        return f"[{address.compressed}]"
    if inner is not host:
        raise InstallError(f"{origin} {shown(host)}: only IPv6 addresses go in brackets; {hint}")
    problem = _host_name_error(host)
    if problem:
        raise InstallError(f"{origin} {shown(host)} {problem}; {hint}")
    return host


def parse_host(value: str, origin: str) -> Tuple[str, Optional[int]]:
    """Return the host as it goes into the URL, and the port that ``value`` names, if it names one.

    Accepted: a host name, an IPv4 address, an IPv6 address (``::1`` or ``[::1]``), ``host:port``,
    ``[v6]:port``, and an ``http://`` URL with nothing after the port but ``/`` or ``/API/``. Everything
    else is refused with what to write. A value holding ``user:password@`` is refused without quoting it.
    """
    text = value.strip()
    if not text:
        raise InstallError(f"{origin} is empty; write the CloudShell server's host name or address")
    if "@" in text:
        raise InstallError(
            f"{origin} holds a user name or password (it has an @); write only the server's name there, "
            "the user in --username or CLOUDSHELL_USERNAME and the password in CLOUDSHELL_PASSWORD"
        )
    if _has_control(text) or any(char.isspace() for char in text):
        raise InstallError(f"{origin} contains spaces or control characters; write only the server's name")
    if "://" in text:
        return _parse_url(text, origin)
    if any(char in text for char in "/?#\\"):
        raise InstallError(
            f"{origin} {shown(text)} is not a host name; write just the name, e.g. cloudshell.example.com, "
            "or a URL like http://cloudshell.example.com:9000"
        )
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise InstallError(
                f"{origin} {shown(text)} opens a [ without closing it; write an IPv6 address as ::1 or [::1]"
            )
        rest = text[close + 1 :]
        if not rest:
            return _bare_host(text, origin), None
        if not rest.startswith(":"):
            raise InstallError(f"{origin} {shown(text)}: after ] only :port may follow, e.g. [::1]:9000")
        return _bare_host(text[: close + 1], origin), _port_in_host(rest[1:], origin)
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return _bare_host(host, origin), _port_in_host(port, origin)
    return _bare_host(text, origin), None


def _port_in_host(port: str, origin: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
        # Not quoted: whatever follows the colon may be a password written as host:password.
        raise InstallError(
            f"{origin}: what follows the ':' is not a port number; write the host alone "
            "(e.g. cloudshell.example.com) and the port with --port, CLOUDSHELL_PORT or port:"
        )
    return int(port)


def _parse_url(text: str, origin: str) -> Tuple[str, Optional[int]]:
    try:
        url = urlsplit(text)
        port = url.port
    except ValueError:
        port = -1
        url = None
    if url is None or port == -1 or not url.hostname:
        raise InstallError(
            f"{origin} {shown(text)} is not a valid URL; write e.g. http://cloudshell.example.com:9000 "
            "or just the host name"
        )
    if url.scheme.lower() != "http":
        raise InstallError(
            f"{origin} {shown(text)}: the Quali API client speaks plain http only; write the host name "
            "alone or an http:// URL"
        )
    if url.path.rstrip("/").lower() not in ("", "/api") or url.query or url.fragment:
        raise InstallError(
            f"{origin} {shown(text)}: the URL may name only the server and port (the client adds /API/); "
            "write e.g. http://cloudshell.example.com:9000"
        )
    host = url.netloc
    if port is not None or host.endswith(":"):
        host = host.rpartition(":")[0]
    return _bare_host(host, origin), port


def parse_port(value: str, origin: str) -> int:
    """A TCP port number; the Automation API's port is refused with the Quali API's."""
    text = value.strip()
    port = int(text) if re.fullmatch(r"[0-9]{1,5}", text) else 0  # ASCII digits only: int() takes others
    if not 0 < port < 65536:
        raise InstallError(f"{origin} {shown(value)} is not a TCP port number; the Quali API's is 9000")
    return port


def _automation_port_error(origin: str) -> InstallError:
    return InstallError(
        f"{origin} is {AUTOMATION_API_PORT}, the Automation API's port (CloudShellAPISession); packages are "
        f"imported through the Quali API, which listens on {QUALI_API_PORT}: use --port {QUALI_API_PORT} "
        "(or CLOUDSHELL_PORT / port:), or leave the port out"
    )


#: A setting's value, where it came from (for messages), and whether the user gave it (not a default).
Picked = Tuple[str, str, bool]


def pick_settings(
    args: argparse.Namespace,
    env_vars: Mapping[str, str],
    defaults: Mapping[str, str],
    environ: Optional[Mapping[str, str]] = None,
    cwd: Optional[Path] = None,
    config_keys: Optional[Tuple[str, ...]] = None,
) -> Dict[str, Picked]:
    """Each setting of ``env_vars`` (setting -> variable) from its flag, variable, config entry or default.

    The config file is ``args.config``, else ``cloudshell_config.yml`` in ``cwd`` if there is one;
    ``config_keys`` limits what it may set (None: every setting). An empty value counts as unset; a
    setting found nowhere is left out. A password read from the file is decoded as shellfoundry stores it.
    """
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    config_path: Optional[Path] = None
    if getattr(args, "config", None):
        config_path = Path(args.config)
    elif (cwd / CONFIG_FILE_NAME).is_file():
        config_path = cwd / CONFIG_FILE_NAME
    config = load_config(config_path) if config_path is not None else {}

    values: Dict[str, Picked] = {}
    for name, variable in env_vars.items():
        flag = getattr(args, name, None)
        if flag is not None:
            values[name] = (str(flag), f"--{name.replace('_', '-')}", True)
        elif environ.get(variable):
            values[name] = (environ[variable], variable, True)
        elif (config_keys is None or name in config_keys) and config.get(name):
            values[name] = (config[name], f"{name}: in {config_path}", True)
        elif name in defaults:
            values[name] = (defaults[name], f"the default {name}", False)
    if "password" not in values:
        raise InstallError(
            f"no password: set {env_vars['password']}, add password to the {CONFIG_SECTION}: block of "
            f"{CONFIG_FILE_NAME}, or pass --password"
        )
    password, origin, given = values["password"]
    if origin.startswith("password: in "):
        values["password"] = (shellfoundry_password(password, str(config_path)), origin, given)
    return values


def resolve_settings(
    args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None
) -> InstallSettings:
    """Combine flags, environment variables, cloudshell_config.yml and defaults, in that order; check them."""
    values = pick_settings(args, ENV_VARS, DEFAULTS, environ, cwd)
    password = values["password"][0]

    host_value, host_origin, _ = values["host"]
    host, host_port = parse_host(host_value, host_origin)
    port_value, port_origin, port_given = values["port"]
    port = parse_port(port_value, port_origin)
    if host_port is not None:
        if port_given and host_port != port:
            raise InstallError(
                f"{host_origin} names port {host_port} but {port_origin} says {port}; write the port once"
            )
        port, port_origin = host_port, f"the port in {host_origin}"
    if port == AUTOMATION_API_PORT:
        raise _automation_port_error(port_origin)

    for name in ("username", "domain"):
        text, origin, _ = values[name]
        if not text.strip() or _has_control(text):
            raise InstallError(f"{origin} must be a non-empty single line, like {_EXAMPLES[name]}")
    if args.timeout is not None and not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise InstallError("--timeout must be a positive number of seconds")
    return InstallSettings(
        host=host,
        port=port,
        username=values["username"][0],
        password=password,
        domain=values["domain"][0],
        package=Path(args.package),
        timeout=30.0 if args.timeout is None else float(args.timeout),
    )


def scrub(text: str, secret: Optional[str]) -> str:
    """``text`` with every occurrence of ``secret`` masked, also as a form, URL or JSON string writes it.

    A server or proxy that echoes the login request shows the password form-encoded.
    """
    if not secret:
        return text
    forms = {secret, quote_plus(secret), quote(secret, safe=""), json.dumps(secret)[1:-1]}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, "********")
    return text
