"""Import the package into CloudShell through the Quali API (``cloudshell-mutex install``).

Settings come from flags, then environment variables, then the ``install:`` block of a shellfoundry-style
``cloudshell_config.yml``, then defaults. The password is never printed: messages name the user and the
server, and any text that came from elsewhere (the server, the HTTP stack, YAML) is scrubbed of it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional
from urllib.parse import quote, quote_plus, urljoin

import requests
import yaml
from cloudshell.rest.api import PackagingRestApiClient
from cloudshell.rest.exceptions import LoginFailedError, PackagingRestApiError
from cloudshell.rest.progress_bar import upload_with_pb

from cloudshell_mutex.packaging.format import PackageError, read_package
from cloudshell_mutex.settings import parse_port, pick_values

CONFIG_FILE_NAME = "cloudshell_config.yml"
CONFIG_SECTION = "install"

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

_MAX_SERVER_TEXT = 500


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


def _server_text(text: str, secret: Optional[str]) -> str:
    """Text from the server or the HTTP stack, fit for a message: scrubbed, then shortened."""
    return scrub(text, secret)[:_MAX_SERVER_TEXT]


class _ConfigLoader(yaml.SafeLoader):
    """Reads every plain scalar as a string, except null.

    With YAML's other implicit types a password such as 0123, yes or 12:30 would reach the server as
    83, True or 750.
    """


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag == "tag:yaml.org,2002:null"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_config(path: Path) -> Dict[str, Any]:
    """The ``install:`` block of a cloudshell_config.yml (empty when the file has none)."""
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_ConfigLoader)  # a SafeLoader
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
    return section


def resolve_settings(
    args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None
) -> InstallSettings:
    """Combine flags, environment variables, cloudshell_config.yml and defaults, in that order."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    if args.config:
        config = load_config(Path(args.config))
    elif (cwd / CONFIG_FILE_NAME).is_file():
        config = load_config(cwd / CONFIG_FILE_NAME)
    else:
        config = {}

    values = pick_values(args, ENV_VARS, environ, config, DEFAULTS)
    if not values.get("password"):
        raise InstallError(
            f"no password: set {ENV_VARS['password']}, add password to the {CONFIG_SECTION}: block of "
            f"{CONFIG_FILE_NAME}, or pass --password"
        )
    port = parse_port(values["port"])
    if port is None:
        raise InstallError(f"port {values['port']!r} is not a TCP port number")
    if args.timeout is not None and not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise InstallError("--timeout must be a positive number of seconds")
    return InstallSettings(
        host=values["host"],
        port=port,
        username=values["username"],
        password=values["password"],
        domain=values["domain"],
        package=Path(args.package),
        timeout=30.0 if args.timeout is None else float(args.timeout),
    )


class ImportingClient(PackagingRestApiClient):
    """PackagingRestApiClient whose package import returns the server's answer.

    The client's ``import_package_from_buffer`` checks only the HTTP status and discards the body, so a
    200 whose JSON says ``"Success": false`` would pass as a success. This override sends the same request
    (same URL, headers and multipart encoder as the client) and hands back the response to be checked.
    Login is the client's own.
    """

    def import_package_from_buffer(self, file_obj: Any) -> requests.Response:  # type: ignore[override]
        """POST the package to Package/ImportPackage and return the response."""
        url = urljoin(self._api_url, "Package/ImportPackage")
        headers = self._headers.copy()
        with upload_with_pb({"files": ("file", file_obj)}, headers, show=False) as data:
            return requests.post(url, data=data, headers=headers, timeout=self._api_timeout)


def check_import_answer(response: requests.Response, password: Optional[str] = None) -> None:
    """Raise InstallError unless the answer is HTTP 200 with a JSON body whose Success is true."""
    text = _server_text(response.text, password)
    if response.status_code == 404:
        raise InstallError(
            "the server has no Package/ImportPackage endpoint (HTTP 404): is this the Quali API?"
        )
    if response.status_code == 401:
        raise InstallError("the server refused the login token for the import (HTTP 401)")
    if response.status_code != 200:
        raise InstallError(f"import failed with HTTP {response.status_code}: {text}")
    try:
        body = json.loads(response.text)
    except ValueError:
        body = None
    if not isinstance(body, dict) or "Success" not in body:
        raise InstallError(
            f"import answered HTTP 200 without a JSON Success field, so its outcome is unknown: {text!r}"
        )
    if body["Success"] is not True:
        reason = body.get("ErrorMessage") or body.get("Message") or "no reason given"
        raise InstallError(f"the server refused the package: {_server_text(str(reason), password)}")


def install_package(settings: InstallSettings) -> str:
    """Validate the package locally, log in, import it and check the answer; return a summary line."""
    try:
        data = settings.package.read_bytes()
    except FileNotFoundError:
        raise InstallError(f"{settings.package}: not found; build it with `make package`") from None
    except OSError as error:
        raise InstallError(f"{settings.package}: cannot be read: {error.strerror}") from None
    # The same checks as the server's import, before anything is sent.
    try:
        read_package(data)
    except PackageError as error:
        raise InstallError(f"{settings.package}: {error}") from None

    where = f"the Quali API at {settings.api_url}"
    try:
        client = ImportingClient.login(
            settings.host,
            settings.username,
            settings.password,
            settings.domain,
            settings.port,
            api_timeout=settings.timeout,
        )
        response = client.import_package_from_buffer(data)
    except LoginFailedError:
        raise InstallError(
            f"login to {where} failed for user {settings.username!r} in domain {settings.domain!r}: "
            "wrong username, password or domain"
        ) from None
    except PackagingRestApiError as error:
        raise InstallError(
            f"login to {where} failed: {_server_text(str(error), settings.password)}"
        ) from None
    except requests.Timeout:
        raise InstallError(f"{where} did not answer within {settings.timeout:g} s") from None
    except requests.ConnectionError:
        raise InstallError(f"cannot connect to {where}: check the host and port, and that it runs") from None
    except requests.RequestException as error:
        raise InstallError(
            f"request to {where} failed: {_server_text(str(error), settings.password)}"
        ) from None
    check_import_answer(response, settings.password)
    return (
        f"imported {settings.package} into {settings.host}:{settings.port} "
        f"as {settings.username!r} in domain {settings.domain!r}"
    )
