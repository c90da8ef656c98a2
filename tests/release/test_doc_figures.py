"""The figures README.md, `make help` and docs/ state agree with what they are figures of.

A figure derived from the library's defaults (crash recovery, heartbeat cost, progress interval, the Stop
button's reaction, the cohort's polling, the queue's call rates) is recomputed here from those defaults; a
measured one (how long `make demo` takes) must agree with what `make bench` last measured and wrote into
docs/benchmarks.md. No test here times anything.
"""

from __future__ import annotations

import re
from pathlib import Path
from statistics import median

from cloudshell_mutex import MutexOptions, __version__
from cloudshell_mutex.bench.contenders import BASELINE
from cloudshell_mutex.bench.plans import DECIDE, RELEASE_UNREAD
from cloudshell_mutex.bench.results import load_results
from cloudshell_mutex.demo.__main__ import SECTION_END, SECTION_START
from cloudshell_mutex.lock.cohort import cohort
from cloudshell_mutex.lock.lease.lease import stale_margin
from cloudshell_mutex.lock.options import DEFAULT_LEASE, FRESH_READ_LAG
from cloudshell_mutex.lock.pacing import CANCEL_SLICE, CohortPacing
from cloudshell_mutex.lock.queue import tickets

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PROTOCOL = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
BENCHMARKS = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
#: What a break itself takes, as the docs count it: the breaker's add, its wait for a read that may lag
#: (FRESH_READ_LAG), the re-read and the remove.
BREAK_SECONDS = FRESH_READ_LAG + 0.5


def recovery_bound(lease: float) -> float:
    """The latest a waiter that already waits breaks a crashed holder, after its last heartbeat."""
    return lease + stale_margin(lease) + MutexOptions().holder_check_interval + BREAK_SECONDS


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_crash_recovery_figures_follow_from_the_defaults():
    readme, protocol = one_line(README), one_line(PROTOCOL)
    default = recovery_bound(DEFAULT_LEASE)
    assert f"default `lease={DEFAULT_LEASE:g}`" in readme
    judged = DEFAULT_LEASE + stale_margin(DEFAULT_LEASE)
    assert f"break its lock {judged:g} s (lease + lease/4) after they saw its last heartbeat" in readme
    assert f"at most about {round(default)} s after it" in readme
    assert f"with `lease=30`, at most about {round(recovery_bound(30))} s" in readme
    assert f"lease=30) # a crashed holder is broken within about {round(recovery_bound(30))} s" in readme
    check, parts = MutexOptions().holder_check_interval, BREAK_SECONDS
    default_sum = f"{DEFAULT_LEASE:g} + {stale_margin(DEFAULT_LEASE):g} + {check:g} + {parts:g}"
    assert f"at most about {default_sum} = {round(default)} s" in protocol
    short_sum = f"30 + {stale_margin(30):g} + {check:g} + {parts:g}"
    assert f"(`lease=30`: {short_sum} = {round(recovery_bound(30))} s)" in protocol


def test_the_heartbeat_progress_and_stop_figures_follow_from_the_defaults():
    assert f"**{6 / DEFAULT_LEASE:.1f} calls/s per held lock** by default" in one_line(PROTOCOL)
    interval = MutexOptions().progress_interval
    assert f"to the sandbox output every {interval:g} s" in one_line(README)
    assert CANCEL_SLICE <= 1.0  # "stops waiting within a second of the portal's Stop"
    assert "stops waiting within a second of the portal's Stop" in one_line(README)


def test_the_cohorts_polling_figures_follow_from_its_pacing():
    pacing = CohortPacing()
    reads = cohort.COHORT_HOLDER_CHECK_INTERVAL
    assert f"an add every {pacing.end:g}-{pacing.start:g} s, a read every {reads:g} s" in PROTOCOL


