"""Import the package into CloudShell through the Quali API (``cloudshell-mutex install``).

Settings (:mod:`cloudshell_mutex.settings`) come from flags, then environment variables, then the
``install:`` block of a shellfoundry-style ``cloudshell_config.yml``, then defaults. The password is never
printed: messages name the user and the server, and any text that came from elsewhere (the server, the HTTP
stack, YAML) is scrubbed of it.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional
from urllib.parse import urljoin

import requests
from cloudshell.rest.api import PackagingRestApiClient
from cloudshell.rest.exceptions import LoginFailedError, PackagingRestApiError
from cloudshell.rest.progress_bar import upload_with_pb

from cloudshell_mutex.packaging.format import PackageError, read_package
from cloudshell_mutex.settings import (
    QUALI_API_PORT,
    InstallError,
    InstallSettings,
    redact_userinfo,
    resolve_settings,
    scrub,
    shown,
)

__all__ = ["ImportingClient", "InstallError", "check_import_answer", "install_package", "resolve_settings"]

_MAX_SERVER_TEXT = 500


_HTML_RE = re.compile(r"^\s*(<!doctype html|<html|<\?xml[^>]*>\s*<html)", re.IGNORECASE)


def _server_text(text: str, secret: Optional[str]) -> str:
    """Text from the server or the HTTP stack, fit for a message: scrubbed, then shortened.

    An HTML page is not quoted: a page of markup explains nothing, and it means that something other than
    the Quali API answered.
    """
    if _HTML_RE.match(text):
        return f"an HTML page instead of a Quali API answer (is this the Quali API's port, {QUALI_API_PORT}?)"
    return redact_userinfo(scrub(text, secret))[:_MAX_SERVER_TEXT]


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
            f"login to {where} failed for user {shown(settings.username)} "
            f"in domain {shown(settings.domain)}: wrong username, password or domain"
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
        f"as {shown(settings.username)} in domain {shown(settings.domain)}"
    )
