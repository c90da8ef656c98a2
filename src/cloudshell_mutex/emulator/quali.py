"""The Quali API package import (port 9000): ``PUT /API/Auth/Login`` and ``POST /API/Package/ImportPackage``.

``cloudshell.rest.api.PackagingRestApiClient`` logs on with form fields ``username``, ``password`` and
``domain`` and reads the token from the body, stripping quotes; a 401 is a failed login. The import is a
multipart upload (the client names the field ``files`` with the file name ``file``; the emulator takes the
first file part, whatever its field name) with ``Authorization: Basic <token>``. Like the real server, a
package that cannot be imported still gets HTTP 200, with ``{"Success": false, "ErrorMessage": ...}``;
the client only checks the status, so callers that care must read the body.

Parsing and validation is :func:`cloudshell_mutex.packaging.format.read_package`; this module only
registers what it returns.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, Dict, Optional

from .state import AttributeSpec, CatalogModel, EmulatorState


class QualiTokens:
    """Tokens issued by the Quali API login (separate from Automation API sessions)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: Dict[str, str] = {}

    def issue(self, user: str) -> str:
        """A new token for ``user``."""
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = user
        return token

    def user(self, authorization: Optional[str]) -> Optional[str]:
        """The user of an ``Authorization: Basic <token>`` header, or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        with self._lock:
            return self._tokens.get(token.strip())


def first_file_part(content_type: str, body: bytes) -> Optional[bytes]:
    """The bytes of the first file in a ``multipart/form-data`` body, or None."""
    if not content_type.lower().startswith("multipart/form-data"):
        return None
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        return None
    for part in message.iter_parts():
        if part.get_filename() is not None or part.get_param("name", header="content-disposition") in (
            "file",
            "files",
        ):
            payload = part.get_payload(decode=True)
            return payload if isinstance(payload, bytes) else None
    return None


def register_package(state: EmulatorState, server_version: str, zip_bytes: bytes) -> Dict[str, Any]:
    """Validate a package zip and register its families, models, attributes and drivers in ``state``;
    a package built for a CloudShell newer than ``server_version`` is refused.

    Raises ``PackageError`` (a ValueError naming the file and the problem) and registers nothing then.
    Returns a summary: ``{"services": [...], "resources": [...], "drivers": [...]}``.
    """
    from cloudshell_mutex.packaging.format import PackageError, parse_version, read_package

    package = read_package(zip_bytes)
    if package.metadata.server_version_info > parse_version(server_version):
        raise PackageError(
            f"metadata.xml: ServerVersion {package.metadata.server_version} is newer than this server "
            f"({server_version}); build the package for {server_version} or older"
        )
    datamodel = package.datamodel
    models = []
    for family in datamodel.families:
        for model in family.models:
            attributes: OrderedDict[str, AttributeSpec] = OrderedDict()
            for name in model.attributes:
                definition = datamodel.attributes[name]
                attributes[name] = AttributeSpec(
                    name=name, type=definition.type, default=model.defaults.get(name, definition.default)
                )
            models.append(
                CatalogModel(
                    name=model.name,
                    family=family.name,
                    is_service=family.is_service,
                    attributes=attributes,
                    drivers=tuple(model.drivers),
                    admin_only=family.is_admin_only,
                )
            )
    with state.lock:
        for catalog_model in models:
            state.register_model(catalog_model)
        for name, data in package.drivers.items():
            state.drivers[name] = len(data)  # same-named drivers are overwritten, as on the real server
    return {
        "services": [m.name for m in models if m.is_service],
        "resources": [m.name for m in models if not m.is_service],
        "drivers": sorted(package.drivers),
    }
