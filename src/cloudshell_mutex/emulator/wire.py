"""The Automation API wire format: the XML request body in, the ``<Response>`` envelope out.

What ``CloudShellAPISession`` sends (see ``CommonAPISession._serialize_request``)::

    <AddServiceToReservation><reservationId>..</reservationId><alias>..</alias>
      <attributes><AttributeNameValue><Name>..</Name><Value>..</Value></AttributeNameValue></attributes>
    </AddServiceToReservation>

Lists of strings arrive as ``<services><string>MUTEX</string></services>``. What it parses
(``CommonApiResult``): ``<Response CommandName Success>`` in the ApiCommandResult namespace with
``<ErrorCode>``, ``<Error>`` and ``<ResponseInfo xsi:type="ClassName">``; the class of that name in
``cloudshell_api.py`` then reads scalar fields from XML attributes (or, failing that, child elements)
and lists from child elements. Nested elements must not carry ``xsi:type`` (the client would try to
call the type name).
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union
from xml.etree import ElementTree

RESPONSE_NS = "http://schemas.qualisystems.com/ResourceManagement/ApiCommandResult.xsd"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"

#: The client's default ``DateTimeFormat`` header (a .NET format string).
DEFAULT_DATETIME_FORMAT = "MM/dd/yyyy HH:mm"

Value = Union[str, List[Any], Dict[str, str]]

#: ``Params`` default meaning "the request must carry this parameter".
_REQUIRED: Any = object()


class RequestError(ValueError):
    """The request body is not what the client sends."""


class Params:
    """The parameters of one API call, read by name with the type the method expects."""

    def __init__(self, values: Mapping[str, Value]) -> None:
        self._values = dict(values)

    def _get(self, name: str, default: Any) -> Any:
        if name in self._values:
            return self._values[name]
        if default is _REQUIRED:
            raise RequestError(f"parameter '{name}' is missing")
        return default

    def text(self, name: str, default: Any = _REQUIRED) -> str:
        """A string parameter; without ``default`` the request must carry it (it may be empty)."""
        value = self._get(name, default)
        if not isinstance(value, str):
            raise RequestError(f"parameter '{name}' must be a single value")
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        """A boolean parameter (the client sends ``true``/``false``)."""
        value = self.text(name, "")
        if value == "":
            return default
        lowered = value.strip().lower()
        if lowered not in ("true", "false", "1", "0"):
            raise RequestError(f"parameter '{name}' must be true or false, got '{value}'")
        return lowered in ("true", "1")

    def number(self, name: str, default: int = 0) -> int:
        """An integer parameter."""
        value = self.text(name, "")
        if value == "":
            return default
        try:
            return int(value)
        except ValueError:
            raise RequestError(f"parameter '{name}' must be an integer, got '{value}'") from None

    def items(self, name: str, required: bool = True) -> List[Any]:
        """A list parameter (an empty element is an empty list)."""
        value = self._get(name, _REQUIRED if required else [])
        if value == "":
            return []
        if isinstance(value, dict):
            return [value]
        if not isinstance(value, list):
            raise RequestError(f"parameter '{name}' must be a list")
        return value

    def strings(self, name: str, required: bool = True) -> List[str]:
        """A list-of-strings parameter."""
        result = []
        for item in self.items(name, required):
            if not isinstance(item, str):
                raise RequestError(f"parameter '{name}' must be a list of strings")
            result.append(item)
        return result

    def name_values(self, name: str, required: bool = True) -> List[Tuple[str, str]]:
        """A list of ``AttributeNameValue`` as (name, value) pairs."""
        result = []
        for item in self.items(name, required):
            if not isinstance(item, dict) or "Name" not in item:
                raise RequestError(f"parameter '{name}' must be a list of AttributeNameValue")
            result.append((item["Name"], item.get("Value", "")))
        return result

    def records(self, name: str, required: bool = True) -> List[Dict[str, str]]:
        """A list of request objects (e.g. ``SetConnectorRequest``) as dicts of their fields."""
        result = []
        for item in self.items(name, required):
            if not isinstance(item, dict):
                raise RequestError(f"parameter '{name}' must be a list of objects")
            result.append(item)
        return result


def _element_value(element: ElementTree.Element) -> Value:
    children = list(element)
    if not children:
        return element.text or ""
    return [_item_value(child) for child in children]


def _item_value(element: ElementTree.Element) -> Union[str, Dict[str, str]]:
    children = list(element)
    if not children:
        return element.text or ""
    return {child.tag: child.text or "" for child in children}


def parse_request(body: bytes, method: str) -> Params:
    """Parse a request body; its root element must be the method named in the URL."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as error:
        raise RequestError(f"request body is not valid XML: {error}") from None
    if root.tag != method:
        raise RequestError(f"request body is for '{root.tag}', the URL names '{method}'")
    return Params({child.tag: _element_value(child) for child in root})


