"""The two published original packages, and our package over each (QualiSystemsLab/Reservation-Mutex-Lock)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import Callable, List, Tuple
from xml.etree import ElementTree

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue

from cloudshell_mutex import protocol
from cloudshell_mutex.packaging.build import PackageSources, build_package_bytes
from cloudshell_mutex.packaging.format import DATAMODEL_NS, DATAMODEL_PATH, METADATA_PATH, read_package

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
OURS = ROOT / "DataModel" / "datamodel.xml"
NS = f"{{{DATAMODEL_NS}}}"

#: Git blob ids of the published files (tests/assets/README.md): the assets must stay byte-exact copies.
_NO_ATTRIBUTES = "original_mutex_package_no_attributes"
PUBLISHED_BLOBS = {
    "original_mutex_package/DataModel/datamodel.xml": "e2ca35391b40de6bccb77770579d759039c0ab51",
    "original_mutex_package/metadata.xml": "4cb42a3a5e1334140f64d2bda0c8895e1bace0b8",
    f"{_NO_ATTRIBUTES}/DataModel/datamodel.xml": "6dcb8438badb8c2729e8b195ea9ac9637a3e0d16",
    f"{_NO_ATTRIBUTES}/metadata.xml": "4cb42a3a5e1334140f64d2bda0c8895e1bace0b8",
}


def git_blob_id(data: bytes) -> str:
    """What `git hash-object` prints for a file with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def canonical(element: ElementTree.Element) -> Tuple:
    """An element as comparable data: tag, attributes (any order), non-blank text, children; no comments."""
    children = [canonical(child) for child in element if isinstance(child.tag, str)]
    return (element.tag, sorted(element.attrib.items()), (element.text or "").strip(), children)


def find(root: ElementTree.Element, path: str) -> ElementTree.Element:
    element = root.find(path.replace("ns:", NS))
    assert element is not None, path
    return element


MUTEX_OWNER = "ns:Attributes/ns:AttributeInfo[@Name='Mutex Owner']"
FAMILY = "ns:ResourceFamilies/ns:ResourceFamily[@Name='Mutex Service Family']"
MODEL = f"{FAMILY}/ns:Models/ns:ResourceModel[@Name='Mutex Service']"
ATTACHED_OWNER = f"{MODEL}/ns:AttachedAttributes/ns:AttachedAttribute[@Name='Mutex Owner']"


@pytest.mark.parametrize("relative", sorted(PUBLISHED_BLOBS))
def test_the_assets_are_the_published_files(relative: str) -> None:
    data = (ASSETS / relative).read_bytes()
    assert git_blob_id(data) == PUBLISHED_BLOBS[relative]
    assert b"\r\n" in data  # a checkout that converted line endings would fail the line above first


@pytest.mark.parametrize("fixture", ["original_package_zip", "original_package_no_attributes_zip"])
def test_the_fixtures_are_zipped_as_the_original(fixture: str, request: pytest.FixtureRequest) -> None:
    """7-Zip's layout: a DataModel/ folder entry, deflated files, a UTF-8 BOM and both namespaces."""
    with zipfile.ZipFile(request.getfixturevalue(fixture)) as archive:
        infos = archive.infolist()
        assert [info.filename for info in infos] == ["DataModel/", DATAMODEL_PATH, METADATA_PATH]
        assert [info.compress_type for info in infos[1:]] == [zipfile.ZIP_DEFLATED] * 2
        datamodel = archive.read(DATAMODEL_PATH)
    assert datamodel.startswith(b"\xef\xbb\xbf<?xml")
    assert b'xmlns:xsd="http://www.w3.org/2001/XMLSchema"' in datamodel
    assert b'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"' in datamodel


def test_the_2017_package_defines_mutex_owner(original_package_zip: Path) -> None:
    package = read_package(original_package_zip.read_bytes())
    assert (package.metadata.creation_date, package.metadata.server_version) == ("2016-1-22", "7.0")
    owner = package.datamodel.attributes[protocol.ATTR_OWNER]
    assert (owner.type, owner.default, owner.read_only, owner.rules, owner.rules_override) == (
        "String",
        "",
        False,
        ("Configuration", "Setting"),
        "false",
    )
    assert owner.description.startswith("Mutex usage: Try to add Mutex Service to the reservation")
    (family,) = package.datamodel.families
    assert (family.name, family.allow_remote_connection, family.is_admin_only) == (
        protocol.SERVICE_FAMILY,
        False,
        True,
    )
    assert [model.attributes for model in family.models] == [(protocol.ATTR_OWNER,)]


