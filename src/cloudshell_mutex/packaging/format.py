"""The CloudShell package format: one parser for building, validating and importing packages.

A package is a zip with ``metadata.xml`` at its root, ``DataModel/datamodel.xml`` and optional
``Resource Drivers - Python/<name>.zip`` driver zips (docs/package.md, "What is in the zip").
The emulator's import endpoint and the build's validation both use :func:`read_package`, so what
``make package`` accepts is exactly what the emulator imports.

Every problem raises :class:`PackageError`, whose message starts with the file it is about.
"""

from __future__ import annotations

import contextlib
import io
import re
import zipfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple
from xml.etree import ElementTree
from xml.parsers import expat

METADATA_NS = "http://schemas.qualisystems.com/PackageMetadataSchema.xsd"
DATAMODEL_NS = "http://schemas.qualisystems.com/ResourceManagement/DataModelSchema.xsd"

METADATA_PATH = "metadata.xml"
DATAMODEL_PATH = "DataModel/datamodel.xml"
CATEGORIES_PATH = "Categories/categories.xml"
DRIVERS_FOLDER = "Resource Drivers - Python"
DRIVER_METADATA_PATH = "drivermetadata.xml"

PACKAGE_TYPE = "CloudShellPackage"
ATTRIBUTE_TYPES = ("String", "Password", "Numeric", "Boolean", "Lookup")
PYTHON_DRIVER_TYPE = "PythonDriver"

#: Limits against zip bombs: a package is a few kilobytes of XML plus small driver zips.
MAX_ENTRY_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 10_000

_VERSION_RE = re.compile(r"^\d+(\.\d+){0,3}$")
_NUMBER_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")


class PackageError(ValueError):
    """A package or one of its files is invalid; the message names the file and the problem."""


@dataclass(frozen=True)
class AttributeDef:
    """An ``<AttributeInfo>``: a data-model attribute definition."""

    name: str
    type: str
    default: str
    rules: Tuple[str, ...]
    description: str = ""
    read_only: bool = False
    #: The ``Override`` attribute of ``<Rules>``, as written (None when absent).
    rules_override: Optional[str] = None


@dataclass(frozen=True)
class ModelDef:
    """A ``<ResourceModel>``: its attributes (family-level ones first), their defaults and its drivers."""

    name: str
    family: str
    attributes: Tuple[str, ...]
    defaults: Dict[str, str] = field(hash=False)
    drivers: Tuple[str, ...]


@dataclass(frozen=True)
class FamilyDef:
    """A ``<ResourceFamily>``; a service family has ``is_service`` set."""

    name: str
    is_service: bool
    service_type: str
    is_admin_only: bool
    models: Tuple[ModelDef, ...]
    #: ``AllowRemoteConnection`` (None when absent).
    allow_remote_connection: Optional[bool] = None


@dataclass(frozen=True)
class DataModel:
    """A parsed ``datamodel.xml``."""

    attributes: Dict[str, AttributeDef] = field(hash=False)
    families: Tuple[FamilyDef, ...]
    #: Names declared in ``<DriverDescriptors>``.
    driver_descriptors: Tuple[str, ...] = ()

    def model(self, name: str) -> Optional[ModelDef]:
        """Return the model called ``name``, or None."""
        for family in self.families:
            for model in family.models:
                if model.name == name:
                    return model
        return None


@dataclass(frozen=True)
class Metadata:
    """A parsed ``metadata.xml``."""

    creation_date: str
    server_version: str
    package_type: str

    @property
    def server_version_info(self) -> Tuple[int, ...]:
        """``server_version`` as a tuple of ints, for comparing with a server's version."""
        return parse_version(self.server_version)


@dataclass(frozen=True)
class DriverMetadata:
    """A driver zip's ``drivermetadata.xml`` ``<Driver>`` element."""

    name: str
    version: str
    main_class: str
    python_version: str


@dataclass(frozen=True)
class Package:
    """A parsed package zip. ``drivers`` maps a driver name to its zip's bytes."""

    metadata: Metadata
    datamodel: DataModel
    drivers: Dict[str, bytes] = field(hash=False)
    driver_metadata: Dict[str, DriverMetadata] = field(default_factory=dict, hash=False)


