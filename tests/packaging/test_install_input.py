"""`cloudshell-mutex install`: bad settings get a clear error, never a traceback; no secret is printed."""

from __future__ import annotations

import argparse
import base64
import http.server
import platform
import socket
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from cloudshell_mutex import cli
from cloudshell_mutex.packaging import command
from cloudshell_mutex.settings import (
    InstallError,
    redact_userinfo,
    resolve_settings,
    shellfoundry_password,
)

SECRET = "Pw-s3cret-17"


def parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    return parser.parse_args(["install", *argv])


def settings_for(argv: List[str], environ: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None):
    return resolve_settings(parse([*argv, "--password", "x"]), environ or {}, cwd=cwd or Path("/nonexistent"))


def run_cli(argv: List[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, **env: str):
    """The console entry point as a user runs it; returns (exit code, stdout, stderr)."""
    for name in ("CLOUDSHELL_HOST", "CLOUDSHELL_PORT", "CLOUDSHELL_USERNAME", "CLOUDSHELL_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = cli.main(["install", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------------------------------- the config file
def laughs(levels: int) -> str:
    """A YAML "billion laughs": each level is ten aliases of the one before, 10**levels strings in all."""
    lines = ["a0: &a0 [lol]"]
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    lines.append(f"install:\n  host: *a{levels}\n  password: x")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [2, 9])
def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path: Path, levels: int) -> None:
    """Expanding 10**9 strings would take minutes and gigabytes; the refusal reads the file once."""
    (tmp_path / "cloudshell_config.yml").write_text(laughs(levels))
    with pytest.raises(InstallError) as caught:
        resolve_settings(parse([]), {}, cwd=tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'cloudshell_config.yml'}: YAML anchors and aliases (& and *) are not supported "
        "(line 1, column 5); write each value out"
    )


def test_a_single_anchor_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "cloudshell_config.yml").write_text("install:\n  host: &h cs\n  password: x\n")
    with pytest.raises(InstallError, match=r"anchors and aliases .* \(line 2, column 9\)"):
        resolve_settings(parse([]), {}, cwd=tmp_path)


def test_an_oversized_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cloudshell_config.yml").write_text("install:\n  password: x\n" + "# padding\n" * 10_000)
    with pytest.raises(InstallError, match=r"is too large for a cloudshell_config\.yml"):
        resolve_settings(parse([]), {}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("yaml_value", "kind"),
    [("[cs1, cs2]", "a list"), ("\n    - cs1\n    - cs2", "a list"), ("{name: cs}", "a mapping")],
)
def test_a_list_or_mapping_as_host_is_explained(
    tmp_path: Path, capsys, monkeypatch, yaml_value: str, kind: str
) -> None:
    (tmp_path / "cloudshell_config.yml").write_text(f"install:\n  host: {yaml_value}\n  password: x\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli([], capsys, monkeypatch)
    assert (code, out) == (1, "")
    assert err == (
        f"error: {tmp_path / 'cloudshell_config.yml'}: install: host: is {kind}; write a single value, "
        "like host: cloudshell.example.com\n"
    )


# ---------------------------------------------------------------------------------------- host and port
@pytest.mark.parametrize(
    ("argv", "host", "port"),
    [
        (["--host", "cloudshell.example.com"], "cloudshell.example.com", 9000),
        (["--host", " cs-1 "], "cs-1", 9000),
        (["--host", "192.0.2.10"], "192.0.2.10", 9000),
        (["--host", "::1"], "[::1]", 9000),
        (["--host", "2001:DB8:0:0::1"], "[2001:db8::1]", 9000),
        (["--host", "[::1]"], "[::1]", 9000),
        (["--host", "[::1]:9100"], "[::1]", 9100),
        (["--host", "cs:9100"], "cs", 9100),
        (["--host", "cs:9100", "--port", "9100"], "cs", 9100),
        (["--host", "http://cs:9100"], "cs", 9100),
        (["--host", "http://cs"], "cs", 9000),
        (["--host", "http://cs:9000/API/"], "cs", 9000),
        (["--host", "HTTP://[::1]:9100/"], "[::1]", 9100),
        (["--host", "bücher.example"], "bücher.example", 9000),
    ],
)
def test_unambiguous_hosts_are_accepted(argv: List[str], host: str, port: int) -> None:
    settings = settings_for(argv)
    assert (settings.host, settings.port) == (host, port)
    assert settings.api_url == f"http://{host}:{port}/API/"


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("[::1", "--host '[::1' opens a [ without closing it; write an IPv6 address as ::1 or [::1]"),
        ("[::1]x", "--host '[::1]x': after ] only :port may follow, e.g. [::1]:9000"),
        ("[cs]", "--host '[cs]': only IPv6 addresses go in brackets"),
        ("::g", "--host '::g' is not a valid IPv6 address; write a host name or address, e.g."),
        ("fe80::1%eth0", "has a zone (%...), which the HTTP client cannot use"),
        ("cs:http", "--host: what follows the ':' is not a port number; write the host alone"),
        ("cs:99999", "--host: what follows the ':' is not a port number"),
        (
            "cs:\u0669\u0660\u0660\u0660",
            "--host: what follows the ':' is not a port number",
        ),  # Arabic-Indic 9000
        ("https://cs", "the Quali API client speaks plain http only"),
        ("ftp://cs", "the Quali API client speaks plain http only"),
        ("http://cs:9000/Other", "the URL may name only the server and port (the client adds /API/)"),
        ("http://cs?x=1", "the URL may name only the server and port"),
        ("http://[::1", "is not a valid URL; write e.g. http://cloudshell.example.com:9000"),
        ("http://cs:port", "is not a valid URL"),
        ("cs/API", "--host 'cs/API' is not a host name; write just the name"),
        ("cs name", "--host contains spaces or control characters"),
        ("cs\u200b", "--host contains spaces or control characters"),
        ("", "--host is empty; write the CloudShell server's host name or address"),
        ("-cs-", "--host '-cs-' is not a host name or IP address"),
        ("cs..example", "is not a host name or IP address"),
        ("192.0.2.999", "--host '192.0.2.999' is not a valid IPv4 address"),
    ],
)
def test_other_hosts_are_refused_saying_what_to_write(host: str, problem: str) -> None:
    with pytest.raises(InstallError) as caught:
        settings_for([f"--host={host}"])
    assert problem in str(caught.value)


