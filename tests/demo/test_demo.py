"""The `make demo` race: its outcome (the result object), not its printout."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudshell_mutex.demo.__main__ import main
from cloudshell_mutex.demo.race import GOAL, START, DemoResult, ModeResult, RoundResult, Topology, run_demo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.slow
def test_without_the_lock_the_race_breaks_the_sandbox_and_with_it_never(monkeypatch):
    monkeypatch.chdir(ROOT)
    seen = []
    result = run_demo(rounds=3, window=1.0, progress=lambda label, index, rounds: seen.append((label, index)))
    assert seen == [("without the lock", i) for i in (1, 2, 3)] + [("with the lock", i) for i in (1, 2, 3)]
    unlocked, locked = result.without_lock, result.with_lock
    assert [r.locked for r in unlocked.rounds + locked.rounds] == [False] * 3 + [True] * 3
    # Without the lock: every round both drivers read A--B, so one of them finds its connector gone.
    assert unlocked.failed_calls > 0
    assert unlocked.wrong_topologies > 0
    assert any("was not found" in message for message, _ in unlocked.errors())
    # With the lock: no failed call, always A2--B2, and no lock left behind.
    assert locked.failed_calls == 0
    assert [r.topology for r in locked.rounds] == [GOAL] * 3
    assert result.services_left == ()
    assert result.as_expected
    assert result.package == "Mutex_Package.zip"


def test_topology_text_names_loose_resources():
    assert str(START) == "A--B"
    assert str(Topology(("A2", "B", "B2"), ("A2--B",))) == "A2--B (+B2)"
    assert str(Topology(("A2", "B2"), ())) == "no connector (+A2, B2)"


def test_a_run_is_as_expected_only_when_the_lock_kept_every_round_right():
    good = RoundResult(1, True, 0, (), GOAL)
    broken = RoundResult(1, False, 1, ("123: gone",), Topology(("A2", "B", "B2"), ("A2--B",)))
    wrong_but_quiet = RoundResult(1, True, 0, (), START)

    def outcome(unlocked, locked, left=()):
        return DemoResult(
            ModeResult(False, unlocked), ModeResult(True, locked), 0.5, 1.0, "", "", left
        ).as_expected

    assert outcome([broken], [good])
    assert not outcome([good], [good])  # the race did not show
    assert not outcome([broken], [wrong_but_quiet])  # the lock did not help
    assert not outcome([broken], [good], left=("MUTEX",))  # a lock left behind
    assert not outcome([broken], [])


def test_the_command_refuses_to_run_outside_a_source_tree(tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["--root", str(tmp_path)])
    assert caught.value.code == 2
    assert "no drivers.toml" in capsys.readouterr().err


def test_the_demo_writes_its_time_into_the_benchmarks_document(tmp_path):
    """`make bench` runs the demo with --doc: its section (between markers) says how long it took, and a
    later run replaces it, leaving the rest of the document alone."""
    from cloudshell_mutex.demo.__main__ import SECTION_END, SECTION_START, doc_section, write_doc_section

    broken = RoundResult(1, False, 1, ("123: gone",), Topology(("A2", "B", "B2"), ("A2--B",)))
    good = RoundResult(1, True, 0, (), GOAL)
    result = DemoResult(ModeResult(False, [broken]), ModeResult(True, [good]), 0.5, 8.94, "", "", ())
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nthe rest\n", encoding="utf-8")
    write_doc_section(doc, doc_section(result, 1))
    first = doc.read_text(encoding="utf-8")
    assert first.startswith("# Benchmarks\n\nthe rest\n") and "**8.9 s**" in first
    assert "Without the lock 1 of 1 rounds broke the sandbox" in first and "with it 0 of 1" in first
    result = DemoResult(ModeResult(False, [broken]), ModeResult(True, [good]), 0.5, 12.0, "", "", ())
    write_doc_section(doc, doc_section(result, 1))
    second = doc.read_text(encoding="utf-8")
    assert second.count(SECTION_START) == second.count(SECTION_END) == 1 and "**12.0 s**" in second
