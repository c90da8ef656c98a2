"""``cloudshell-mutex install`` without a server: settings, answer checks, errors, and no password leaks."""

from __future__ import annotations

import argparse
import io
import json
import socket
import time
import zipfile
from pathlib import Path
from typing import List, Optional
from urllib.parse import quote, quote_plus

import pytest
import requests

from cloudshell_mutex import cli
from cloudshell_mutex.packaging import command
from cloudshell_mutex.packaging.install import (
    InstallError,
    check_import_answer,
    resolve_settings,
)

SECRET = "s3cret-Pa55word"


def parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    return parser.parse_args(["install", *argv])


def answer(status: int, body: bytes) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response._content = body
    return response


def closed_port() -> int:
    """A loopback port that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_flags_then_environment_then_config_then_defaults(tmp_path: Path) -> None:
    (tmp_path / "cloudshell_config.yml").write_text(
        "install:\n  host: cfg-host\n  port: 9100\n  username: cfg-user\n"
        "  password: cfg-pw\n  domain: CfgDomain\n"
    )
    environ = {"CLOUDSHELL_PORT": "9200", "CLOUDSHELL_USERNAME": "env-user"}
    settings = resolve_settings(parse(["--username", "flag-user"]), environ, cwd=tmp_path)
    assert (settings.host, settings.port, settings.username, settings.password, settings.domain) == (
        "cfg-host",
        9200,
        "flag-user",
        "cfg-pw",
        "CfgDomain",
    )
    defaults = resolve_settings(parse([]), {"CLOUDSHELL_PASSWORD": SECRET}, cwd=tmp_path / "nowhere")
    assert (defaults.host, defaults.port, defaults.username, defaults.domain) == (
        "localhost",
        9000,
        "admin",
        "Global",
    )
    assert defaults.package == Path("dist/Mutex_Package.zip")
    assert defaults.password == SECRET
    assert SECRET not in repr(defaults)


def test_explicit_config_path(tmp_path: Path) -> None:
    config = tmp_path / "elsewhere.yml"
    config.write_text("install:\n  password: from-file\n")
    settings = resolve_settings(parse(["--config", str(config)]), {}, cwd=tmp_path)
    assert settings.password == "from-file"
    with pytest.raises(InstallError, match=r"missing\.yml: not found"):
        resolve_settings(parse(["--config", str(tmp_path / "missing.yml")]), {}, cwd=tmp_path)


def test_a_password_is_required(tmp_path: Path) -> None:
    with pytest.raises(InstallError, match="no password: set CLOUDSHELL_PASSWORD"):
        resolve_settings(parse([]), {}, cwd=tmp_path)


def test_bad_port(tmp_path: Path) -> None:
    with pytest.raises(InstallError, match="port 'http' is not a TCP port number"):
        resolve_settings(parse(["--port", "http", "--password", "x"]), {}, cwd=tmp_path)


@pytest.mark.parametrize(
    "typo",
    [
        ["--passwd", SECRET],
        [f"--passwd={SECRET}"],
        ["--host", "h", SECRET],
        [f"--p={SECRET}"],
        ["--pa", SECRET],
    ],
)
def test_a_mistyped_flag_does_not_echo_the_password(typo: List[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["install", *typo])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "error: unrecognized arguments: " in err
    assert SECRET not in err


def test_broken_yaml_does_not_echo_the_password(tmp_path: Path) -> None:
    (tmp_path / "cloudshell_config.yml").write_text(f'install:\n  password: "{SECRET}\n  host: [\n')
    with pytest.raises(InstallError) as caught:
        resolve_settings(parse([]), {}, cwd=tmp_path)
    assert "cloudshell_config.yml: not valid YAML (line" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_config_values_reach_the_server_as_written(tmp_path: Path) -> None:
    """YAML would read 0123 as 83 and yes as True; an empty value falls through to the default."""
    (tmp_path / "cloudshell_config.yml").write_text("install:\n  password: 0123\n  domain: yes\n  host:\n")
    settings = resolve_settings(parse([]), {}, cwd=tmp_path)
    assert (settings.password, settings.domain, settings.host) == ("0123", "yes", "localhost")
    (tmp_path / "cloudshell_config.yml").write_text("install:\n  password: 12:30\n  port: 9100\n")
    settings = resolve_settings(parse([]), {}, cwd=tmp_path)
    assert (settings.password, settings.port) == ("12:30", 9100)


def test_a_config_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "cloudshell_config.yml").write_bytes(b"install:\n  password: p\xe4ss\n")
    with pytest.raises(InstallError) as caught:
        resolve_settings(parse([]), {}, cwd=tmp_path)
    assert (
        str(caught.value)
        == f"{tmp_path / 'cloudshell_config.yml'}: not UTF-8 text (byte 22); save it as UTF-8"
    )


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_bad_timeout(tmp_path: Path, timeout: str) -> None:
    with pytest.raises(InstallError, match="--timeout must be a positive number of seconds"):
        resolve_settings(parse(["--password", "x", "--timeout", timeout]), {}, cwd=tmp_path)


@pytest.mark.parametrize(
    "secret",
    ["p@ss w0rd&1", 'quo"te\\back', "pässwörd"],
)
def test_the_password_is_masked_as_a_form_or_json_writes_it(secret: str) -> None:
    """A proxy or server that echoes the login request shows the password encoded."""
    echo = f"password={quote_plus(secret)}&username=admin {quote(secret, safe='')} {json.dumps(secret)}"
    for status, body in (
        (500, echo.encode()),
        (200, json.dumps({"Success": False, "Message": echo}).encode()),
    ):
        with pytest.raises(InstallError) as caught:
            check_import_answer(answer(status, body), secret)
        message = str(caught.value)
        for form in (secret, quote_plus(secret), quote(secret, safe=""), json.dumps(secret)[1:-1]):
            assert form not in message
        assert "username=admin" in message


@pytest.mark.parametrize(
    ("status", "body", "problem"),
    [
        (
            200,
            b'{"Success": false, "ErrorMessage": "bad package"}',
            "the server refused the package: bad package",
        ),
        (200, b'{"Success": false, "Message": "other"}', "the server refused the package: other"),
        (200, b"", "without a JSON Success field"),
        (200, b"<html>ok</html>", "without a JSON Success field"),
        (500, b"boom", "import failed with HTTP 500: boom"),
        (404, b"", "no Package/ImportPackage endpoint"),
        (401, b"", "refused the login token"),
        (
            200,
            f'{{"Success": false, "ErrorMessage": "pw {SECRET}"}}'.encode(),
            "refused the package: pw ****",
        ),
    ],
)
def test_the_answer_body_is_checked(status: int, body: bytes, problem: str) -> None:
    with pytest.raises(InstallError) as caught:
        check_import_answer(answer(status, body), SECRET)
    assert problem in str(caught.value)
    assert SECRET not in str(caught.value)


def test_a_successful_answer() -> None:
    check_import_answer(answer(200, b'{"Success": true, "ErrorMessage": null}'), SECRET)


def run(argv: List[str], capsys: pytest.CaptureFixture, cwd: Optional[Path] = None) -> tuple:
    args = parse(argv)
    code = args.func(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_unreachable_server(original_package_zip: Path, capsys: pytest.CaptureFixture) -> None:
    port = closed_port()
    code, output = run(
        [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--password",
            SECRET,
            "--package",
            str(original_package_zip),
        ],
        capsys,
    )
    assert code == 1
    assert f"error: cannot connect to the Quali API at http://127.0.0.1:{port}/API/" in output
    assert SECRET not in output


def test_a_server_that_never_answers(original_package_zip: Path, capsys: pytest.CaptureFixture) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # connections are accepted by the kernel and never answered
        port = silent.getsockname()[1]
        started = time.monotonic()
        code, output = run(
            [
                *("--host", "127.0.0.1", "--port", str(port), "--timeout", "0.3"),
                *("--password", SECRET, "--package", str(original_package_zip)),
            ],
            capsys,
        )
    assert code == 1
    assert f"error: the Quali API at http://127.0.0.1:{port}/API/ did not answer within 0.3 s" in output
    assert time.monotonic() - started < 5
    assert SECRET not in output


def test_a_malformed_package_is_refused_before_upload(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("metadata.xml", "<Metadata")
        archive.writestr("DataModel/datamodel.xml", "<DataModelInfo/>")
    package = tmp_path / "bad.zip"
    package.write_bytes(buffer.getvalue())
    # The port is closed: the error must come from local validation, before any connection.
    code, output = run(
        ["--port", str(closed_port()), "--password", SECRET, "--package", str(package)], capsys
    )
    assert code == 1
    assert f"error: {package}: metadata.xml: not well-formed XML (line 1, column 1): unclosed token" in output
    assert SECRET not in output


def test_a_missing_package(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, output = run(["--password", SECRET, "--package", str(tmp_path / "none.zip")], capsys)
    assert code == 1
    assert "none.zip: not found; build it with `make package`" in output