def test_a_port_in_the_host_must_agree_with_the_port_setting(tmp_path: Path) -> None:
    with pytest.raises(InstallError) as caught:
        settings_for(["--host", "http://cs:9100", "--port", "9200"])
    assert str(caught.value) == "--host names port 9100 but --port says 9200; write the port once"
    # shellfoundry writes port: 9000 into its file: a host with another port there is ambiguous too.
    (tmp_path / "cloudshell_config.yml").write_text("install:\n  host: cs\n  port: 9000\n")
    with pytest.raises(InstallError, match=r"CLOUDSHELL_HOST names port 9100 but port: in .* says 9000"):
        settings_for([], {"CLOUDSHELL_HOST": "cs:9100"}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("argv", "environ", "origin"),
    [
        (["--port", "8029"], {}, "--port"),
        ([], {"CLOUDSHELL_PORT": " 8029"}, "CLOUDSHELL_PORT"),
        (["--host", "cs:8029"], {}, "the port in --host"),
        (["--host", "http://cs:8029/"], {}, "the port in --host"),
    ],
)
def test_the_automation_api_port_is_explained(argv: List[str], environ: Dict[str, str], origin: str) -> None:
    with pytest.raises(InstallError) as caught:
        settings_for(argv, environ)
    assert str(caught.value) == (
        f"{origin} is 8029, the Automation API's port (CloudShellAPISession); packages are imported "
        "through the Quali API, which listens on 9000: use --port 9000 (or CLOUDSHELL_PORT / port:), "
        "or leave the port out"
    )


def test_the_automation_api_port_is_refused_before_any_connection(capsys, monkeypatch) -> None:
    """8029 on a closed local port: the message is the explanation, not a connection error."""
    code, out, err = run_cli(
        ["--host", "127.0.0.1", "--port", "8029", "--password", SECRET], capsys, monkeypatch
    )
    assert (code, out) == (1, "")
    assert err.startswith("error: --port is 8029, the Automation API's port")


