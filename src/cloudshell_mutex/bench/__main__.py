"""``python -m cloudshell_mutex.bench``: run a plan and write docs/benchmarks.md with its plots."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import List, Optional

from .plans import PLANS
from .report import write_report
from .results import load_results, save_results
from .runner import BenchError, run_plans


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m cloudshell_mutex.bench",
        description="Benchmark ReservationMutex against the original snippet on the embedded emulator.",
    )
    parser.add_argument(
        "--plan",
        default="decide",
        help=f"the plans to run, separated by commas: {', '.join(PLANS)} (default: decide)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="repeat every run this often (default: the plan's)"
    )
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"), help="the report to write")
    parser.add_argument(
        "--plots", type=Path, default=Path("docs/benchmarks"), help="the folder for the PNG plots"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the clients' think times")
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="where to save the raw results as JSON (default: results.json in the plots folder)",
    )
    parser.add_argument(
        "--from-results",
        type=Path,
        default=None,
        metavar="PATH",
        help="measure nothing: write the report again from a results file that an earlier run saved",
    )
    args = parser.parse_args(argv)
    args.plans = [name.strip() for name in args.plan.split(",") if name.strip()]
    unknown = [name for name in args.plans if name not in PLANS]
    if unknown or not args.plans:
        parser.error(
            f"unknown plan {', '.join(map(repr, unknown)) or repr(args.plan)}: use one of "
            f"{', '.join(PLANS)}, or several separated by commas (make bench BENCH=quick,targets)"
        )
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    """Run the plans, write the report; 1 when a client failed."""
    args = parse_args(argv)
    if args.from_results is not None:
        try:
            results, plans, seconds = load_results(args.from_results)
        except ValueError as error:
            print(f"benchmark report failed: {error}", file=sys.stderr)
            return 1
        for path in write_report(results, plans, seconds, args.doc, args.plots):
            print(f"wrote {path}")
        return 0
    plans = [PLANS[name] for name in args.plans]
    if args.repeats is not None:
        plans = [dataclasses.replace(plan, repeats=args.repeats) for plan in plans]
    for plan in plans:
        print(
            f"{plan.name} plan: {plan.run_count} runs with up to {plan.max_clients} client processes, "
            f"about {plan.estimated_seconds() / 60:.0f} min",
            flush=True,
        )
    try:
        results, seconds = run_plans(plans, progress=lambda line: print(line, flush=True), seed=args.seed)
    except BenchError as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 1
    saved = save_results(args.results or args.plots / "results.json", results, plans, seconds)
    print(f"wrote {saved}")
    for path in write_report(results, plans, seconds, args.doc, args.plots):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
