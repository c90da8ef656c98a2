"""The offline bundle of ``make dist``: every wheel an execution server needs, for each of its platforms.

Execution servers run CPython 3.9 on Windows x64 or Linux x86_64 and install a driver's ``requirements.txt``
from the site's local PyPI. An offline site must have every dependency there, so this writes one folder of
wheels (like ``shellfoundry dist``'s ``dist/offline_requirements``) that holds, for both platforms, the
library's wheel and everything it and the package's drivers need::

    python tools/dist.py --wheel dist/cloudshell_mutex-X.Y.Z-py3-none-any.whl --out dist/offline_requirements

How:

1. Resolve the requirements with a real Python 3.9 (``pip install --dry-run --report``): the set of
   packages, and which of them are published only as source archives.
2. Build a wheel of each of those (``pip wheel --no-deps``); it must be pure Python (``none-any``), else no
   single wheel serves both platforms and the build stops and says so.
3. For each platform, ``pip download --only-binary=:all: --platform ... --python-version 3.9`` with those
   wheels as extra links.
4. Check the folder alone serves each platform: ``pip install --dry-run --no-index`` per platform, and a
   walk of every wheel's ``Requires-Dist`` with that platform's markers (pip evaluates markers such as
   ``sys_platform == "win32"`` for the machine it runs on, not for ``--platform``; a dependency found
   missing that way is downloaded and the check repeated).

It writes ``SHA256SUMS`` next to the wheels. Network use: the configured package index (pip's own
settings apply), in steps 1 to 3 only.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
#: The execution servers' interpreter.
PYTHON_VERSION = (3, 9)
#: The library's extras that a driver's virtualenv gets (the driver mixin's shell-core and logging).
EXTRAS = ("driver",)


@dataclass(frozen=True)
class Platform:
    """One execution-server platform: pip's platform tags for it, and its environment markers."""

    name: str
    #: Given to pip as --platform, most specific first; also the tags a wheel may carry.
    tags: Tuple[str, ...]
    markers: Mapping[str, str]

    def environment(self) -> Dict[str, str]:
        """PEP 508 marker values of CPython 3.9 on this platform."""
        version = ".".join(map(str, PYTHON_VERSION))
        return {
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "implementation_version": f"{version}.13",
            "python_version": version,
            "python_full_version": f"{version}.13",
            "platform_release": "",
            "platform_version": "",
            **self.markers,
        }

    def pip_options(self) -> List[str]:
        """pip's options for wheels of CPython 3.9 on this platform (binary wheels only, as pip requires)."""
        version = "".join(map(str, PYTHON_VERSION))
        tags = [option for tag in self.tags for option in ("--platform", tag)]
        return ["--only-binary=:all:", *tags, "--python-version", version, "--implementation", "cp",
                "--abi", f"cp{version}"]  # fmt: skip

    def supported(self) -> FrozenSet[Tag]:
        """Every wheel tag CPython 3.9 accepts on this platform."""
        abis = [f"cp{PYTHON_VERSION[0]}{PYTHON_VERSION[1]}", "abi3", "none"]
        tags = list(cpython_tags(PYTHON_VERSION, abis=abis, platforms=self.tags))
        tags += compatible_tags(
            PYTHON_VERSION, interpreter=f"cp{PYTHON_VERSION[0]}{PYTHON_VERSION[1]}", platforms=self.tags
        )
        return frozenset(tags)


_WINDOWS = {
    "os_name": "nt",
    "sys_platform": "win32",
    "platform_system": "Windows",
    "platform_machine": "AMD64",
}
_LINUX = {
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
}
#: manylinux2014 (glibc 2.17) and the older manylinux tags it accepts, under both of their names.
_MANYLINUX = tuple(f"manylinux{tag}_x86_64" for tag in ("_2_17", "2014", "_2_12", "2010", "_2_5", "1"))
PLATFORMS = (
    Platform("win_amd64", ("win_amd64",), _WINDOWS),
    Platform("manylinux2014_x86_64", _MANYLINUX, _LINUX),
)


class DistError(Exception):
    """The bundle cannot be built; the message says why and what to do."""


