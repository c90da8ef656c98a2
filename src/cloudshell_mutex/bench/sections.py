"""Sections of docs/benchmarks.md that a bench other than the main one writes, each between two markers of
its own (``<!-- name:start -->`` ... ``<!-- name:end -->``): written in place, and kept by the main
report when it rewrites the page (:func:`.report.kept_sections`)."""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

#: The markers of each bench's section, in the page's order (the demo's are its own: demo/__main__.py).
COHORT = ("<!-- cohort bench: start -->", "<!-- cohort bench: end -->")
RWMIX = ("<!-- rwmix:start -->", "<!-- rwmix:end -->")
STALLS = ("<!-- stalls:start -->", "<!-- stalls:end -->")

Markers = Tuple[str, str]


def section_of(document: str, markers: Markers) -> str:
    """The section of ``document`` between ``markers``, markers included, with a newline; "" when none."""
    start, end = markers
    if start in document and end in document:
        return start + document.split(start, 1)[1].split(end, 1)[0] + end + "\n"
    return ""


def replace_section(document: str, markers: Markers, section: str) -> str:
    """``document`` with its section between ``markers`` replaced by ``section`` (appended when it has
    none); ``section`` carries the markers itself."""
    start, end = markers
    if start in document and end in document:
        head, rest = document.split(start, 1)
        _, tail = rest.split(end, 1)
        return head + section.rstrip("\n") + tail
    return document.rstrip("\n") + "\n\n" + section


def write_section(doc: Path, markers: Markers, section: str) -> None:
    """Replace (or append) the section between ``markers`` in the file ``doc``."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else ""
    doc.write_text(replace_section(text, markers, section).rstrip("\n") + "\n", encoding="utf-8")
