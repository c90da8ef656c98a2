"""``drivers.toml``: the single declaration of the driver zips in the package.

Each ``[[driver]]`` table declares one ``Resource Drivers - Python/<name>.zip``::

    [[driver]]
    name = "Mutex Service Driver"          # the zip's name, drivermetadata.xml Name, <DriverName>
    source = "drivers/mutex_service"       # folder zipped as the driver, relative to drivers.toml
    version = "{project_version}"          # or a fixed "1.0.0"
    python_version = "3"
    main_class = "driver.MutexServiceDriver"
    models = ["Mutex Service"]             # the data-model models this driver serves
    requirements = ["{project_dependencies[driver]}"]   # or e.g. "cloudshell-mutex~={project_version}"
    bundle = ["cloudshell_mutex/lock"]     # optional: files or folders of src/ shipped in the zip

The project is the ``pyproject.toml`` next to ``drivers.toml``. ``{project_version}`` in ``version`` or in a
requirement is replaced by its version (static, or hatch's ``[tool.hatch.version] path``), so that a driver
that bundles or pins the library changes version with it. A requirement that is exactly
``{project_dependencies}`` stands for the project's runtime dependencies, ``{project_dependencies[x,y]}`` for
those plus the extras ``x`` and ``y``: a driver that bundles the library then installs what the library
needs, as the library declares it.

``bundle`` lists paths under the ``src/`` folder next to ``drivers.toml``; each is copied into the driver
zip at the same path (``cloudshell_mutex/lock`` becomes importable from the zip root). It is for code that
is on no package index, which the execution server therefore cannot install from ``requirements``.
"""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Mapping, Optional, Tuple

from cloudshell_mutex.packaging.format import PackageError, parse_version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised under Python 3.9/3.10
    import tomli as tomllib

MANIFEST_NAME = "drivers.toml"
PROJECT_VERSION_PLACEHOLDER = "{project_version}"
#: A requirement that is exactly ``{project_dependencies}`` or ``{project_dependencies[extra,...]}``.
_DEPENDENCIES_PLACEHOLDER_RE = re.compile(r"^\{project_dependencies(?:\[([A-Za-z0-9_.,-]+)\])?\}$")
#: hatch's default pattern for a version file: ``__version__ = "1.2.3"``.
_VERSION_LINE_RE = re.compile(r"""(?im)^(?:__version__|VERSION) *= *(['"])v?(?P<version>.+?)\1""")

#: CloudShell runs Python 3 drivers with PythonVersion="3"; this library needs Python 3.9+.
SUPPORTED_PYTHON_VERSIONS = ("3",)

_DRIVER_KEYS = {
    "name", "source", "version", "python_version", "main_class", "models", "requirements", "bundle",
}  # fmt: skip
#: ``bundle`` paths are relative to this folder next to drivers.toml (the project's source root).
BUNDLE_ROOT = "src"
_REQUIRED_KEYS = ("name", "source", "version", "python_version", "main_class", "models")
_MAIN_CLASS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
# The name becomes a file name on Windows execution servers.
_BAD_NAME_RE = re.compile(r'[<>:"/\\|?*\x00-\x1f]')
#: Device names that Windows reserves in every folder, whatever the extension ("CON.zip" is the console too).
WINDOWS_RESERVED_NAMES = frozenset(
    ["CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"]
    + [
        f"{device}{number}"
        for device in ("COM", "LPT")
        for number in ["0", *"123456789", "\u00b9", "\u00b2", "\u00b3"]
    ]
)


@dataclass(frozen=True)
class DriverSpec:
    """One ``[[driver]]`` entry, with ``source`` resolved against the manifest's folder."""

    name: str
    source: Path
    version: str
    python_version: str
    main_class: str
    models: Tuple[str, ...]
    requirements: Tuple[str, ...]
    #: Files or folders (absolute paths) copied into the zip at their path relative to ``bundle_root``.
    bundle: Tuple[Path, ...] = ()
    bundle_root: Optional[Path] = None

    @property
    def main_module_file(self) -> str:
        """The file, relative to ``source``, that holds ``main_class`` (``driver.X`` -> ``driver.py``)."""
        module = self.main_class.rsplit(".", 1)[0]
        return module.replace(".", "/") + ".py"


@dataclass(frozen=True)
class Manifest:
    """A parsed ``drivers.toml``."""

    path: Path
    drivers: Tuple[DriverSpec, ...]

    def drivers_for(self, model: str) -> Tuple[str, ...]:
        """Names of the drivers that serve ``model``."""
        return tuple(driver.name for driver in self.drivers if model in driver.models)


