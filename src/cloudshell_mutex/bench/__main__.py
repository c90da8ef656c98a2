"""``python -m cloudshell_mutex.bench``: run a plan and write docs/benchmarks.md with its plots."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import List, Optional

from .plans import PLANS
from .report import write_report
from .runner import BenchError, run_plan


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m cloudshell_mutex.bench",
        description="Benchmark ReservationMutex against the original snippet on the embedded emulator.",
    )
    parser.add_argument(
        "--plan", default="quick", help=f"which plan to run: {', '.join(PLANS)} (default: quick)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="repeat every run this often (default: the plan's)"
    )
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"), help="the report to write")
    parser.add_argument(
        "--plots", type=Path, default=Path("docs/benchmarks"), help="the folder for the PNG plots"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the clients' think times")
    args = parser.parse_args(argv)
    if args.plan not in PLANS:
        parser.error(f"unknown plan {args.plan!r}: use one of {', '.join(PLANS)} (make bench BENCH=full)")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    """Run the plan, write the report; 1 when a client failed."""
    args = parse_args(argv)
    plan = PLANS[args.plan]
    if args.repeats is not None:
        plan = dataclasses.replace(plan, repeats=args.repeats)
    print(
        f"{plan.name} plan: {plan.run_count} runs with up to {plan.max_clients} client processes, "
        f"about {plan.estimated_seconds() / 60:.0f} min",
        flush=True,
    )
    try:
        results, seconds = run_plan(plan, progress=lambda line: print(line, flush=True), seed=args.seed)
    except BenchError as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 1
    for path in write_report(results, plan, seconds, args.doc, args.plots):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
