"""Build Mutex_Package.zip reproducibly from the data model, package/ and drivers.toml.

Everything is built in memory, checked with the same parser that the emulator's import uses
(:func:`~cloudshell_mutex.packaging.format.read_package`), and only then written. Zip entries get a fixed
timestamp, fixed permissions and a fixed order, and are stored uncompressed, so the same inputs always give
the same bytes: deflate output depends on the zlib build (zlib-ng distributions differ from zlib).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple
from xml.etree import ElementTree

from cloudshell_mutex import protocol
from cloudshell_mutex.packaging.format import (
    DATAMODEL_NS,
    DATAMODEL_PATH,
    DRIVER_METADATA_PATH,
    DRIVERS_FOLDER,
    METADATA_PATH,
    PYTHON_DRIVER_TYPE,
    AttributeDef,
    DataModel,
    PackageError,
    missing_drivers,
    parse_datamodel,
    parse_metadata,
    parse_xml,
    read_package,
)
from cloudshell_mutex.packaging.manifest import MANIFEST_NAME, DriverSpec, Manifest, load_manifest

PACKAGE_FILE_NAME = "Mutex_Package.zip"
REQUIREMENTS_PATH = "requirements.txt"

#: The earliest time a zip can store: entries do not carry the build's clock.
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_FILE_MODE = stat.S_IFREG | 0o644
_UNIX = 3

#: Never packed into a driver zip: caches, VCS and editor files.
_SKIPPED_DIRS = {"__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".venv", "venv"}
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


#: ``Mutex Owner`` as the original 2017 package defines it (QualiSystemsLab/Reservation-Mutex-Lock). Sites
#: have it imported, and an import that defines an existing attribute differently changes it there.
ORIGINAL_OWNER = AttributeDef(
    name=protocol.ATTR_OWNER,
    type="String",
    default="",
    rules=("Configuration", "Setting"),
    description=(
        "Mutex usage: Try to add Mutex Service to the reservation with the service alias set to the same "
        "name for all threads and Mutex Owner set to the unique name of your thread. You have successfully "
        "taken the mutex only if you manage to add the service without an exception and Mutex Owner in the "
        "created service matches your thread name."
    ),
    read_only=False,
    rules_override="false",
)


def check_mutex_datamodel(datamodel: DataModel, source: str) -> None:
    """Refuse a data model that is no longer the Mutex package that sites and old code rely on.

    Old code adds the model ``Mutex Service`` by name, sites have the family ``Mutex Service Family``
    imported, and the family must stay admin-only (it must not appear in users' catalog). So the names, the
    service flags and the original's ``Mutex Owner`` definition are fixed.
    """
    family = next((f for f in datamodel.families if f.name == protocol.SERVICE_FAMILY), None)
    if family is None:
        found = ", ".join(repr(f.name) for f in datamodel.families) or "none"
        raise PackageError(
            f"{source}: no family {protocol.SERVICE_FAMILY!r} (found: {found}); this is not a Mutex package. "
            "Keep the original family name: sites have it imported and old code relies on it"
        )
    what = f"family {family.name!r}"
    if not family.is_service or family.service_type != "Regular":
        raise PackageError(
            f'{source}: {what} must be a service family: IsService="true" ServiceType="Regular"'
        )
    if not family.is_admin_only:
        raise PackageError(
            f'{source}: {what} must be admin-only (IsAdminOnly="true"): the lock service must not appear '
            "in users' service catalog"
        )
    model = next((m for m in family.models if m.name == protocol.SERVICE_MODEL), None)
    if model is None:
        found = ", ".join(repr(m.name) for m in family.models) or "none"
        raise PackageError(
            f"{source}: {what} has no model {protocol.SERVICE_MODEL!r} (found: {found}); old code adds the "
            "service by that model name, so keep it"
        )
    owner = datamodel.attributes.get(protocol.ATTR_OWNER)
    if owner is None or protocol.ATTR_OWNER not in model.attributes:
        raise PackageError(
            f"{source}: model {model.name!r} must define and attach attribute {protocol.ATTR_OWNER!r}: "
            "the 2017 package and old code that sets it have it"
        )
    for field_name, label in (
        ("type", "Type"),
        ("default", "DefaultValue"),
        ("read_only", "IsReadOnly"),
        ("rules", "Rules"),
        ("rules_override", "Rules Override"),
        ("description", "Description"),
    ):
        ours, original = getattr(owner, field_name), getattr(ORIGINAL_OWNER, field_name)
        if ours != original:
            raise PackageError(
                f"{source}: attribute {protocol.ATTR_OWNER!r} must keep the original definition, but its "
                f"{label} is {ours!r} instead of {original!r}; "
                "importing it would change the attribute on sites that have the original package"
            )


@dataclass(frozen=True)
class PackageSources:
    """Where the package's inputs are in a source tree."""

    root: Path
    datamodel: Path
    package_dir: Path
    manifest: Path

    @classmethod
    def in_tree(cls, root: Path, manifest: Optional[Path] = None) -> PackageSources:
        """The standard layout: DataModel/datamodel.xml, package/, drivers.toml."""
        return cls(
            root=root,
            datamodel=root / "DataModel" / "datamodel.xml",
            package_dir=root / "package",
            manifest=manifest if manifest is not None else root / MANIFEST_NAME,
        )

    def display(self, path: Path) -> str:
        """``path`` relative to the tree's root when it is inside it, for error messages."""
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)


