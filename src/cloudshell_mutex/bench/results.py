"""The raw results of a benchmark as JSON, so that a report can be written again without measuring again.

``make bench`` saves them beside the plots (``docs/benchmarks/results.json``);
``python -m cloudshell_mutex.bench --from-results PATH`` writes the report from such a file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from .metrics import NO_WAITS, Distribution, RunMetrics
from .plans import PLANS, Cell, Plan
from .runner import RunResult

FORMAT = 1


def save_results(path: Path, results: Sequence[RunResult], plans: Sequence[Plan], seconds: float) -> Path:
    """Write ``results`` (and which plans made them, and how long they took) to ``path``."""
    document = {
        "format": FORMAT,
        "plans": [{"name": plan.name, "repeats": plan.repeats} for plan in plans],
        "seconds": seconds,
        "runs": [dataclasses.asdict(result) for result in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return path


def _metrics(data: Dict[str, Any]) -> RunMetrics:
    return RunMetrics(
        **{
            **data,
            "wait": Distribution(**data["wait"]),
            "handoff_gap": Distribution(**data["handoff_gap"]),
            # Results saved before the early waits were measured have none: their verdicts say so.
            "early_wait": Distribution(**data["early_wait"]) if "early_wait" in data else NO_WAITS,
            "grants_per_client": tuple(data["grants_per_client"]),
        }
    )


def load_results(path: Path) -> Tuple[List[RunResult], List[Plan], float]:
    """Read what :func:`save_results` wrote: the results, the plans (name and repeats) and the seconds."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read benchmark results ({error})") from error
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(
            f"{path}: not a results file of this benchmark (format {FORMAT}); run make bench again"
        )
    plans = [
        dataclasses.replace(PLANS[p["name"]], repeats=p["repeats"])
        if p["name"] in PLANS
        else Plan(p["name"], (), p["repeats"])
        for p in document["plans"]
    ]
    results = [
        RunResult(
            cell=Cell(**run["cell"]),
            contender=run["contender"],
            repeat=run["repeat"],
            metrics=_metrics(run["metrics"]),
            ran_without_lock=run["ran_without_lock"],
        )
        for run in document["runs"]
    ]
    return results, plans, float(document["seconds"])