def test_the_queues_call_rate_table_follows_from_its_schedule():
    """docs/protocol.md, "The per-lock call budget": the queue's polling for a period and a number of waiters
    is what the waiters' schedule makes (tickets.queue_calls_per_second), and the acquisitions' calls are
    tickets.ACQUISITION_CALLS a period."""
    section = PROTOCOL.split("### The per-lock call budget", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| ([\d.]+) s \| (\d+) \| ([\d.]+)/s \| ([\d.]+)/s \| ([\d.]+)/s \|$", section, re.M)
    assert len(rows) >= 5
    assert f"at least **{tickets.ACQUISITION_CALLS} calls**" in section
    for period, waiters, queue, acquisitions, total in rows:
        expected = tickets.queue_calls_per_second(int(waiters), float(period))
        assert f"{expected:.1f}" == queue, (period, waiters)
        assert f"{tickets.ACQUISITION_CALLS / float(period):.1f}" == acquisitions, (period, waiters)
        assert abs(float(queue) + float(acquisitions) - float(total)) <= 0.11, (period, waiters)


def test_the_demo_time_stated_is_what_make_bench_measured():
    """README and `make help` say how long `make demo` takes; `make bench` runs the demo and writes how long
    it took into docs/benchmarks.md. The statement must be within a factor of two of that measurement."""
    assert SECTION_START in BENCHMARKS and SECTION_END in BENCHMARKS, "run make bench: no demo section"
    section = BENCHMARKS.split(SECTION_START, 1)[1].split(SECTION_END, 1)[0]
    measured = float(re.search(r"\*\*([\d.]+) s\*\*", section).group(1))
    stated_readme = re.search(r"make demo .*\(about (\d+) s\)", README)
    stated_help = re.search(r"make demo .*\(about (\d+) s\)", MAKEFILE)
    assert stated_readme and stated_help, "README and make help state the demo's time as (about N s)"
    for stated in (float(stated_readme.group(1)), float(stated_help.group(1))):
        assert measured / 2 <= stated <= measured * 2, (stated, measured)
    assert "with it 0 of" in section  # the measured run also showed what the demo is for


def test_the_demo_table_in_the_readme_is_the_demos():
    """The README's table is what a demo run prints: every round broken without the lock, none with it."""
    rounds = re.search(r"without the lock\s+(\d+)\s+(\d+)\s+(\d+)", README)
    locked = re.search(r"with the lock\s+(\d+)\s+(\d+)\s+(\d+)\s+A2--B2 x(\d+)", README)
    assert rounds and locked
    assert rounds.group(1) == rounds.group(3) == locked.group(1) == locked.group(4)
    assert locked.group(2) == locked.group(3) == "0"


def test_the_measured_crash_recoveries_stated_keep_within_their_bounds():
    """docs/protocol.md, "Leases", states crash recoveries measured with lease 30 and 60: each bound is the
    one the defaults give, and each measurement stays within it, give or take the rounding of "about N s"."""
    protocol = one_line(PROTOCOL)
    dash = "\u2013"
    last_beat = re.search(
        rf"`lease=30`, ([\d.]+){dash}([\d.]+) s after the last heartbeat landed \(3 runs; bound (\d+) s\)",
        protocol,
    )
    started = re.search(
        r"([\d.]+) s after the kill for a waiter that started then \(3 runs; bound (\d+) s\)", protocol
    )
    default = re.search(
        r"the default `lease=60`, ([\d.]+) s after the last heartbeat \(bound (\d+) s\)", protocol
    )
    assert last_beat and started and default
    after_start = (
        30 + stale_margin(30) + BREAK_SECONDS
    )  # lease x 1.25 + 1.5 s: a waiter that starts after the crash
    for (measured, bound), exact in (
        ((last_beat.group(2), last_beat.group(3)), recovery_bound(30)),
        (started.groups(), after_start),
        (default.groups(), recovery_bound(DEFAULT_LEASE)),
    ):
        assert int(bound) == round(exact), (bound, exact)
        assert float(measured) <= int(bound) + 0.5, (measured, bound)


def test_every_pinned_range_of_the_library_is_this_versions():
    """README, docs and the example driver pin `cloudshell-mutex~=<this version>`: a driver that copies the
    pin takes this release's fixes, never a release that may break it, nor the name from elsewhere."""
    pinned = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md")), *sorted(ROOT.glob("examples/**/*.txt"))]
    pins = [
        (path.name, pin)
        for path in pinned
        for pin in re.findall(r"cloudshell-mutex~=([\w.]+)", path.read_text(encoding="utf-8"))
    ]
    assert pins and all(pin == __version__ for _, pin in pins), pins
    for requirements in ROOT.glob("examples/**/requirements.txt"):
        named = [
            line
            for line in requirements.read_text(encoding="utf-8").splitlines()
            if line.startswith("cloudshell-mutex")
        ]
        assert named == [f"cloudshell-mutex~={__version__}"], requirements


def test_what_the_releases_read_costs_is_what_make_bench_measured():
    """protocol.md says what the release's read costs at hold 0.1 s, in `make bench`'s figures: the default
    lock, the same lock without the read, the original. Each stated figure is the median of its runs in
    docs/benchmarks/results.json (rounded), the claim they make holds there (the read is most of what the
    default lock loses to the original), and the sections it cites are in docs/benchmarks.md."""
    stated = re.search(
        r"the default lock made (\d+) grants/min, the same lock without the read\s+"
        r"\(`release_check_after=5`\) (\d+), and the original (\d+)",
        one_line(PROTOCOL),
    )
    assert stated, "protocol.md states what the release's read costs in make bench's figures"
    results, _, _ = load_results(ROOT / "docs" / "benchmarks" / "results.json")
    (cell,) = [cell for cell, names in DECIDE.groups if RELEASE_UNREAD in names]
    measured = {}
    for name in ("default", RELEASE_UNREAD, BASELINE):
        measured[name] = [
            r.metrics.acquisitions_per_minute for r in results if r.contender == name and r.cell == cell
        ]
        assert measured[name], f"make bench ran no {name} at N=8, hold 0.1 s: run it again"
    for name, figure in zip(measured, stated.groups()):
        assert abs(float(figure) - median(measured[name])) <= 1, (name, figure, measured[name])
    default, unread, original = (median(measured[name]) for name in measured)
    assert unread - default > original - unread, measured
    for cited in ("N=8, hold 0.1 s, re-acquire at once", "the same without the release's read"):
        assert cited in one_line(PROTOCOL) and cited in BENCHMARKS, cited