@dataclass(frozen=True)
class Project:
    """What drivers.toml may take from the ``pyproject.toml`` next to it."""

    version: Optional[str]
    dependencies: Tuple[str, ...] = ()
    extras: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    name: str = ""


def _load_pyproject(folder: Path) -> Optional[Dict[str, Any]]:
    pyproject = folder / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        return tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise PackageError(f"{pyproject}: invalid TOML: {error}") from None


def _dynamic_version(folder: Path, data: Dict[str, Any]) -> Optional[str]:
    """The version from hatch's ``[tool.hatch.version] path`` (a ``__version__ = "..."`` line)."""
    path = data.get("tool", {}).get("hatch", {}).get("version", {}).get("path")
    if not isinstance(path, str) or not _is_subpath(path):
        return None
    try:
        text = (folder / path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise PackageError(
            f"pyproject.toml: [tool.hatch.version] path {path} cannot be read: {error}"
        ) from None
    found = _VERSION_LINE_RE.search(text)
    if found is None:
        raise PackageError(
            f'{path}: no __version__ = "..." line (the [tool.hatch.version] path of pyproject.toml)'
        )
    return found.group("version")


def load_project(folder: Path) -> Optional[Project]:
    """The project in ``folder`` (its ``pyproject.toml``), or None when there is none."""
    data = _load_pyproject(folder)
    if data is None:
        return None
    project = data.get("project", {})
    version = project.get("version")
    if not isinstance(version, str):
        version = _dynamic_version(folder, data) if "version" in project.get("dynamic", []) else None
    extras = project.get("optional-dependencies", {})
    return Project(
        version=version,
        dependencies=tuple(project.get("dependencies", [])),
        extras={name: tuple(items) for name, items in extras.items()},
        name=str(project.get("name", "")),
    )


def project_version(folder: Path) -> Optional[str]:
    """The version of the project in ``folder``: ``[project] version``, or the file that hatch's
    ``[tool.hatch.version] path`` names when the version is dynamic; None without a pyproject.toml."""
    project = load_project(folder)
    return project.version if project is not None else None


def _string(entry: Dict[str, Any], key: str, where: str, source: str) -> str:
    value = entry[key]
    if not isinstance(value, str) or not value.strip():
        raise PackageError(f"{source}: {where}: {key} must be a non-empty string")
    return value


def _strings(entry: Dict[str, Any], key: str, where: str, source: str) -> Tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise PackageError(f"{source}: {where}: {key} must be a list of non-empty strings")
    if len(set(value)) != len(value):
        raise PackageError(f"{source}: {where}: {key} lists an item twice")
    return tuple(value)


def _check_windows_name(name: str, where: str, source: str) -> None:
    """The name becomes ``<name>.zip`` on Windows execution servers: refuse what Windows cannot store."""
    bad = sorted(set(_BAD_NAME_RE.findall(name)))
    if bad:
        shown = " ".join(repr(character) for character in bad)
        raise PackageError(
            f"{source}: {where}: the name must be a valid Windows file name; it contains {shown} "
            '(none of < > : " / \\ | ? * or control characters)'
        )
    if name != name.strip() or name.endswith("."):
        raise PackageError(
            f"{source}: {where}: the name must be a valid Windows file name; "
            "it must not start or end with a space, nor end with a dot"
        )
    # Windows ignores what follows the first dot, and spaces before it, when it looks for a device name.
    stem = name.split(".", 1)[0].rstrip(" ").upper()
    if stem in WINDOWS_RESERVED_NAMES:
        raise PackageError(
            f"{source}: {where}: the name must be a valid Windows file name; {stem} is a device name that "
            "Windows reserves (CON, PRN, AUX, NUL, COM0-9, LPT0-9), with any extension: choose another name"
        )


def _check_requirement(requirement: str, where: str, source: str) -> None:
    """One requirement is one line of requirements.txt, and only a requirement.

    A newline would smuggle a second line into the file (``"x\\n--index-url https://elsewhere"``) and an
    option line changes where the execution server installs packages from.
    """
    controls = sorted({ch for ch in requirement if unicodedata.category(ch) in ("Cc", "Zl", "Zp")})
    if controls:
        shown = ", ".join(f"U+{ord(ch):04X}" for ch in controls)
        raise PackageError(
            f"{source}: {where}: requirement {requirement!r} contains a line break or control character "
            f'({shown}); write one requirement per list item, like "cloudshell-automation-api>=2021,<2027"'
        )
    if requirement.lstrip().startswith("-"):
        raise PackageError(
            f"{source}: {where}: requirement {requirement!r} is a pip option, not a requirement; "
            "the execution server installs from its configured (local) PyPI; list package requirements only"
        )


def _need_project(project: Optional[Project], where: str, source: str, what: str) -> Project:
    if project is None or project.version is None:
        raise PackageError(
            f"{source}: {where}: {what} {PROJECT_VERSION_PLACEHOLDER} "
            "but there is no pyproject.toml version next to the manifest"
        )
    return project


def _expand_requirements(
    items: Tuple[str, ...], project: Optional[Project], where: str, source: str
) -> Tuple[str, ...]:
    """Replace ``{project_version}`` and the ``{project_dependencies[...]}`` items (see the module doc)."""
    expanded: List[str] = []
    for item in items:
        placeholder = _DEPENDENCIES_PLACEHOLDER_RE.match(item.strip())
        if placeholder is None:
            if PROJECT_VERSION_PLACEHOLDER in item:
                version = _need_project(project, where, source, "requirements use").version or ""
                item = item.replace(PROJECT_VERSION_PLACEHOLDER, version)
            expanded.append(item)
            continue
        if project is None:
            raise PackageError(
                f"{source}: {where}: requirements use {item.strip()} but there is no pyproject.toml "
                "next to the manifest"
            )
        expanded.extend(project.dependencies)
        for extra in filter(None, (placeholder.group(1) or "").split(",")):
            if extra not in project.extras:
                known = ", ".join(sorted(project.extras)) or "none"
                raise PackageError(
                    f"{source}: {where}: requirements use {item.strip()} but pyproject.toml has no extra "
                    f"{extra!r} (its extras: {known})"
                )
            for requirement in project.extras[extra]:
                if _requirement_name(requirement) == _requirement_name(project.name):
                    raise PackageError(
                        f"{source}: {where}: the extra {extra!r} names the project itself ({requirement!r}); "
                        "list the extras in the placeholder instead, e.g. {project_dependencies[a,b]}"
                    )
                expanded.append(requirement)
    names = [_requirement_name(requirement) for requirement in expanded]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise PackageError(
            f"{source}: {where}: requirements name {', '.join(twice)} more than once (after the "
            "project's dependencies are filled in); list each package once"
        )
    return tuple(expanded)


def _requirement_name(requirement: str) -> str:
    """The normalised project name a requirement line starts with (PEP 503)."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", name.group(1)).lower() if name else requirement


def _parse_driver(entry: Any, index: int, base: Path, project: Optional[Project], source: str) -> DriverSpec:
    if not isinstance(entry, dict):
        raise PackageError(f"{source}: [[driver]] #{index} must be a table")
    named = entry.get("name")
    where = f"driver {named!r}" if isinstance(named, str) and named else f"[[driver]] #{index}"
    unknown = sorted(set(entry) - _DRIVER_KEYS)
    if unknown:
        raise PackageError(f"{source}: {where}: unknown key(s) {', '.join(unknown)}")
    missing = [key for key in _REQUIRED_KEYS if key not in entry]
    if missing:
        raise PackageError(f"{source}: {where}: missing key(s) {', '.join(missing)}")
    name = _string(entry, "name", where, source)
    where = f"driver {name!r}"
    _check_windows_name(name, where, source)
    driver_version = _string(entry, "version", where, source)
    if driver_version == PROJECT_VERSION_PLACEHOLDER:
        driver_version = _need_project(project, where, source, "version uses").version or ""
    try:
        parse_version(driver_version)
    except ValueError:
        raise PackageError(f"{source}: {where}: version {driver_version!r} is not like 1.0.0") from None
    python_version = _string(entry, "python_version", where, source)
    if python_version not in SUPPORTED_PYTHON_VERSIONS:
        raise PackageError(f'{source}: {where}: python_version {python_version!r} is not supported; use "3"')
    main_class = _string(entry, "main_class", where, source)
    if not _MAIN_CLASS_RE.match(main_class):
        raise PackageError(f"{source}: {where}: main_class {main_class!r} is not like driver.ClassName")
    models = _strings(entry, "models", where, source)
    if not models:
        raise PackageError(f"{source}: {where}: models must name at least one model")
    requirements = _strings(entry, "requirements", where, source)
    requirements = _expand_requirements(requirements, project, where, source)
    for requirement in requirements:
        _check_requirement(requirement, where, source)
    folder = _string(entry, "source", where, source)
    # A subfolder of the tree, so that a fresh clone holds every input of the build (on any OS).
    if not _is_subpath(folder):
        raise PackageError(
            f"{source}: {where}: source {folder!r} must be a subfolder of the folder of drivers.toml, "
            "written with / and without .."
        )
    bundle = _strings(entry, "bundle", where, source)
    for item in bundle:
        if not _is_subpath(item):
            raise PackageError(
                f"{source}: {where}: bundle item {item!r} must be a path under {BUNDLE_ROOT}/, written "
                "with / and without .. (e.g. cloudshell_mutex/lock)"
            )
    return DriverSpec(
        name=name,
        source=base / folder,
        version=driver_version,
        python_version=python_version,
        main_class=main_class,
        models=models,
        requirements=requirements,
        bundle=tuple(base / BUNDLE_ROOT / item for item in bundle),
        bundle_root=base / BUNDLE_ROOT,
    )


def _is_subpath(path: str) -> bool:
    """True for a relative path written with / and without .. (the same on every OS)."""
    parts = PurePosixPath(path).parts
    return bool(parts) and parts[0] != "/" and ".." not in parts and "\\" not in path and ":" not in path


def parse_manifest(text: str, base: Path, source: str = MANIFEST_NAME) -> Manifest:
    """Parse manifest text; ``base`` is the folder that ``source`` paths are relative to."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise PackageError(f"{source}: invalid TOML: {error}") from None
    unknown = sorted(set(data) - {"driver"})
    if unknown:
        raise PackageError(f"{source}: unknown top-level key(s) {', '.join(unknown)}; expected [[driver]]")
    entries = data.get("driver", [])
    if not isinstance(entries, list):
        raise PackageError(f"{source}: driver must be an array of tables: write [[driver]]")
    project = load_project(base)
    drivers: List[DriverSpec] = []
    seen: Dict[str, str] = {}
    for index, entry in enumerate(entries, start=1):
        driver = _parse_driver(entry, index, base, project, source)
        # Windows file systems fold case: two names differing only in case collide as zip files.
        key = driver.name.casefold()
        if key in seen:
            also = (
                "" if seen[key] == driver.name else f" (also {seen[key]!r}; names differing in case collide)"
            )
            raise PackageError(f"{source}: duplicate driver name {driver.name!r}{also}")
        seen[key] = driver.name
        drivers.append(driver)
    served: Dict[str, str] = {}
    for driver in drivers:
        for model in driver.models:
            if model in served:
                raise PackageError(
                    f"{source}: model {model!r} is served by both {served[model]!r} and {driver.name!r}; "
                    "a model has one driver"
                )
            served[model] = driver.name
    return Manifest(path=Path(source), drivers=tuple(drivers))


def _shown(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return str(path)


def _linked_part(base: Path, folder: Path) -> Optional[Path]:
    """The first of ``folder`` and its parents below ``base`` that is a symbolic link or junction, if any."""
    current = base
    for part in folder.relative_to(base).parts:
        current = current / part
        if current.is_symlink() or _is_junction(current):
            return current
    return None


def _is_junction(path: Path) -> bool:
    """A Windows directory junction, which is_symlink does not report (``os.path.isjunction``, 3.12+)."""
    isjunction = getattr(os.path, "isjunction", None)
    return bool(isjunction(path)) if isjunction is not None else False


def check_sources(manifest: Manifest, base: Path) -> None:
    """Every declared driver's folder exists in the tree (no link) and holds the module of its main class."""
    for driver in manifest.drivers:
        linked = _linked_part(base, driver.source)
        if linked is not None:
            # A link pulls files from outside the tree: a fresh clone (or git on Windows) builds another zip.
            raise PackageError(
                f"{manifest.path}: driver {driver.name!r}: source {_shown(driver.source, base)} "
                f"goes through the symbolic link {_shown(linked, base)}; put the real folder in the tree"
            )
        if not driver.source.is_dir():
            raise PackageError(
                f"{manifest.path}: driver {driver.name!r}: "
                f"source folder {_shown(driver.source, base)} does not exist"
            )
        module = driver.source / driver.main_module_file
        if not module.is_file():
            raise PackageError(
                f"{manifest.path}: driver {driver.name!r}: {_shown(module, base)} "
                f"(the module of {driver.main_class}) does not exist"
            )
        for item in driver.bundle:
            if not item.exists():
                raise PackageError(
                    f"{manifest.path}: driver {driver.name!r}: bundle item {_shown(item, base)} "
                    "does not exist"
                )


def load_manifest(path: Path, display: Optional[str] = None) -> Manifest:
    """Read, parse and check ``drivers.toml`` at ``path`` (its driver folders must exist).

    ``display`` is how error messages name the file (default: ``path``).
    """
    shown = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PackageError(f"{shown}: not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise PackageError(f"{shown}: cannot be read: {error}") from None
    manifest = parse_manifest(text, path.parent, shown)
    check_sources(manifest, path.parent)
    return manifest