@dataclass(frozen=True)
class Wheel:
    """A wheel file of the bundle: its project, version, tags and the requirements it declares."""

    path: Path
    name: NormalizedName
    version: Version
    tags: FrozenSet[Tag]
    requires: Tuple[Requirement, ...]

    @classmethod
    def read(cls, path: Path) -> Wheel:
        name, version, _, tags = parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as archive:
            metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            message = email.parser.BytesParser().parsebytes(archive.read(metadata))
        requires = tuple(Requirement(line) for line in message.get_all("Requires-Dist") or [])
        return cls(path, name, version, frozenset(tags), requires)

    @property
    def pure(self) -> bool:
        """True when the wheel serves every platform (no compiled code)."""
        return all(tag.abi == "none" and tag.platform == "any" for tag in self.tags)


def pip(python: str, *args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m pip``; a failure raises :class:`DistError` with pip's own message."""
    command = [python, "-m", "pip", *args, *(["--quiet"] if quiet else [])]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if "WARNING: Location" not in line][-20:]
        raise DistError(f"pip {args[0]} failed:\n  " + "\n  ".join(lines))
    return result


def resolve(python: str, requirements: Sequence[str]) -> List[dict]:
    """The packages that pip on ``python`` would install for ``requirements`` (its ``--report``)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        pip(python, "install", "--dry-run", "--ignore-installed", "--report", str(report), *requirements)
        return list(json.loads(report.read_text(encoding="utf-8"))["install"])


def build_pure_wheels(python: str, packages: Iterable[dict], out: Path) -> List[Path]:
    """A wheel of each package that the index has only as a source archive; each must be pure Python."""
    built = []
    for item in packages:
        url = item["download_info"]["url"]
        if url.endswith(".whl"):
            continue
        pin = f"{item['metadata']['name']}=={item['metadata']['version']}"
        with tempfile.TemporaryDirectory() as folder:
            # --use-pep517: a build environment with setuptools and wheel, whatever this interpreter has.
            pip(
                python,
                "wheel",
                "--no-deps",
                "--use-pep517",
                "--no-binary",
                item["metadata"]["name"],
                "-w",
                folder,
                pin,
            )
            (path,) = Path(folder).glob("*.whl")
            if not Wheel.read(path).pure:
                raise DistError(
                    f"{pin} is published only as a source archive and builds a platform wheel "
                    f"({path.name}): build it on each execution-server platform and add the wheels to {out}"
                )
            built.append(Path(shutil.copy2(path, out / path.name)))
    return built


def download(python: str, platform: Platform, requirements: Sequence[str], out: Path) -> None:
    """Binary wheels of ``requirements`` and their dependencies for ``platform`` into ``out``."""
    pip(python, "download", *platform.pip_options(), "--find-links", str(out), "-d", str(out), *requirements)


def offline_resolves(python: str, platform: Platform, requirements: Sequence[str], out: Path) -> None:
    """pip itself resolves ``requirements`` for ``platform`` from ``out`` alone (no index)."""
    with tempfile.TemporaryDirectory() as target:
        options = [
            "--dry-run",
            "--ignore-installed",
            "--no-index",
            "--find-links",
            str(out),
            "--target",
            target,
        ]
        pip(python, "install", *options, *platform.pip_options(), *requirements)


def missing_requirements(
    wheels: Sequence[Wheel], platform: Platform, requirements: Sequence[str]
) -> List[str]:
    """What ``platform`` would need that the wheels lack, following each wheel's ``Requires-Dist`` with the
    platform's own markers and the extras asked for (one wheel per project and platform, as pip picks)."""
    environment = platform.environment()
    supported = platform.supported()
    by_name: Dict[NormalizedName, List[Wheel]] = {}
    for wheel in wheels:
        if wheel.tags & supported:
            by_name.setdefault(wheel.name, []).append(wheel)
    missing: List[str] = []
    seen: Set[Tuple[NormalizedName, FrozenSet[str]]] = set()
    queue = [(_top_level(line), frozenset(_top_level(line).extras)) for line in requirements]
    while queue:
        requirement, extras = queue.pop()
        name = canonicalize_name(requirement.name)
        candidates = sorted(
            (w for w in by_name.get(name, []) if requirement.specifier.contains(w.version, prereleases=True)),
            key=lambda w: w.version,
        )
        if not candidates:
            missing.append(str(requirement))
            continue
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        for dependency in candidates[-1].requires:
            if _applies(dependency.marker, environment, extras):
                queue.append((dependency, frozenset(dependency.extras)))
    return sorted(set(missing))


