"""README.md, CHANGELOG.md and docs/ are read by users of a release: they speak of the product alone.

No words of how the project is developed (its roadmap, issues, steps and stops, the people and files behind
it). ``docs/benchmarks.md`` is written by ``make bench``, so its generator is held to the same rule.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
#: Writes docs/benchmarks.md.
GENERATORS = [ROOT / "src" / "cloudshell_mutex" / "bench" / "report.py"]

#: (pattern, what it is) for words that belong to development, not to the product.
PROCESS_WORDS = [
    (r"\broadmap", "the roadmap"),
    (r"\bthe issue\b|\bissues? #?\d+|\bGitHub issue", "an issue"),
    (r"\.\./shared|shared/cloudshell-facts|\bfacts file\b", "the development notes"),
    (r"\[\d+/\d+\]", "a [k/n] step number"),
    (r"\bstop \d+\b|\bthis stop\b|\bstop's\b", "a development stop"),
    (r"\bthe lead\b|\blead engineer\b|\bhelpers? brief\b|\bworktree\b", "the development team"),
    (r"/work/", "a path on a development machine"),
    (r"\bwhoever picks this up\b", "development bookkeeping"),
    (r"\b\w+ merges?\b(?! the)|\bafter the merge\b", "a merge of branches"),
]


def offences(path: Path) -> List[Tuple[int, str, str]]:
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for pattern, what in PROCESS_WORDS:
            match = re.search(pattern, line, re.IGNORECASE)
            if match:
                found.append((number, what, match.group(0)))
    return found


@pytest.mark.parametrize("path", USER_DOCS + GENERATORS, ids=lambda path: str(path.relative_to(ROOT)))
def test_user_docs_speak_of_the_product_alone(path: Path) -> None:
    assert offences(path) == [], f"{path.relative_to(ROOT)}: words of the development process"


def test_the_check_finds_each_kind_of_word(tmp_path: Path) -> None:
    text = (
        "The roadmap's targets.\nAs the issue defines it.\nSee ../shared/cloudshell-facts.md.\n"
        "Roadmap step [8/12].\nThe code of stop 9.\nThe lead's runs.\nKept in /work/notes.\n"
        "After the leases merge.\nLogs kept for whoever picks this up.\n"
        "Step 4 of the protocol, this round of retries, the MUTEX service: product words.\n"
    )
    (tmp_path / "doc.md").write_text(text)
    found = offences(tmp_path / "doc.md")
    assert {what for _, what, _ in found} == {what for _, what in PROCESS_WORDS}
    assert 10 not in {line for line, _, _ in found}