def parse_authorization(header: Optional[str]) -> Optional[str]:
    """The token in ``Authorization: MachineName=<host>;Token=<token>``, or None."""
    if not header:
        return None
    for part in header.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "token":
            return value.strip() or None
    return None


def node(tag: str, attrs: Optional[Mapping[str, Any]] = None, children: Iterable[ElementTree.Element] = ()):
    """An element whose scalar fields are XML attributes (bools as ``true``/``false``, None left out)."""
    element = ElementTree.Element(tag)
    for key, value in (attrs or {}).items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        element.set(key, str(value))
    element.extend(children)
    return element


def _envelope(command: str, success: bool) -> ElementTree.Element:
    root = ElementTree.Element("Response")
    root.set("CommandName", command)
    root.set("Success", "true" if success else "false")
    # Literal attribute names: ElementTree writes them verbatim, so the client's exact-string removal
    # of the default namespace (CommonAPISession._remove_xml_namespace) matches.
    root.set("xmlns", RESPONSE_NS)
    root.set("xmlns:xsi", XSI_NS)
    return root


def _serialize(root: ElementTree.Element) -> bytes:
    return b'<?xml version="1.0" encoding="utf-8"?>\n' + ElementTree.tostring(
        root, encoding="unicode"
    ).encode("utf-8")


def text_node(tag: str, text: str) -> ElementTree.Element:
    """An element with text content (how the real server sends a few scalar fields, e.g. SetupStage)."""
    element = ElementTree.Element(tag)
    element.text = text
    return element


@dataclass
class Info:
    """A ``<ResponseInfo xsi:type=...>``: the client class name, its child elements and its scalar
    fields (XML attributes of the ResponseInfo element, as on every other object)."""

    type_name: str
    children: List[ElementTree.Element] = field(default_factory=list)
    fields: Dict[str, Any] = field(default_factory=dict)


def success_response(command: str, info: Optional[Info] = None) -> bytes:
    """A ``Success="true"`` envelope, with a ResponseInfo when ``info`` is given."""
    root = _envelope(command, True)
    ElementTree.SubElement(root, "ErrorCode").text = "0"
    if info is not None:
        root.append(node("ResponseInfo", {"xsi:type": info.type_name, **info.fields}, info.children))
    return _serialize(root)


def failure_response(command: str, code: str, message: str) -> bytes:
    """A ``Success="false"`` envelope: the client raises ``CloudShellAPIError(code, message)``."""
    root = _envelope(command, False)
    ElementTree.SubElement(root, "ErrorCode").text = code
    ElementTree.SubElement(root, "Error").text = message
    return _serialize(root)


_DOTNET_TOKENS = re.compile(r"yyyy|yy|MM|dd|HH|hh|mm|ss|fff|tt")


def format_datetime(value: _dt.datetime, dotnet_format: Optional[str]) -> str:
    """Format a UTC time with the client's ``DateTimeFormat`` header (a .NET format string)."""
    fmt = dotnet_format or DEFAULT_DATETIME_FORMAT

    def token(match: re.Match[str]) -> str:
        t = match.group(0)
        if t == "fff":
            return f"{value.microsecond // 1000:03d}"
        if t == "tt":
            return "AM" if value.hour < 12 else "PM"
        if t == "hh":
            return f"{(value.hour % 12) or 12:02d}"
        return value.strftime(
            {"yyyy": "%Y", "yy": "%y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M", "ss": "%S"}[t]
        )

    return _DOTNET_TOKENS.sub(token, fmt)