def test_the_current_source_package_has_no_attributes(original_package_no_attributes_zip: Path) -> None:
    package = read_package(original_package_no_attributes_zip.read_bytes())
    assert package.metadata.server_version == "7.0"
    assert package.datamodel.attributes == {}
    (family,) = package.datamodel.families
    assert (family.name, family.is_service, family.service_type, family.is_admin_only) == (
        protocol.SERVICE_FAMILY,
        True,
        "Regular",
        True,
    )
    assert [(model.name, model.attributes) for model in family.models] == [(protocol.SERVICE_MODEL, ())]


@pytest.mark.parametrize(
    ("path", "what"),
    [
        (MUTEX_OWNER, "the <AttributeInfo> of Mutex Owner, with its Description and <Rules>"),
        (ATTACHED_OWNER, "how the model attaches Mutex Owner"),
    ],
)
def test_ours_defines_mutex_owner_exactly_as_the_original(path: str, what: str) -> None:
    original = ElementTree.parse(ASSETS / "original_mutex_package" / "DataModel" / "datamodel.xml").getroot()
    ours = ElementTree.parse(OURS).getroot()
    assert canonical(find(ours, path)) == canonical(find(original, path)), what


def test_our_family_and_model_keep_the_original_attributes() -> None:
    """Every attribute the original sets on the family and the model, ours sets to the same value."""
    for folder in ("original_mutex_package", "original_mutex_package_no_attributes"):
        original = ElementTree.parse(ASSETS / folder / "DataModel" / "datamodel.xml").getroot()
        ours = ElementTree.parse(OURS).getroot()
        for path in (FAMILY, MODEL):
            assert find(ours, path).attrib == find(original, path).attrib, (folder, path)


def service_attributes(session) -> List[Tuple[str, str, str]]:
    """The catalog's Mutex Service attributes as (name, type, default)."""
    (service,) = session.GetServices("", protocol.SERVICE_MODEL).Services
    return [(a.Name, a.Type, a.DefaultValue) for a in service.Attributes]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("fixture", "before"),
    [
        ("original_package_zip", [(protocol.ATTR_OWNER, "String", "")]),
        ("original_package_no_attributes_zip", []),
    ],
)
def test_ours_imports_over_each_original(
    cloudshell_emulator_factory: Callable, request: pytest.FixtureRequest, fixture: str, before: list
) -> None:
    original = request.getfixturevalue(fixture)
    emulator = cloudshell_emulator_factory(catalog="permissive")  # to read the model back
    emulator.import_package(original)
    session = emulator.session()
    assert service_attributes(session) == before
    # Old code, v1 (no attributes) or v2 (Mutex Owner, where the model has it), locks with the original.
    old = [AttributeNameValue(protocol.ATTR_OWNER, "old")] if before else []
    session.AddServiceToReservation(
        emulator.create_reservation(), protocol.SERVICE_MODEL, protocol.DEFAULT_ALIAS, old
    )

    data, _ = build_package_bytes(PackageSources.in_tree(ROOT))
    emulator.import_package(data)
    assert service_attributes(session) == [
        (protocol.ATTR_OWNER, "String", ""),
        (protocol.ATTR_LABEL, "String", ""),
        (protocol.ATTR_LEASE_SECONDS, "Numeric", "0"),
        (protocol.ATTR_HEARTBEAT, "String", ""),
        (protocol.ATTR_GENERATION, "Numeric", "0"),
    ]
    reservation = emulator.create_reservation()
    session.AddServiceToReservation(
        reservation,
        protocol.SERVICE_MODEL,
        protocol.DEFAULT_ALIAS,
        [AttributeNameValue(protocol.ATTR_OWNER, "new")],
    )
    details = session.GetReservationDetails(reservation, True).ReservationDescription
    (service,) = details.Services
    assert {a.Name: a.Value for a in service.Attributes}[protocol.ATTR_OWNER] == "new"
