"""The readers-and-writers mix of the benchmark (bench/rwmix.py): its table, its section in the report, and
one tiny end-to-end run of both locks (separate processes, the emulator, the real client)."""

from __future__ import annotations

import pytest

from cloudshell_mutex.bench.rwmix import MARK_END, MARK_START, MixResult, run_mix, table, write_section


def results():
    return [
        MixResult("mutex", 8, 0.9, 0.5, 10.0, reads=18, writes=2, calls=100),
        MixResult("rwlock", 8, 0.9, 0.5, 10.0, reads=45, writes=5, calls=600),
    ]


def test_the_table_compares_each_lock_with_the_plain_mutex_of_the_same_mix():
    lines = table(results())
    assert lines[2].startswith("| mutex | 8 | 90% | 0.5 s | 2.00 | 18 | 2 | 5.0 | 1.00x |")
    assert lines[3].startswith("| rwlock | 8 | 90% | 0.5 s | 5.00 | 45 | 5 | 12.0 | 2.50x |")


def test_the_section_replaces_itself_and_keeps_the_rest_of_the_report(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nmain report\n", encoding="utf-8")
    write_section(doc, results(), 10.0)
    write_section(doc, results()[:1], 10.0)
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\nmain report\n")
    assert text.count(MARK_START) == 1 and text.count(MARK_END) == 1
    assert "| rwlock |" not in text and "| mutex |" in text


@pytest.mark.integration
@pytest.mark.slow
def test_both_locks_run_the_mix_end_to_end():
    for name in ("mutex", "rwlock"):
        result = run_mix(
            name,
            clients=2,
            read_fraction=0.5,
            hold=0.05,
            window=2.0,
            latency={"distribution": "fixed", "seconds": 0.002},
        )
        assert result.sections > 0 and result.calls > 0
