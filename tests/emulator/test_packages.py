"""Package import through the unmodified PackagingRestApiClient (Quali API) into the emulator's catalog."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import requests
from cloudshell.api.cloudshell_api import AttributeNameValue
from cloudshell.api.common_cloudshell_api import CloudShellAPIError
from cloudshell.rest.api import PackagingRestApiClient
from cloudshell.rest.exceptions import LoginFailedError

from cloudshell_mutex.emulator import Emulator, EmulatorControlError
from cloudshell_mutex.lock.protocol import ATTR_OWNER, DEFAULT_ALIAS, SERVICE_MODEL

pytestmark = pytest.mark.integration

DATAMODEL_NS = "http://schemas.qualisystems.com/ResourceManagement/DataModelSchema.xsd"


def metadata(server_version: str = "9.3.0") -> str:
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<Metadata xmlns="http://schemas.qualisystems.com/PackageMetadataSchema.xsd">'
        f"<CreationDate>01/01/2026 00:00:00</CreationDate><ServerVersion>{server_version}</ServerVersion>"
        "<PackageType>CloudShellPackage</PackageType></Metadata>"
    )


#: A service family with a default, and a resource family, for CreateResource.
DATAMODEL = f"""<?xml version="1.0" encoding="utf-8"?>
<DataModelInfo xmlns="{DATAMODEL_NS}">
  <Attributes>
    <AttributeInfo Name="Colour" Type="String" DefaultValue="blue" IsReadOnly="false">
      <Rules /></AttributeInfo>
    <AttributeInfo Name="Ports" Type="Numeric" DefaultValue="4" IsReadOnly="false">
      <Rules /></AttributeInfo>
  </Attributes>
  <ResourceFamilies>
    <ResourceFamily Name="Paint Family" IsService="true" ServiceType="Regular" IsAdminOnly="false">
      <AttachedAttributes /><AttributeValues />
      <Models>
        <ResourceModel Name="Paint Service">
          <AttachedAttributes>
            <AttachedAttribute Name="Colour" IsOverridable="true" IsLocal="true" UserInput="true" />
          </AttachedAttributes>
          <AttributeValues><AttributeValue Name="Colour" Value="green" /></AttributeValues>
          <ParentModels /><Drivers /><Scripts />
        </ResourceModel>
      </Models>
      <Categories />
    </ResourceFamily>
    <ResourceFamily Name="Switch" IsService="false" IsAdminOnly="false">
      <AttachedAttributes /><AttributeValues />
      <Models>
        <ResourceModel Name="Switch Model">
          <AttachedAttributes>
            <AttachedAttribute Name="Ports" IsOverridable="true" IsLocal="true" UserInput="true" />
          </AttachedAttributes>
          <AttributeValues />
          <ParentModels /><Drivers /><Scripts />
        </ResourceModel>
      </Models>
      <Categories />
    </ResourceFamily>
  </ResourceFamilies>
  <DriverDescriptors /><ScriptDescriptors />