def parse_version(text: str) -> Tuple[int, ...]:
    """Parse a dotted version such as ``9.3.0`` (raises ValueError when it is not one).

    Trailing zeros are dropped, so that ``9.3.0`` and ``9.3`` compare equal.
    """
    if not _VERSION_RE.match(text):
        raise ValueError(f"{text!r} is not a version like 9.3.0")
    parts = [int(part) for part in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def parse_xml(xml: bytes, source: str, keep_comments: bool = False) -> ElementTree.Element:
    """Parse XML, raising PackageError with the file, line and column when it is not well-formed."""
    _refuse_dtd(xml, source)
    parser = ElementTree.XMLParser(target=ElementTree.TreeBuilder(insert_comments=keep_comments))
    try:
        parser.feed(xml)
        return parser.close()
    except ElementTree.ParseError as error:
        line, column = error.position
        reason = expat.ErrorString(error.code) if error.code else str(error)
        # expat counts columns from 0; editors count from 1.
        raise PackageError(
            f"{source}: not well-formed XML (line {line}, column {column + 1}): {reason}"
        ) from None


def _refuse_dtd(xml: bytes, source: str) -> None:
    """Packages come from uploads: refuse DTDs so that entity expansion can never be used.

    expat itself reports the DOCTYPE, so a document in any encoding it reads (UTF-16 too) is caught.
    """

    def refuse(*_: object) -> None:
        raise PackageError(f"{source}: DTDs and entity declarations are not allowed")

    scanner = expat.ParserCreate()
    scanner.StartDoctypeDeclHandler = refuse
    scanner.EntityDeclHandler = refuse
    # When the XML is not well-formed, the parse that follows reports where.
    with contextlib.suppress(expat.ExpatError):
        scanner.Parse(xml, True)


def _tag(namespace: str, name: str) -> str:
    return f"{{{namespace}}}{name}"


def _check_root(root: ElementTree.Element, namespace: str, name: str, source: str) -> None:
    if root.tag != _tag(namespace, name):
        uri, _, local = root.tag[1:].rpartition("}") if root.tag.startswith("{") else ("", "", root.tag)
        found = f'{local} xmlns="{uri}"' if uri else local
        raise PackageError(f'{source}: root element must be <{name} xmlns="{namespace}">, found <{found}>')


def _required_attr(element: ElementTree.Element, attr: str, what: str, source: str) -> str:
    value = element.get(attr)
    if value is None or not value.strip():
        raise PackageError(f"{source}: {what} has no {attr} attribute")
    return value


def _bool_attr(element: ElementTree.Element, attr: str, what: str, source: str) -> bool:
    value = element.get(attr, "false")
    if value.lower() not in ("true", "false"):
        raise PackageError(f"{source}: {what} has {attr}={value!r}; expected true or false")
    return value.lower() == "true"


def _child_text(parent: ElementTree.Element, namespace: str, name: str, source: str) -> str:
    child = parent.find(_tag(namespace, name))
    if child is None or not (child.text or "").strip():
        raise PackageError(f"{source}: <{name}> is missing or empty")
    return (child.text or "").strip()


def parse_metadata(xml: bytes, source: str = METADATA_PATH) -> Metadata:
    """Parse and validate a package's ``metadata.xml``."""
    root = parse_xml(xml, source)
    _check_root(root, METADATA_NS, "Metadata", source)
    metadata = Metadata(
        creation_date=_child_text(root, METADATA_NS, "CreationDate", source),
        server_version=_child_text(root, METADATA_NS, "ServerVersion", source),
        package_type=_child_text(root, METADATA_NS, "PackageType", source),
    )
    if not _VERSION_RE.match(metadata.server_version):
        raise PackageError(f"{source}: ServerVersion {metadata.server_version!r} is not a version like 9.3.0")
    if metadata.package_type != PACKAGE_TYPE:
        raise PackageError(f"{source}: PackageType is {metadata.package_type!r}; expected {PACKAGE_TYPE!r}")
    return metadata


def _check_value(attribute: AttributeDef, value: str, where: str, source: str) -> None:
    """Refuse a Numeric or Boolean value that the server could not store."""
    if value == "":
        return
    if attribute.type == "Numeric" and not _NUMBER_RE.match(value):
        raise PackageError(
            f"{source}: {where} Numeric attribute {attribute.name!r} to {value!r}, which is not a number"
        )
    if attribute.type == "Boolean" and value.lower() not in ("true", "false"):
        raise PackageError(
            f"{source}: {where} Boolean attribute {attribute.name!r} to {value!r}, not True or False"
        )


def _parse_attributes(root: ElementTree.Element, source: str) -> Dict[str, AttributeDef]:
    attributes: Dict[str, AttributeDef] = {}
    for info in root.iterfind(f"{_tag(DATAMODEL_NS, 'Attributes')}/{_tag(DATAMODEL_NS, 'AttributeInfo')}"):
        name = _required_attr(info, "Name", "an <AttributeInfo>", source)
        kind = _required_attr(info, "Type", f"attribute {name!r}", source)
        if kind not in ATTRIBUTE_TYPES:
            expected = ", ".join(ATTRIBUTE_TYPES)
            raise PackageError(f"{source}: attribute {name!r} has Type {kind!r}; expected one of {expected}")
        if name in attributes:
            raise PackageError(f"{source}: attribute {name!r} is defined twice in <Attributes>")
        rules = tuple(
            _required_attr(rule, "Name", f"a <Rule> of attribute {name!r}", source)
            for rule in info.iterfind(f"{_tag(DATAMODEL_NS, 'Rules')}/{_tag(DATAMODEL_NS, 'Rule')}")
        )
        rules_element = info.find(_tag(DATAMODEL_NS, "Rules"))
        attribute = AttributeDef(
            name=name,
            type=kind,
            default=info.get("DefaultValue", ""),
            rules=rules,
            description=info.get("Description", ""),
            read_only=_bool_attr(info, "IsReadOnly", f"attribute {name!r}", source),
            rules_override=None if rules_element is None else rules_element.get("Override"),
        )
        _check_value(attribute, attribute.default, "<Attributes> defaults", source)
        attributes[name] = attribute
    return attributes


def _attached(
    owner: ElementTree.Element, what: str, attributes: Dict[str, AttributeDef], source: str
) -> List[str]:
    names: List[str] = []
    path = f"{_tag(DATAMODEL_NS, 'AttachedAttributes')}/{_tag(DATAMODEL_NS, 'AttachedAttribute')}"
    for attached in owner.iterfind(path):
        name = _required_attr(attached, "Name", f"an <AttachedAttribute> of {what}", source)
        if name not in attributes:
            raise PackageError(
                f"{source}: {what} attaches attribute {name!r} that is not defined in <Attributes>"
            )
        if name in names:
            raise PackageError(f"{source}: {what} attaches attribute {name!r} twice")
        names.append(name)
    return names


def _values(
    owner: ElementTree.Element,
    what: str,
    attached: List[str],
    attributes: Dict[str, AttributeDef],
    source: str,
) -> Dict[str, str]:
    values: Dict[str, str] = {}
    path = f"{_tag(DATAMODEL_NS, 'AttributeValues')}/{_tag(DATAMODEL_NS, 'AttributeValue')}"
    for element in owner.iterfind(path):
        name = _required_attr(element, "Name", f"an <AttributeValue> of {what}", source)
        if name not in attached:
            raise PackageError(
                f"{source}: {what} sets a value for attribute {name!r} that it does not attach"
            )
        value = element.get("Value", "")
        _check_value(attributes[name], value, f"{what} sets", source)
        values[name] = value
    return values


def _parse_model(
    element: ElementTree.Element,
    family: str,
    family_attached: List[str],
    family_values: Dict[str, str],
    attributes: Dict[str, AttributeDef],
    source: str,
) -> ModelDef:
    name = _required_attr(element, "Name", f"a <ResourceModel> of family {family!r}", source)
    what = f"model {name!r}"
    own = _attached(element, what, attributes, source)
    attached = family_attached + [attribute for attribute in own if attribute not in family_attached]
    defaults = {attribute: attributes[attribute].default for attribute in attached}
    defaults.update(family_values)
    defaults.update(_values(element, what, attached, attributes, source))
    drivers = []
    for driver in element.iterfind(f"{_tag(DATAMODEL_NS, 'Drivers')}/{_tag(DATAMODEL_NS, 'DriverName')}"):
        driver_name = (driver.text or "").strip()
        if not driver_name:
            raise PackageError(f"{source}: {what} has an empty <DriverName>")
        drivers.append(driver_name)
    return ModelDef(
        name=name, family=family, attributes=tuple(attached), defaults=defaults, drivers=tuple(drivers)
    )


def parse_datamodel(xml: bytes, source: str = DATAMODEL_PATH) -> DataModel:
    """Parse and validate a ``datamodel.xml``: types, defaults, and every attached attribute defined."""
    root = parse_xml(xml, source)
    _check_root(root, DATAMODEL_NS, "DataModelInfo", source)
    attributes = _parse_attributes(root, source)

    descriptors: List[str] = []
    path = f"{_tag(DATAMODEL_NS, 'DriverDescriptors')}/{_tag(DATAMODEL_NS, 'DriverDescriptor')}"
    for descriptor in root.iterfind(path):
        name = _required_attr(descriptor, "Name", "a <DriverDescriptor>", source)
        if name in descriptors:
            raise PackageError(f"{source}: driver {name!r} is declared twice in <DriverDescriptors>")
        descriptors.append(name)

    families: List[FamilyDef] = []
    model_names: Dict[str, str] = {}
    path = f"{_tag(DATAMODEL_NS, 'ResourceFamilies')}/{_tag(DATAMODEL_NS, 'ResourceFamily')}"
    for element in root.iterfind(path):
        name = _required_attr(element, "Name", "a <ResourceFamily>", source)
        what = f"family {name!r}"
        if any(family.name == name for family in families):
            raise PackageError(f"{source}: {what} is defined twice")
        family_attached = _attached(element, what, attributes, source)
        family_values = _values(element, what, family_attached, attributes, source)
        models = []
        for model_element in element.iterfind(
            f"{_tag(DATAMODEL_NS, 'Models')}/{_tag(DATAMODEL_NS, 'ResourceModel')}"
        ):
            model = _parse_model(model_element, name, family_attached, family_values, attributes, source)
            if model.name in model_names:
                raise PackageError(
                    f"{source}: model {model.name!r} is defined twice "
                    f"(families {model_names[model.name]!r} and {name!r})"
                )
            model_names[model.name] = name
            for driver in model.drivers:
                if driver not in descriptors:
                    raise PackageError(
                        f"{source}: model {model.name!r} names driver {driver!r} "
                        "that is not declared in <DriverDescriptors>"
                    )
            models.append(model)
        families.append(
            FamilyDef(
                name=name,
                is_service=_bool_attr(element, "IsService", what, source),
                service_type=element.get("ServiceType", ""),
                is_admin_only=_bool_attr(element, "IsAdminOnly", what, source),
                models=tuple(models),
                allow_remote_connection=(
                    None
                    if element.get("AllowRemoteConnection") is None
                    else _bool_attr(element, "AllowRemoteConnection", what, source)
                ),
            )
        )
    return DataModel(attributes=attributes, families=tuple(families), driver_descriptors=tuple(descriptors))


def parse_driver_metadata(xml: bytes, source: str = DRIVER_METADATA_PATH) -> DriverMetadata:
    """Parse a driver's ``drivermetadata.xml`` (``<Driver Name Version MainClass PythonVersion>``)."""
    root = parse_xml(xml, source)
    if root.tag != "Driver":
        raise PackageError(f"{source}: root element must be <Driver>, found <{root.tag}>")
    return DriverMetadata(
        name=_required_attr(root, "Name", "<Driver>", source),
        version=_required_attr(root, "Version", "<Driver>", source),
        main_class=_required_attr(root, "MainClass", "<Driver>", source),
        python_version=_required_attr(root, "PythonVersion", "<Driver>", source),
    )


def _open_zip(data: bytes, source: str) -> zipfile.ZipFile:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise PackageError(f"{source}: not a zip file") from None
    infos = archive.infolist()
    if len(infos) > MAX_ENTRIES:
        raise PackageError(f"{source}: more than {MAX_ENTRIES} entries")
    seen = set()
    for info in infos:
        if info.filename in seen:
            raise PackageError(f"{source}: entry {info.filename!r} appears twice")
        seen.add(info.filename)
        parts = info.filename.split("/")
        if info.filename.startswith("/") or "\\" in info.filename or ".." in parts:
            raise PackageError(
                f"{source}: entry {info.filename!r} is not a plain relative path "
                "(zip entries use / separators, with no leading / and no ..)"
            )
        if info.file_size > MAX_ENTRY_BYTES:
            raise PackageError(f"{source}: entry {info.filename!r} is larger than {MAX_ENTRY_BYTES} bytes")
    return archive


def _read_entry(archive: zipfile.ZipFile, name: str, source: str) -> bytes:
    try:
        return archive.read(name)
    except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError) as error:
        raise PackageError(f"{source}: entry {name!r} cannot be read: {error}") from None


