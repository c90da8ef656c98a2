"""``make demo`` (``python -m cloudshell_mutex.demo``): run the race, print a report to read at a glance.

Exit status 0 when the demo showed what it should (failures or a wrong topology without the lock, none with
it), 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path
from typing import List, Optional, TextIO

from cloudshell_mutex.bench import sections
from cloudshell_mutex.demo.race import GOAL, START, DemoResult, ModeResult, ProgressHook, run_demo


def _progress(stream: TextIO) -> ProgressHook:
    interactive = stream.isatty()

    def show(label: str, index: int, rounds: int) -> None:
        if interactive:  # one line, rewritten in place
            stream.write(f"\r  running: {label}, round {index}/{rounds}   ")
        elif index == 1:
            stream.write(f"  running: {label}, {rounds} rounds\n")
        stream.flush()

    return show


def _mode_lines(mode: ModeResult) -> List[str]:
    topologies = ", ".join(f"{topology} x{count}" for topology, count in mode.topologies())
    counts = f"{len(mode.rounds):>6} {mode.failed_calls:>17} {mode.wrong_topologies:>15}"
    return [f"  {mode.label:<17} {counts}   {topologies}"]


def format_report(result: DemoResult, rounds: int) -> str:
    """The printed report: setup, the table, one sample error, and the verdict."""
    unlocked, locked = result.without_lock, result.with_lock
    lines = [
        "",
        "cloudshell-mutex demo: two drivers race to rewire one sandbox",
        f"  setup    built {result.package} and imported it through the Quali API (PackagingRestApiClient);",
        f"           CloudShell API emulator at {result.api_url}; a sandbox with {START}",
        "  race     driver X (a command on A) puts A2 in place of A and moves A's connectors;",
        "           driver Y (a command on B) does the same for B. Two OS processes, real driver contexts,",
        f"           every call over HTTP. Each round starts from {START}; the right end is {GOAL}.",
        f"  note     after reading the topology each driver pauses (at most {result.window:g} s) until the",
        "           other has read it too: this widens the race window on purpose. The pause is the same",
        "           with the lock.",
        "",
        f"  {'':<17} {'rounds':>6} {'failed API calls':>17} {'wrong topology':>15}   final topologies",
        *_mode_lines(unlocked),
        *_mode_lines(locked),
    ]
    errors = unlocked.errors()
    if errors:
        message, count = errors[0]
        lines += ["", f"  most common failure without the lock (x{count}): {message}"]
    lines.append("")
    if result.as_expected:
        lines.append(
            f"  verdict  without the lock the drivers broke the sandbox in {unlocked.broken_rounds} of "
            f"{rounds} rounds; with the lock in 0 of {rounds}: always {GOAL}."
        )
    else:
        lines.append(
            f"  verdict  UNEXPECTED: without the lock {unlocked.broken_rounds} of {rounds} rounds broke, "
            f"with it {locked.broken_rounds} of {len(locked.rounds)}; "
            f"locks left behind: {list(result.services_left)}"
        )
    lines.append(f"  took {result.seconds:.1f} s")
    return "\n".join(lines)


#: The markers of the demo's section in docs/benchmarks.md (the bench report keeps what is between them).
SECTION_START, SECTION_END = "<!-- demo:start -->", "<!-- demo:end -->"


def doc_section(result: DemoResult, rounds: int) -> str:
    """The demo's section of docs/benchmarks.md: how long ``make demo`` took here, and what it showed."""
    unlocked, locked = result.without_lock, result.with_lock
    return "\n".join(
        [
            SECTION_START,
            "## `make demo`",
            "",
            f"The demo as `make bench` ran it ({rounds} rounds without the lock, then {rounds} with it; at "
            f"most {result.window:g} s of pause per round; {platform.python_implementation()} "
            f"{platform.python_version()}, {os.cpu_count()} cores): **{result.seconds:.1f} s**. Without the "
            f"lock {unlocked.broken_rounds} of {rounds} rounds broke the sandbox ({unlocked.failed_calls} "
            f"failed API calls); with it {locked.broken_rounds} of {rounds}.",
            SECTION_END,
        ]
    )


def write_doc_section(doc: Path, section: str) -> None:
    """Replace the demo's section of ``doc`` (or append it)."""
    sections.write_section(doc, (SECTION_START, SECTION_END), section)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the demo and print its report."""
    parser = argparse.ArgumentParser(prog="python -m cloudshell_mutex.demo", description=__doc__)
    parser.add_argument(
        "--rounds", type=int, default=10, help="rounds without and with the lock (default 10)"
    )
    parser.add_argument(
        "--window", type=float, default=0.5, help="longest pause after reading the topology, s (default 0.5)"
    )
    parser.add_argument("--root", default=".", help="source tree to build Mutex_Package.zip from (default .)")
    parser.add_argument(
        "--doc", type=Path, default=None, help="write how long it took into this markdown file (make bench)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.window < 0:
        parser.error("--rounds must be at least 1 and --window at least 0")
    if not (Path(args.root) / "drivers.toml").is_file():
        parser.error(
            f"{args.root} is not the cloudshell-mutex source tree (no drivers.toml): run it from a clone"
        )
    print("cloudshell-mutex demo: building the package, starting the emulator and two driver processes ...")
    result = run_demo(
        rounds=args.rounds, window=args.window, root=Path(args.root), progress=_progress(sys.stdout)
    )
    if sys.stdout.isatty():
        sys.stdout.write("\r" + " " * 60 + "\r")
    print(format_report(result, args.rounds))
    if args.doc is not None and result.as_expected:
        write_doc_section(args.doc, doc_section(result, args.rounds))
    return 0 if result.as_expected else 1


if __name__ == "__main__":
    sys.exit(main())
