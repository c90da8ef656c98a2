"""The package format parser: the original package, our data model, and each kind of bad input."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Dict, Optional

import pytest

from cloudshell_mutex import protocol
from cloudshell_mutex.packaging.format import (
    DATAMODEL_PATH,
    DRIVERS_FOLDER,
    METADATA_PATH,
    PackageError,
    missing_drivers,
    parse_datamodel,
    parse_metadata,
    parse_version,
    read_package,
)

ROOT = Path(__file__).resolve().parents[2]
ORIGINAL = ROOT / "tests" / "assets" / "original_mutex_package"
OURS_DATAMODEL = ROOT / "DataModel" / "datamodel.xml"
OURS_METADATA = ROOT / "package" / "metadata.xml"

NS = 'xmlns="http://schemas.qualisystems.com/ResourceManagement/DataModelSchema.xsd"'

DRIVER_XML = '<Driver Name="{name}" Version="1.0.0" MainClass="driver.D" PythonVersion="3" />'


def make_zip(entries: Dict[str, bytes]) -> bytes:
    """A zip with the given entries, in the given order."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def datamodel(attributes: str = "", models: str = "", descriptors: str = "") -> bytes:
    """A datamodel.xml with one service family holding ``models``."""
    return (
        f'<?xml version="1.0" encoding="utf-8"?>\n<DataModelInfo {NS}>\n'
        f"<Attributes>{attributes}</Attributes>\n<ResourceFamilies>\n"
        '<ResourceFamily Name="F" IsService="true" ServiceType="Regular" IsAdminOnly="true">'
        f"<Models>{models}</Models></ResourceFamily>\n</ResourceFamilies>\n"
        f"<DriverDescriptors>{descriptors}</DriverDescriptors>\n</DataModelInfo>\n"
    ).encode()


def attribute(name: str, kind: str = "String", default: str = "") -> str:
    return f'<AttributeInfo Name="{name}" Type="{kind}" DefaultValue="{default}" IsReadOnly="false" />'


def model(name: str, attached=(), values: Optional[Dict[str, str]] = None, drivers=()) -> str:
    attached_xml = "".join(f'<AttachedAttribute Name="{a}" />' for a in attached)
    values_xml = "".join(f'<AttributeValue Name="{k}" Value="{v}" />' for k, v in (values or {}).items())
    drivers_xml = "".join(f"<DriverName>{d}</DriverName>" for d in drivers)
    return (
        f'<ResourceModel Name="{name}"><AttachedAttributes>{attached_xml}</AttachedAttributes>'
        f"<AttributeValues>{values_xml}</AttributeValues><Drivers>{drivers_xml}</Drivers></ResourceModel>"
    )


def driver_zip(name: str) -> bytes:
    return make_zip({"drivermetadata.xml": DRIVER_XML.format(name=name).encode(), "driver.py": b""})


def package(**overrides: bytes) -> Dict[str, bytes]:
    """The original package's entries, as a dict that tests modify."""
    entries = {
        METADATA_PATH: (ORIGINAL / "metadata.xml").read_bytes(),
        DATAMODEL_PATH: (ORIGINAL / "DataModel" / "datamodel.xml").read_bytes(),
    }
    entries.update(overrides)
    return entries


def test_original_package_parses_as_the_facts_describe(original_package_zip: Path) -> None:
    parsed = read_package(original_package_zip.read_bytes())
    assert parsed.metadata.server_version == "7.0"
    assert parsed.metadata.package_type == "CloudShellPackage"
    owner = parsed.datamodel.attributes[protocol.ATTR_OWNER]
    assert (owner.type, owner.default, owner.rules) == ("String", "", ("Configuration", "Setting"))
    (family,) = parsed.datamodel.families
    assert (family.name, family.is_service, family.service_type, family.is_admin_only) == (
        protocol.SERVICE_FAMILY,
        True,
        "Regular",
        True,
    )
    (service,) = family.models
    assert service.name == protocol.SERVICE_MODEL
    assert service.attributes == (protocol.ATTR_OWNER,)
    assert service.defaults == {protocol.ATTR_OWNER: ""}
    assert service.drivers == ()
    assert parsed.drivers == {}