</DataModelInfo>
"""


def make_zip(files: dict) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


def quali_login(emu: Emulator) -> PackagingRestApiClient:
    return PackagingRestApiClient.login("127.0.0.1", emu.admin_user, emu.admin_password, port=emu.quali_port)


def raw_import(emu: Emulator, client: PackagingRestApiClient, data: bytes) -> dict:
    """What the server answers to an import (the client itself only checks the HTTP status)."""
    response = requests.post(
        f"{emu.quali_url}/API/Package/ImportPackage",
        files={"file": ("package.zip", data)},
        headers={"Authorization": f"Basic {client._token}"},
        timeout=10,
    )
    assert response.status_code == 200
    return response.json()


def test_imported_original_package_makes_the_model_usable(
    cloudshell_emulator: Emulator, original_package_zip: Path
):
    emu = cloudshell_emulator
    emu.control.configure(catalog="permissive")  # to read the model back from GetServices
    api = emu.session()
    rid = emu.create_reservation()
    with pytest.raises(CloudShellAPIError) as info:
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, [])
    error = info.value
    assert error.message == f"Service model '{SERVICE_MODEL}' was not found in the catalog"

    quali_login(emu).import_package(original_package_zip)

    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, [AttributeNameValue(ATTR_OWNER, "me")])
    [service] = api.GetReservationDetails(rid, True).ReservationDescription.Services
    assert [(a.Name, a.Value) for a in service.Attributes] == [(ATTR_OWNER, "me")]
    [info] = api.GetServices("", SERVICE_MODEL).Services
    assert [a.Name for a in info.Attributes] == [ATTR_OWNER]
    # The original package has no lease attributes: the server refuses them, as a real one would.
    with pytest.raises(CloudShellAPIError) as info:
        api.SetServiceAttributesValues(rid, DEFAULT_ALIAS, [AttributeNameValue("Mutex Lease Seconds", "30")])
    error = info.value
    assert (
        error.message == f"Attribute 'Mutex Lease Seconds' is not defined on service model '{SERVICE_MODEL}'"
    )


def test_defaults_types_and_resource_models_come_from_the_package(
    cloudshell_emulator: Emulator, tmp_path: Path
):
    emu = cloudshell_emulator
    emu.control.configure(catalog="permissive")  # to read the models back from GetServices
    path = tmp_path / "Paint.zip"
    path.write_bytes(make_zip({"metadata.xml": metadata(), "DataModel/datamodel.xml": DATAMODEL}))
    quali_login(emu).import_package(path)
    api = emu.session()
    [info] = api.GetServices("", "Paint Service").Services
    assert [(a.Name, a.Type, a.DefaultValue) for a in info.Attributes] == [("Colour", "String", "green")]
    rid = emu.create_reservation()
    api.AddServiceToReservation(rid, "Paint Service", "paint", [])
    [service] = api.GetReservationDetails(rid, True).ReservationDescription.Services
    assert [(a.Name, a.Value) for a in service.Attributes] == [("Colour", "green")]
    resource = api.CreateResource("Switch", "Switch Model", "sw1", "10.1.1.1", "", "", "")
    assert [(a.Name, a.Value, a.Type) for a in resource.ResourceAttributes] == [("Ports", "4", "Numeric")]
    with pytest.raises(CloudShellAPIError) as info:
        api.AddServiceToReservation(rid, "Switch Model", "x", [])
    error = info.value
    assert error.message == "Service model 'Switch Model' was not found in the catalog"


@pytest.mark.parametrize(
    "files, problem",
    [
        ({"DataModel/datamodel.xml": DATAMODEL}, "metadata.xml"),
        ({"metadata.xml": metadata()}, "DataModel/datamodel.xml"),
        (
            {"metadata.xml": metadata(), "DataModel/datamodel.xml": "<DataModelInfo><oops></DataModelInfo>"},
            "datamodel",
        ),
        (
            {"metadata.xml": metadata("2099.1"), "DataModel/datamodel.xml": DATAMODEL},
            "newer than this server",
        ),
    ],
)
def test_bad_packages_are_refused_with_a_message_naming_the_problem(
    cloudshell_emulator: Emulator, files: dict, problem: str
):
    emu = cloudshell_emulator
    client = quali_login(emu)
    answer = raw_import(emu, client, make_zip(files))
    assert answer["Success"] is False
    assert problem in answer["ErrorMessage"]
    assert emu.session().GetServices("", "").Services == []  # nothing registered


def test_malformed_zip_is_refused_and_the_rest_client_does_not_notice(
    cloudshell_emulator: Emulator, tmp_path: Path
):
    emu = cloudshell_emulator
    client = quali_login(emu)
    path = tmp_path / "broken.zip"
    path.write_bytes(b"PK\x03\x04 this is not really a zip")
    answer = raw_import(emu, client, path.read_bytes())
    assert answer == {"Success": False, "ErrorMessage": answer["ErrorMessage"]}
    assert "zip" in answer["ErrorMessage"]
    client.import_package(path)  # HTTP 200: the PyPI client reports success, as against the real server
    assert emu.session().GetServices("", "").Services == []
    with pytest.raises(EmulatorControlError, match="zip"):
        emu.control.import_package(path.read_bytes())


def test_quali_login_and_authorization(cloudshell_emulator: Emulator, original_package_zip: Path):
    emu = cloudshell_emulator
    with pytest.raises(LoginFailedError):
        PackagingRestApiClient.login("127.0.0.1", emu.admin_user, "wrong", port=emu.quali_port)
    forged = PackagingRestApiClient("127.0.0.1", "forged-token", port=emu.quali_port)
    with pytest.raises(Exception, match="Unauthorized"):
        forged.import_package(original_package_zip)
    emu.control.add_user("bob", "pw")
    bob = PackagingRestApiClient.login("127.0.0.1", "bob", "pw", port=emu.quali_port)
    assert raw_import(emu, bob, original_package_zip.read_bytes())["ErrorMessage"].startswith(
        "Importing packages"
    )


def test_packages_preloaded_at_start_and_imported_in_process(
    cloudshell_emulator_factory, original_package_zip: Path
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip], catalog="permissive")
    assert [s.Name for s in emu.session().GetServices("", "").Services] == [SERVICE_MODEL]
    summary = emu.import_package(make_zip({"metadata.xml": metadata(), "DataModel/datamodel.xml": DATAMODEL}))
    assert summary == {"services": ["Paint Service"], "resources": ["Switch Model"], "drivers": []}
    with pytest.raises(ValueError, match="not a zip"):
        cloudshell_emulator_factory(packages=[b"nonsense"])