@pytest.fixture
def ipv6_quali_api() -> Iterator[int]:
    """A server on [::1] that refuses every login with HTTP 401, as the Quali API does a wrong password."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

    try:
        server = Server(("::1", 0), Refuse)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("form", ["::1", "[::1]", "http://[::1]:{port}"])
def test_a_bare_ipv6_address_reaches_the_server(
    ipv6_quali_api: int, original_package_zip: Path, capsys, monkeypatch, form: str
) -> None:
    port = ipv6_quali_api
    argv = ["--host", form.format(port=port), "--password", SECRET, "--package", str(original_package_zip)]
    if "{port}" not in form:
        argv += ["--port", str(port)]
    code, out, err = run_cli(argv, capsys, monkeypatch)
    assert (code, out) == (1, "")
    assert err == (
        f"error: login to the Quali API at http://[::1]:{port}/API/ failed for user 'admin' in domain "
        "'Global': wrong username, password or domain\n"
    )


# ---------------------------------------------------------------------------------------- no secrets
@pytest.mark.parametrize(
    ("argv", "env", "config"),
    [
        (["--host", f"admin:{SECRET}@cs"], {}, ""),
        (["--host", f"http://admin:{SECRET}@cs:9000"], {}, ""),
        ([], {"CLOUDSHELL_HOST": f"admin:{SECRET}@cs"}, ""),
        ([], {}, f"  host: admin:{SECRET}@cs\n"),
        (["--port", f"admin:{SECRET}@cs"], {}, ""),
        (["--host", f"cs:{SECRET}"], {}, ""),
        (["--host", f"[::1]:{SECRET}"], {}, ""),
    ],
)
def test_user_password_at_host_is_never_echoed(
    tmp_path: Path,
    original_package_zip: Path,
    capsys,
    monkeypatch,
    argv: List[str],
    env: Dict[str, str],
    config: str,
) -> None:
    """Whatever field holds user:password@host, the password appears nowhere; the exit code is 1."""
    (tmp_path / "cloudshell_config.yml").write_text(f"install:\n  password: other\n{config}")
    monkeypatch.chdir(tmp_path)
    argv = [*argv, "--package", str(original_package_zip)]
    if "--port" not in argv:
        argv += ["--port", str(closed_port())]
    code, out, err = run_cli(argv, capsys, monkeypatch, **env)
    assert code == 1
    assert err.startswith("error: ")
    assert SECRET not in out + err


def test_a_short_password_does_not_garble_the_messages(capsys, monkeypatch) -> None:
    code, _, err = run_cli(["--host", "cs/API", "--password", "x"], capsys, monkeypatch)
    assert code == 1
    assert "write just the name, e.g. cloudshell.example.com" in err


def test_redaction_keeps_the_user_and_the_host() -> None:
    assert redact_userinfo(f"http://admin:{SECRET}@cs:9000 and bob:x@y") == (
        "http://admin:********@cs:9000 and bob:********@y"
    )
    assert redact_userinfo("user@example.com") == "user@example.com"
    assert redact_userinfo("'admin:p@ss:w/rd@cs'") == "'admin:********@cs'"


# ---------------------------------------------------------------------------------------- shellfoundry
#: Produced by shellfoundry's own PasswordModification.modify (QualiSystems/shellfoundry at b318594,
#: shellfoundry/utilities/modifiers/configuration/password_modification.py) with platform.node() returning
#: "build-host-01": password -> value that `shellfoundry config password` writes into cloudshell_config.yml.
SHELLFOUNDRY_VECTORS = [
    ("S3cret!pw", "MUYKHgFZSR8E"),
    ("Ünïcode-pässwörd", "wr4bwoYPC0kNQgPCkF5DRsKUBw0="),
    ("admin", "AxEEBQo="),
]


def shellfoundry_scramble(password: str, machine_name: str) -> str:
    """shellfoundry's scheme, as its source writes it: XOR with the machine name, UTF-8, base64."""
    scrambled = "".join(chr(ord(p) ^ ord(k)) for p, k in zip(password, machine_name * 100))
    return base64.b64encode(scrambled.encode()).decode()


@pytest.mark.parametrize(("password", "stored"), SHELLFOUNDRY_VECTORS)
def test_a_password_scrambled_by_shellfoundry_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, password: str, stored: str
) -> None:
    monkeypatch.setattr(platform, "node", lambda: "build-host-01")
    assert shellfoundry_scramble(password, "build-host-01") == stored
    (tmp_path / "cloudshell_config.yml").write_text(f"install:\n  host: cs\n  password: {stored}\n")
    assert resolve_settings(parse([]), {}, cwd=tmp_path).password == password


def test_a_password_scrambled_on_this_machine_is_decoded(tmp_path: Path) -> None:
    stored = shellfoundry_scramble("An0ther-pw!", platform.node())
    (tmp_path / "cloudshell_config.yml").write_text(f"install:\n  password: {stored}\n")
    assert resolve_settings(parse([]), {}, cwd=tmp_path).password == "An0ther-pw!"


@pytest.mark.parametrize("plain", ["0123", "12:30", "Passw0rd", "abcd", "pa ss", "x===", "YWJ="])
def test_a_password_written_by_hand_is_taken_as_written(plain: str) -> None:
    assert shellfoundry_password(plain, "cloudshell_config.yml", machine_name="build-host-01") == plain


def test_a_password_scrambled_on_another_machine_is_an_error(tmp_path: Path, capsys, monkeypatch) -> None:
    stored = shellfoundry_scramble(SECRET, "laptop")
    (tmp_path / "cloudshell_config.yml").write_text(f"install:\n  host: 127.0.0.1\n  password: {stored}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(platform, "node", lambda: "ci-runner-7")
    code, out, err = run_cli(["--port", str(closed_port())], capsys, monkeypatch)
    assert (code, out) == (1, "")
    assert err == (
        f"error: the password in {tmp_path / 'cloudshell_config.yml'} looks scrambled by shellfoundry, but "
        "does not decode on this machine (shellfoundry scrambles it with the name of the machine that wrote "
        "it): run `shellfoundry config password <password>` here, or set CLOUDSHELL_PASSWORD instead\n"
    )
    assert stored not in err and SECRET not in err


def test_the_environment_password_is_never_decoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "node", lambda: "build-host-01")
    settings = resolve_settings(parse([]), {"CLOUDSHELL_PASSWORD": "MUYKHgFZSR8E"}, cwd=tmp_path)
    assert settings.password == "MUYKHgFZSR8E"