def test_our_datamodel_is_a_superset_of_the_original() -> None:
    """A clean upgrade: same family, model and Mutex Owner definition; lease attributes added."""
    original = parse_datamodel((ORIGINAL / "DataModel" / "datamodel.xml").read_bytes())
    ours = parse_datamodel(OURS_DATAMODEL.read_bytes())
    assert ours.attributes[protocol.ATTR_OWNER] == original.attributes[protocol.ATTR_OWNER]
    (family,) = ours.families
    (original_family,) = original.families
    assert (family.name, family.is_service, family.service_type, family.is_admin_only) == (
        original_family.name,
        original_family.is_service,
        original_family.service_type,
        original_family.is_admin_only,
    )
    service = ours.model(protocol.SERVICE_MODEL)
    assert service is not None and service.family == protocol.SERVICE_FAMILY
    assert service.attributes == (protocol.ATTR_OWNER, *protocol.LEASE_ATTRIBUTES)
    for name in protocol.LEASE_ATTRIBUTES:
        assert name.startswith("Mutex ")
    types = {name: ours.attributes[name].type for name in protocol.LEASE_ATTRIBUTES}
    assert types == {
        protocol.ATTR_LABEL: "String",
        protocol.ATTR_LEASE_SECONDS: "Numeric",
        protocol.ATTR_HEARTBEAT: "String",
        protocol.ATTR_GENERATION: "Numeric",
    }
    assert service.defaults == {
        protocol.ATTR_OWNER: "",
        protocol.ATTR_LABEL: "",
        protocol.ATTR_LEASE_SECONDS: "0",
        protocol.ATTR_HEARTBEAT: "",
        protocol.ATTR_GENERATION: "0",
    }


def test_our_metadata_parses() -> None:
    metadata = parse_metadata(OURS_METADATA.read_bytes())
    assert metadata.package_type == "CloudShellPackage"
    assert metadata.server_version_info >= (7, 1, 0)


def test_malformed_xml_names_file_line_and_problem() -> None:
    bad = b'<?xml version="1.0"?>\n<DataModelInfo>\n  <Attributes>\n</DataModelInfo>\n'
    with pytest.raises(PackageError) as caught:
        read_package(make_zip(package(**{DATAMODEL_PATH: bad})))
    message = str(caught.value)
    assert message.startswith(f"{DATAMODEL_PATH}: not well-formed XML (line 4, column 3)")
    assert message.endswith("mismatched tag")


def test_missing_metadata() -> None:
    entries = package()
    del entries[METADATA_PATH]
    with pytest.raises(PackageError, match=r"^metadata\.xml missing from the zip root$"):
        read_package(make_zip(entries))


def test_metadata_in_a_subfolder_is_not_at_the_root() -> None:
    entries = package()
    entries["Mutex_Package/" + METADATA_PATH] = entries.pop(METADATA_PATH)
    with pytest.raises(PackageError, match="missing from the zip root"):
        read_package(make_zip(entries))


def test_missing_datamodel() -> None:
    entries = package()
    del entries[DATAMODEL_PATH]
    with pytest.raises(PackageError, match=r"^DataModel/datamodel\.xml missing"):
        read_package(make_zip(entries))


def test_not_a_zip() -> None:
    with pytest.raises(PackageError, match="not a zip file"):
        read_package(b"<Metadata/>")


def test_attached_attribute_must_be_defined() -> None:
    xml = datamodel(attribute("A"), model("M", attached=("A", "X")))
    with pytest.raises(PackageError) as caught:
        parse_datamodel(xml)
    assert str(caught.value) == (
        f"{DATAMODEL_PATH}: model 'M' attaches attribute 'X' that is not defined in <Attributes>"
    )


def test_wrong_namespace_is_refused() -> None:
    xml = b'<DataModelInfo xmlns="urn:other"><Attributes /></DataModelInfo>'
    with pytest.raises(PackageError, match="root element must be <DataModelInfo xmlns="):
        parse_datamodel(xml)
    with pytest.raises(PackageError, match="root element must be <Metadata"):
        parse_metadata(b"<Metadata><ServerVersion>9.3</ServerVersion></Metadata>")


@pytest.mark.parametrize(
    ("xml", "problem"),
    [
        (datamodel(attribute("A", "Text")), "attribute 'A' has Type 'Text'"),
        (
            datamodel(attribute("A", "Numeric", "zero")),
            "<Attributes> defaults Numeric attribute 'A' to 'zero', which is not a number",
        ),
        (
            datamodel(attribute("A", "Numeric"), model("M", ["A"], {"A": "1x"})),
            "model 'M' sets Numeric attribute 'A' to '1x', which is not a number",
        ),
        (datamodel(attribute("A") + attribute("A")), "attribute 'A' is defined twice"),
        (
            datamodel(attribute("A"), model("M", ["A"], {"B": ""})),
            "model 'M' sets a value for attribute 'B' that it does not attach",
        ),
        (datamodel("", model("M") + model("M")), "model 'M' is defined twice"),
        (
            datamodel("", model("M", drivers=["D"])),
            "model 'M' names driver 'D' that is not declared in <DriverDescriptors>",
        ),
        (datamodel('<AttributeInfo Type="String" />'), "an <AttributeInfo> has no Name attribute"),
    ],
)
def test_datamodel_problems(xml: bytes, problem: str) -> None:
    with pytest.raises(PackageError) as caught:
        parse_datamodel(xml)
    assert str(caught.value).startswith(f"{DATAMODEL_PATH}: {problem}")


def test_dtd_is_refused() -> None:
    xml = b'<!DOCTYPE x [<!ENTITY a "aaaa">]><DataModelInfo>&a;</DataModelInfo>'
    with pytest.raises(PackageError, match="DTDs and entity declarations are not allowed"):
        parse_datamodel(xml)