def read_driver_zip(data: bytes, name: str) -> DriverMetadata:
    """Validate the driver zip stored as ``Resource Drivers - Python/<name>.zip``; return its metadata."""
    source = f"{DRIVERS_FOLDER}/{name}.zip"
    with _open_zip(data, source) as archive:
        names = set(archive.namelist())
        if DRIVER_METADATA_PATH not in names:
            raise PackageError(f"{source}: {DRIVER_METADATA_PATH} missing from the zip root")
        metadata = parse_driver_metadata(
            _read_entry(archive, DRIVER_METADATA_PATH, source), f"{source}/{DRIVER_METADATA_PATH}"
        )
    if metadata.name != name:
        raise PackageError(
            f"{source}/{DRIVER_METADATA_PATH}: driver Name {metadata.name!r} "
            f"differs from the zip's name {name!r}"
        )
    return metadata


def read_package(zip_bytes: bytes) -> Package:
    """Parse and validate a package zip: its layout, both XML files and every driver zip.

    Every ``AttachedAttribute`` must be defined in ``<Attributes>``, every driver zip must carry a
    ``drivermetadata.xml`` naming the driver as its zip is named, and every driver zip must be declared in
    ``<DriverDescriptors>``. A model may name a driver that the package does not carry (it may already be
    on the server); :func:`missing_drivers` lists those for callers that require a self-contained package.
    """
    with _open_zip(zip_bytes, "package") as archive:
        names = archive.namelist()
        if METADATA_PATH not in names:
            raise PackageError(f"{METADATA_PATH} missing from the zip root")
        if DATAMODEL_PATH not in names:
            raise PackageError(f"{DATAMODEL_PATH} missing from the zip")
        metadata = parse_metadata(_read_entry(archive, METADATA_PATH, METADATA_PATH))
        datamodel = parse_datamodel(_read_entry(archive, DATAMODEL_PATH, DATAMODEL_PATH))
        if CATEGORIES_PATH in names:
            parse_xml(_read_entry(archive, CATEGORIES_PATH, CATEGORIES_PATH), CATEGORIES_PATH)

        drivers: Dict[str, bytes] = {}
        driver_metadata: Dict[str, DriverMetadata] = {}
        prefix = DRIVERS_FOLDER + "/"
        for entry in names:
            if not entry.startswith(prefix) or entry == prefix:
                continue
            inner = entry[len(prefix) :]
            if "/" in inner or not inner.endswith(".zip"):
                raise PackageError(f"{entry}: only driver zips may sit in {DRIVERS_FOLDER}/")
            name = inner[: -len(".zip")]
            data = _read_entry(archive, entry, entry)
            driver_metadata[name] = read_driver_zip(data, name)
            if name not in datamodel.driver_descriptors:
                raise PackageError(
                    f"{entry}: driver {name!r} is not declared in {DATAMODEL_PATH} <DriverDescriptors>"
                )
            drivers[name] = data
    return Package(metadata=metadata, datamodel=datamodel, drivers=drivers, driver_metadata=driver_metadata)


def missing_drivers(package: Package) -> List[Tuple[str, str]]:
    """Return (model, driver) pairs where a model names a driver that the package does not carry."""
    return [
        (model.name, driver)
        for family in package.datamodel.families
        for model in family.models
        for driver in model.drivers
        if driver not in package.drivers
    ]