def _top_level(line: str) -> Requirement:
    """A requirement line; a local wheel path stands for that wheel's project at its exact version."""
    if line.endswith(".whl") or ".whl[" in line:
        path, _, extras = line.partition("[")
        name, version, _, _ = parse_wheel_filename(Path(path).name)
        return Requirement(f"{name}{'[' + extras if extras else ''}=={version}")
    return Requirement(line)


def _applies(marker: Optional[Marker], environment: Mapping[str, str], extras: FrozenSet[str]) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({**environment, "extra": extra}) for extra in (extras or {""}))


def write_sums(out: Path) -> Path:
    """``SHA256SUMS`` of every wheel in ``out`` (sorted), for whoever copies the bundle to a site."""
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}" for p in sorted(out.glob("*.whl"))]
    sums = out / "SHA256SUMS"
    sums.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sums


def driver_requirements(manifest: Path) -> List[str]:
    """The requirements of every driver in ``drivers.toml`` (as written into their requirements.txt)."""
    from cloudshell_mutex.packaging.manifest import load_manifest

    return sorted({r for driver in load_manifest(manifest).drivers for r in driver.requirements})


def build_bundle(
    python: str, wheel: Path, out: Path, extra_requirements: Sequence[str] = (), platforms=PLATFORMS
) -> List[Path]:
    """Write the bundle for ``wheel`` (with :data:`EXTRAS`) and ``extra_requirements`` into ``out``."""
    probe = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2] == (3, 9))"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "True":
        raise DistError(f"{python} is not a CPython 3.9 interpreter: pass --python or set PYTHON39")
    if out.exists():
        shutil.rmtree(out)  # exactly what this build resolved, nothing left from an older one
    out.mkdir(parents=True)
    shutil.copy2(wheel, out / wheel.name)
    requirements = [f"{out / wheel.name}[{','.join(EXTRAS)}]", *extra_requirements]
    build_pure_wheels(python, resolve(python, requirements), out)
    for platform in platforms:
        wanted = list(requirements)
        for _ in range(10):  # each round adds what the markers walk found; a handful is plenty
            download(python, platform, wanted, out)
            wheels = [Wheel.read(path) for path in sorted(out.glob("*.whl"))]
            missing = missing_requirements(wheels, platform, requirements)
            if not missing:
                break
            if set(missing) <= set(wanted):
                raise DistError(f"{platform.name}: pip did not download {', '.join(missing)}")
            wanted += [m for m in missing if m not in wanted]
        else:
            raise DistError(f"{platform.name}: the bundle is still missing {', '.join(missing)}")
        offline_resolves(python, platform, requirements, out)
    write_sums(out)
    return sorted(out.glob("*.whl"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Build the bundle; print what it holds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", required=True, type=Path, help="the library's wheel (make package)")
    parser.add_argument("--out", default=ROOT / "dist" / "offline_requirements", type=Path)
    parser.add_argument(
        "--python",
        default=os.environ.get("PYTHON39", "python3.9"),
        help="a CPython 3.9 interpreter (default: $PYTHON39, else python3.9)",
    )
    parser.add_argument(
        "--manifest",
        default=ROOT / "drivers.toml",
        type=Path,
        help="drivers.toml: its drivers' requirements are bundled too",
    )
    args = parser.parse_args(argv)
    try:
        wheels = build_bundle(args.python, args.wheel, args.out, driver_requirements(args.manifest))
    except DistError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    size = sum(path.stat().st_size for path in wheels)
    print(
        f"wrote {args.out} ({len(wheels)} wheels, {size // 1024} KiB) for CPython 3.9 on "
        + " and ".join(p.name for p in PLATFORMS)
    )
    for path in wheels:
        print(f"  {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