def test_dtd_is_refused_in_any_encoding() -> None:
    """A byte search for <!DOCTYPE misses UTF-16, which expat reads."""
    xml = '<?xml version="1.0" encoding="utf-16"?><!DOCTYPE x [<!ENTITY a "aaaa">]><x>&a;</x>'
    with pytest.raises(PackageError, match="DTDs and entity declarations are not allowed"):
        parse_datamodel(xml.encode("utf-16"))


def test_doctype_text_inside_a_comment_is_fine() -> None:
    xml = datamodel().replace(b"<Attributes>", b"<!-- not a <!DOCTYPE here --><Attributes>")
    assert parse_datamodel(xml).families[0].name == "F"


def test_versions_compare_as_numbers_without_trailing_zeros() -> None:
    """A server that reports 9.3 accepts a package built for 9.3.0."""
    assert parse_version("9.3.0") == parse_version("9.3") == (9, 3)
    assert parse_version("10.0.1") > parse_version("9.3")
    assert parse_version("2020.1") > parse_version("9.3.0.0")


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("<CreationDate>x</CreationDate><ServerVersion>9.3.0</ServerVersion>", "<PackageType> is missing"),
        (
            "<CreationDate>x</CreationDate><ServerVersion>latest</ServerVersion>"
            "<PackageType>CloudShellPackage</PackageType>",
            "ServerVersion 'latest' is not a version",
        ),
        (
            "<CreationDate>x</CreationDate><ServerVersion>9.3</ServerVersion><PackageType>Shell</PackageType>",
            "PackageType is 'Shell'",
        ),
    ],
)
def test_metadata_problems(body: str, problem: str) -> None:
    xml = f'<Metadata xmlns="http://schemas.qualisystems.com/PackageMetadataSchema.xsd">{body}</Metadata>'
    with pytest.raises(PackageError) as caught:
        parse_metadata(xml.encode(), "metadata.xml")
    assert str(caught.value).startswith(f"metadata.xml: {problem}")


def test_drivers_are_read_and_checked() -> None:
    xml = datamodel(
        attribute("A"),
        model("M", ["A"], drivers=["Mutex Driver"]) + model("N", drivers=["Elsewhere"]),
        '<DriverDescriptor Name="Mutex Driver" DriverType="PythonDriver" />'
        '<DriverDescriptor Name="Elsewhere" DriverType="PythonDriver" />',
    )
    data = driver_zip("Mutex Driver")
    parsed = read_package(
        make_zip(package(**{DATAMODEL_PATH: xml, f"{DRIVERS_FOLDER}/Mutex Driver.zip": data}))
    )
    assert parsed.drivers == {"Mutex Driver": data}
    assert parsed.driver_metadata["Mutex Driver"].python_version == "3"
    assert parsed.datamodel.model("M").drivers == ("Mutex Driver",)
    assert missing_drivers(parsed) == [("N", "Elsewhere")]


def test_driver_zip_must_match_its_metadata_name() -> None:
    xml = datamodel(descriptors='<DriverDescriptor Name="D" DriverType="PythonDriver" />')
    entries = package(**{DATAMODEL_PATH: xml, f"{DRIVERS_FOLDER}/D.zip": driver_zip("Other")})
    with pytest.raises(PackageError, match="driver Name 'Other' differs from the zip's name 'D'"):
        read_package(make_zip(entries))


def test_driver_zip_needs_drivermetadata() -> None:
    xml = datamodel(descriptors='<DriverDescriptor Name="D" DriverType="PythonDriver" />')
    entries = package(**{DATAMODEL_PATH: xml, f"{DRIVERS_FOLDER}/D.zip": make_zip({"driver.py": b""})})
    with pytest.raises(PackageError, match=r"^Resource Drivers - Python/D\.zip: drivermetadata\.xml missing"):
        read_package(make_zip(entries))


def test_undeclared_driver_zip_is_refused() -> None:
    entries = package(**{f"{DRIVERS_FOLDER}/D.zip": driver_zip("D")})
    with pytest.raises(PackageError, match="driver 'D' is not declared"):
        read_package(make_zip(entries))


def test_unsafe_entry_names_are_refused() -> None:
    entries = package(**{"../evil.txt": b"x"})
    with pytest.raises(PackageError, match="is not a plain relative path"):
        read_package(make_zip(entries))


def test_folder_entries_as_zip_tools_write_them_are_accepted() -> None:
    xml = datamodel(descriptors='<DriverDescriptor Name="D" DriverType="PythonDriver" />')
    entries = {"DataModel/": b"", f"{DRIVERS_FOLDER}/": b"", **package(**{DATAMODEL_PATH: xml})}
    entries[f"{DRIVERS_FOLDER}/D.zip"] = driver_zip("D")
    assert sorted(read_package(make_zip(entries)).drivers) == ["D"]