@dataclass(frozen=True)
class BuildResult:
    """What a build wrote."""

    path: Path
    sha256: str
    size: int
    drivers: Tuple[str, ...]


def deterministic_zip(entries: Iterable[Tuple[str, bytes]]) -> bytes:
    """Zip ``entries`` in the given order with fixed timestamps and permissions, uncompressed."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=ZIP_DATE_TIME)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = _UNIX
            info.external_attr = _FILE_MODE << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def _read(path: Path, display: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PackageError(f"{display}: not found") from None
    except OSError as error:
        raise PackageError(f"{display}: cannot be read: {error.strerror}") from None


def _tree_files(folder: Path, display: Callable[[Path], str]) -> List[Tuple[str, Path]]:
    """Files under ``folder`` as (posix relative path, path), sorted, without caches or hidden files.

    Symbolic links are refused: os.walk would silently skip a linked folder, and git on Windows checks a
    link out as a small text file, so the same commit would give a different package there.
    """
    found: List[Tuple[str, Path]] = []
    for current, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith("."))
        kept = [name for name in files if not name.startswith(".") and not name.endswith(_SKIPPED_SUFFIXES)]
        for name in [*dirs, *kept]:
            path = Path(current) / name
            if path.is_symlink():
                raise PackageError(f"{display(path)}: a symbolic link; put the real file or folder there")
            if name in kept:
                found.append((path.relative_to(folder).as_posix(), path))
    return sorted(found)


def _serialize(root: ElementTree.Element, default_namespace: Optional[str] = None) -> bytes:
    """Write an element tree as a UTF-8 document, ``default_namespace`` as a plain ``xmlns``.

    ElementTree would otherwise write ``ns0:`` prefixes (its ``default_namespace`` option refuses
    unqualified attribute names, and ``register_namespace`` changes global state).
    """
    if default_namespace is not None:
        prefix = f"{{{default_namespace}}}"
        for element in root.iter():
            if isinstance(element.tag, str) and element.tag.startswith(prefix):
                element.tag = element.tag[len(prefix) :]
        root.set("xmlns", default_namespace)
    body = ElementTree.tostring(root, encoding="unicode")
    return ('<?xml version="1.0" encoding="utf-8"?>\n' + body + "\n").encode("utf-8")


def driver_metadata_xml(driver: DriverSpec, existing: Optional[bytes], source: str) -> bytes:
    """The driver's drivermetadata.xml: the folder's own (for its <Layout>), with the manifest's identity.

    Values that the folder's file sets must agree with drivers.toml, which is the one declaration.
    """
    wanted = {
        "Name": driver.name,
        "Version": driver.version,
        "MainClass": driver.main_class,
        "PythonVersion": driver.python_version,
    }
    if existing is None:
        root = ElementTree.Element("Driver", wanted)
    else:
        root = parse_xml(existing, source, keep_comments=True)
        if root.tag != "Driver":
            raise PackageError(f"{source}: root element must be <Driver>, found <{root.tag}>")
        for key, value in wanted.items():
            current = root.get(key)
            if current is not None and current != value:
                raise PackageError(
                    f"{source}: {key}={current!r} but drivers.toml declares {value!r} "
                    f"for driver {driver.name!r}"
                )
            root.set(key, value)
    return _serialize(root)


def _bundle_files(driver: DriverSpec, sources: PackageSources) -> List[Tuple[str, Path]]:
    """The files of the driver's ``bundle``, as (path in the zip, path), caches and hidden files left out."""
    found: List[Tuple[str, Path]] = []
    root = driver.bundle_root
    for item in driver.bundle:
        assert root is not None
        if item.is_symlink():
            raise PackageError(f"{sources.display(item)}: a symbolic link; put the real file or folder there")
        if item.is_dir():
            prefix = item.relative_to(root).as_posix()
            found.extend(
                (f"{prefix}/{relative}", path) for relative, path in _tree_files(item, sources.display)
            )
        else:
            found.append((item.relative_to(root).as_posix(), item))
    return found


