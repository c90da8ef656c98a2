"""The lock's wing keeps the shape docs/architecture.md draws: at most nine floors of imports inside
``lock/`` (a module sits above every module it imports, annotations included), no module above 600
lines, and no module that reaches into another object's underscored members."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Dict, Set

LOCK = Path(__file__).resolve().parents[2] / "src" / "cloudshell_mutex" / "lock"
MAX_FLOORS = 9
#: The reaches into a foreign underscored member, both into the CloudShell client's hidden re-send
#: (classify.py says why): its re-send count, which the failure translator turns off around a single call,
#: and its connection pool, which it wraps to count the copies of a request that may have reached the server.
ALLOWED_PRIVATE_REACHES = {("classify.py", "api._attempts"), ("classify.py", "api._http")}


def _imports() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    modules = {path.stem for path in LOCK.glob("*.py")}
    for path in LOCK.glob("*.py"):
        found: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
        graph[path.stem] = {name for name in found if name in modules and name != path.stem}
    return graph


def test_the_lock_wing_has_at_most_nine_floors_and_no_import_runs_in_a_circle() -> None:
    graph = _imports()

    @functools.cache
    def floor(module: str, seen: frozenset = frozenset()) -> int:
        assert module not in seen, f"an import circle through {module}"
        return 1 + max((floor(other, seen | {module}) for other in graph[module]), default=0)

    floors = {module: floor(module) for module in graph}
    assert max(floors.values()) <= MAX_FLOORS, sorted(floors.items(), key=lambda item: -item[1])[:5]


def test_no_lock_module_reaches_into_another_objects_underscored_members() -> None:
    reach = re.compile(r"\b(?!self\b|cls\b)([a-z_][a-z0-9_]*)\.(_[a-z][a-z0-9_]*)\b")
    found = []
    for path in sorted(LOCK.glob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if code.lstrip().startswith(("from ", "import ")):
                continue
            for match in reach.finditer(code):
                where = (path.name, f"{match.group(1)}.{match.group(2)}")
                if where not in ALLOWED_PRIVATE_REACHES and not match.group(2).startswith("__"):
                    found.append(f"{path.name}:{number}: {code.strip()}")
    assert not found, "\n".join(found)


def test_no_lock_module_is_over_six_hundred_lines() -> None:
    sizes = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in LOCK.glob("*.py")}
    assert max(sizes.values()) <= 600, sorted(sizes.items(), key=lambda item: -item[1])[:3]
