"""What the FP8 health statistics cost (issue 31), two ways. ``overhead_pct``: the mean step time of each
``...-stats<K>`` result file against the ``...-stats0`` one (statistics off), over the timed steps after
``--skip`` (a median would hide the sampled steps' cost); runs of different lengths also differ by any drift of
the step time. ``sample_cost_s``: within one run, the mean sampled step minus the median unsampled one, and
``overhead_from_sample_cost_pct`` that cost spread over K steps (drift-free). Writes the comparison as JSON.

    python benchmarks/fp8stats_overhead.py RESULTS_DIR OUT.json [--skip 10]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fp8lab.analysis.load import read_jsonl  # noqa: E402


def arm(path: Path, skip: int) -> dict:
    recs = [r for _, r in read_jsonl(path)]
    run = next(r for r in recs if r.get("record") == "run")
    k = int(re.search(r"stats(\d+)$", path.stem).group(1))
    times = {r["step"]: r["step_time_s"] for r in recs if r.get("record") == "step" and r["step"] > skip
             and r.get("step_time_s")}
    sampled = [t for s, t in times.items() if k and s % k == 0]
    plain = [t for s, t in times.items() if not (k and s % k == 0)]
    out = {"run": path.stem, "every": k, "command": run.get("command"), "date": run.get("date"), "timed_steps": len(times),
           "steps": [min(times), max(times)], "sampled_steps": len(sampled),
           "mean_step_time_s": statistics.mean(times.values()), "median_step_time_s": statistics.median(times.values())}
    if sampled:  # within the run: what one sample adds to its step, and so what sampling every k steps costs
        cost = statistics.mean(sampled) - statistics.median(plain)
        out.update(sample_cost_s=cost, overhead_from_sample_cost_pct=100 * cost / (k * statistics.median(plain)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results")
    p.add_argument("out")
    p.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the means")
    a = p.parse_args(argv)
    arms = sorted((arm(f, a.skip) for f in Path(a.results).glob("*-stats*.jsonl")), key=lambda r: r["every"])
    off = next(r for r in arms if r["every"] == 0)
    result = {"off": off, "on": [{**r, "overhead_pct": 100 * (r["mean_step_time_s"] / off["mean_step_time_s"] - 1)}
                                 for r in arms if r["every"]]}
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