def build_driver_zip(driver: DriverSpec, sources: PackageSources) -> bytes:
    """Zip a driver folder with drivermetadata.xml and requirements.txt at the zip root."""
    files = _tree_files(driver.source, sources.display)
    if not files:
        raise PackageError(f"{sources.display(driver.source)}: driver {driver.name!r} has no files")
    entries: Dict[str, bytes] = {}
    existing_metadata: Optional[bytes] = None
    for relative, path in files:
        display = sources.display(path)
        if relative == REQUIREMENTS_PATH:
            raise PackageError(
                f"{display}: declare the requirements of driver {driver.name!r} in drivers.toml instead"
            )
        data = _read(path, display)
        if relative == DRIVER_METADATA_PATH:
            existing_metadata = data
        else:
            entries[relative] = data
    for relative, path in _bundle_files(driver, sources):
        if relative in entries or relative in (DRIVER_METADATA_PATH, REQUIREMENTS_PATH):
            raise PackageError(
                f"{sources.display(path)}: bundled into driver {driver.name!r} as {relative}, "
                "which the driver folder already has"
            )
        entries[relative] = _read(path, sources.display(path))
    entries[DRIVER_METADATA_PATH] = driver_metadata_xml(
        driver, existing_metadata, sources.display(driver.source / DRIVER_METADATA_PATH)
    )
    entries[REQUIREMENTS_PATH] = "".join(f"{line}\n" for line in driver.requirements).encode("utf-8")
    return deterministic_zip(sorted(entries.items()))


def _indent_of(parent: ElementTree.Element, child: ElementTree.Element) -> str:
    """The whitespace before ``child`` inside ``parent``, to lay out new siblings the same way."""
    children = list(parent)
    index = children.index(child)
    before = parent.text if index == 0 else children[index - 1].tail
    return before if before is not None and not before.strip() else "\n"


def _set_children(
    parent: ElementTree.Element, tag: str, items: Sequence[Tuple[Dict[str, str], Optional[str]]], indent: str
) -> None:
    """Replace ``parent``'s children with ``tag`` elements (attributes, text), one per line."""
    for child in list(parent):
        parent.remove(child)
    if not items:
        parent.text = None
        return
    step = "  "
    parent.text = indent + step
    for position, (attributes, text) in enumerate(items):
        element = ElementTree.SubElement(parent, tag, attributes)
        element.text = text
        element.tail = indent + (step if position < len(items) - 1 else "")


def _child(parent: ElementTree.Element, name: str, source: str, what: str) -> ElementTree.Element:
    element = parent.find(f"{{{DATAMODEL_NS}}}{name}")
    if element is None:
        raise PackageError(f"{source}: {what} has no <{name}> element for the build to fill")
    return element


def wire_datamodel(xml: bytes, manifest: Manifest, source: str = DATAMODEL_PATH) -> bytes:
    """Write each model's <Drivers><DriverName> and the <DriverDescriptors> from the manifest.

    Wiring already in the file must agree with drivers.toml; every model a driver serves must exist.
    """
    datamodel = parse_datamodel(xml, source)
    names = [driver.name for driver in manifest.drivers]
    for driver in manifest.drivers:
        for model in driver.models:
            if datamodel.model(model) is None:
                raise PackageError(
                    f"{manifest.path}: driver {driver.name!r} serves model {model!r}, "
                    f"which {source} does not define"
                )
    for family in datamodel.families:
        for model in family.models:
            if model.drivers and model.drivers != manifest.drivers_for(model.name):
                raise PackageError(
                    f"{source}: model {model.name!r} names driver(s) {', '.join(model.drivers)} "
                    f"but {manifest.path} declares {', '.join(manifest.drivers_for(model.name)) or 'none'}"
                )
    for descriptor in datamodel.driver_descriptors:
        if descriptor not in names:
            raise PackageError(
                f"{source}: <DriverDescriptors> declares {descriptor!r}, which {manifest.path} does not"
            )

    root = parse_xml(xml, source, keep_comments=True)
    ns = f"{{{DATAMODEL_NS}}}"
    for family in root.iterfind(f"{ns}ResourceFamilies/{ns}ResourceFamily"):
        models = family.find(f"{ns}Models")
        for model in [] if models is None else models.iterfind(f"{ns}ResourceModel"):
            served = manifest.drivers_for(model.get("Name", ""))
            if not served and model.find(f"{ns}Drivers") is None:
                continue  # nothing to write, and no reason to require the element
            drivers = _child(model, "Drivers", source, f"model {model.get('Name')!r}")
            _set_children(
                drivers, f"{ns}DriverName", [({}, name) for name in served], _indent_of(model, drivers)
            )
    descriptors = _child(root, "DriverDescriptors", source, "<DataModelInfo>")
    _set_children(
        descriptors,
        f"{ns}DriverDescriptor",
        [({"Name": name, "DriverType": PYTHON_DRIVER_TYPE}, None) for name in names],
        _indent_of(root, descriptors),
    )
    return _serialize(root, DATAMODEL_NS)


def _package_files(sources: PackageSources) -> List[Tuple[str, bytes]]:
    """package/ mirrors the zip root: metadata.xml first, then any other package-level files."""
    display_dir = sources.display(sources.package_dir)
    if not sources.package_dir.is_dir():
        raise PackageError(f"{display_dir}: folder not found (it holds metadata.xml)")
    entries: List[Tuple[str, bytes]] = []
    for relative, path in _tree_files(sources.package_dir, sources.display):
        display = sources.display(path)
        if relative == DATAMODEL_PATH or relative.startswith(DRIVERS_FOLDER + "/"):
            raise PackageError(f"{display}: the build writes {relative}; remove this file")
        data = _read(path, display)
        if relative == METADATA_PATH:
            parse_metadata(data, display)
        elif relative.endswith(".xml"):
            parse_xml(data, display)
        entries.append((relative, data))
    if METADATA_PATH not in dict(entries):
        raise PackageError(f"{display_dir}/{METADATA_PATH}: not found")
    metadata = dict(entries)[METADATA_PATH]
    return [(METADATA_PATH, metadata)] + [entry for entry in entries if entry[0] != METADATA_PATH]


def _check_built(data: bytes, manifest: Manifest) -> None:
    """Read the built zip back with the import parser; it must match the manifest exactly."""
    try:
        package = read_package(data)
    except PackageError as error:
        raise PackageError(f"built package is invalid: {error}") from None
    missing = missing_drivers(package)
    if missing:
        model, driver = missing[0]
        raise PackageError(f"built package: model {model!r} names driver {driver!r}, which is not in the zip")
    if sorted(package.drivers) != sorted(driver.name for driver in manifest.drivers):
        raise PackageError(f"built package: its driver zips differ from {manifest.path}")
    for driver in manifest.drivers:
        metadata = package.driver_metadata[driver.name]
        if (metadata.version, metadata.python_version) != (driver.version, driver.python_version):
            raise PackageError(f"built package: driver {driver.name!r} metadata differs from {manifest.path}")


def build_package_bytes(sources: PackageSources) -> Tuple[bytes, Manifest]:
    """Validate the inputs and return the package zip's bytes and the manifest it was built from."""
    manifest = load_manifest(sources.manifest, sources.display(sources.manifest))
    package_files = _package_files(sources)
    datamodel_display = sources.display(sources.datamodel)
    datamodel_xml = _read(sources.datamodel, datamodel_display)
    check_mutex_datamodel(parse_datamodel(datamodel_xml, datamodel_display), datamodel_display)
    datamodel = wire_datamodel(datamodel_xml, manifest, datamodel_display)
    entries = [package_files[0], (DATAMODEL_PATH, datamodel), *package_files[1:]]
    for driver in sorted(manifest.drivers, key=lambda spec: spec.name):
        entries.append((f"{DRIVERS_FOLDER}/{driver.name}.zip", build_driver_zip(driver, sources)))
    data = deterministic_zip(entries)
    _check_built(data, manifest)
    return data, manifest


def build_package(sources: PackageSources, output: Path) -> BuildResult:
    """Build, check, then write the package to ``output`` atomically."""
    data, manifest = build_package_bytes(sources)
    partial = output.with_name(output.name + ".partial")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data)
        os.replace(partial, output)
    except OSError as error:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise PackageError(f"{output}: cannot be written: {error.strerror}") from None
    return BuildResult(
        path=output,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        drivers=tuple(driver.name for driver in manifest.drivers),
    )
