"""What the FP8 health statistics cost (issue 31), two ways. ``overhead_pct``: the mean step time of each
``...-stats<K>`` (or ``...-stats<K>-<source>``: ``--fp8-stats-source``) result file against the ``...-stats0`` one (statistics off), over the timed steps after
``--skip`` (a median would hide the sampled steps' cost); runs of different lengths also differ by any drift of
the step time. ``sample_cost_s``: within one run, the mean sampled step minus the median unsampled one, and
``overhead_from_sample_cost_pct`` that cost spread over K steps (drift-free). Writes the comparison as JSON.

    python benchmarks/fp8stats_overhead.py RESULTS_DIR OUT.json [--skip 10] [--check CHECK.json]

``--check``: the GPU check that lets ``--fp8-stats-source auto`` pick TE's debug API (fp8lab/plan/evidence.json: `fp8lab report --docs` reads data/results/fp8stats-sources/check.json),
from the ``te-debug`` run: ``passed`` when every sampled step wrote a record read by TE's debug API with an
activation, a weight and a gradient row for each GEMM, and one sample, spread over the interval ``auto`` would use
at that run's accumulation, costs at most fp8lab.plan.fp8_stats.COST_GOAL_PCT of the step time.
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
    m = re.search(r"stats(\d+)(?:-([a-z0-9-]+))?$", path.stem)
    k = int(m.group(1))
    times = {r["step"]: r["step_time_s"] for r in recs if r.get("record") == "step" and r["step"] > skip
             and r.get("step_time_s")}
    stats = [r for r in recs if r.get("record") == "fp8_stats"]
    sampled = [t for s, t in times.items() if k and s % k == 0]
    plain = [t for s, t in times.items() if not (k and s % k == 0)]
    out = {"run": path.stem, "every": k, "source": m.group(2) or (run.get("fp8_stats_source") if k else None), "command": run.get("command"), "date": run.get("date"), "timed_steps": len(times),
           "steps": [min(times), max(times)], "sampled_steps": len(sampled),
           "mean_step_time_s": statistics.mean(times.values()), "median_step_time_s": statistics.median(times.values())}
    out.update(versions={k_: (run.get("versions") or {}).get(k_) for k_ in ("transformer_engine", "nvdlfw_inspect")},
               grad_accum=run.get("grad_accum"), stats_steps=[r["step"] for r in stats],
               stats_sources=sorted({r.get("source") or "fp8lab" for r in stats}),
               stats_rows={k_: n for k_, n in _row_kinds(stats).items()} if stats else {})
    if sampled:  # within the run: what one sample adds to its step, and so what sampling every k steps costs
        cost = statistics.mean(sampled) - statistics.median(plain)
        out.update(sample_cost_s=cost, overhead_from_sample_cost_pct=100 * cost / (k * statistics.median(plain)))
    return out


def _row_kinds(stats: list[dict]) -> dict[str, int]:
    """Tensor kind -> how many GEMMs the last record has a row for."""
    kinds: dict[str, int] = {}
    for row in stats[-1]["layers"]:
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
    return kinds


def te_debug_check(arms: list[dict], steps: int) -> dict:
    """The check of TE's debug API as --fp8-stats-source auto would run it (see the module's docstring)."""
    from fp8lab.fp8 import stats as fp8stats
    from fp8lab.plan import fp8_stats as fp8rule

    r = next((a for a in arms if a.get("source") == fp8stats.TE_DEBUG), None)
    if r is None:
        return {"passed": False, "problems": ["no --fp8-stats-source te-debug run"]}
    problems = []
    want = [s for s in range(r["every"], steps + 1, r["every"])]
    if r["stats_steps"] != want or r["stats_sources"] != [fp8stats.TE_DEBUG]:
        problems.append(f"records at steps {r['stats_steps']} from {r['stats_sources']}, expected steps {want} from te-debug")
    rows = r["stats_rows"]
    if len(set(rows.values())) != 1 or set(rows) != set(fp8stats.KINDS.values()):
        problems.append(f"rows per kind {rows}: expected an activation, a weight and a gradient row for each GEMM")
    every = fp8rule.default_every("te", r["grad_accum"] or 1)
    cost = 100 * r["sample_cost_s"] / (every * r["median_step_time_s"]) if "sample_cost_s" in r else None
    if cost is None or cost > fp8rule.COST_GOAL_PCT:
        problems.append(f"cost at the default interval ({every} steps): "
                        + ("unmeasured" if cost is None else f"{cost:.1f}% of the step time (one sample "
                                                             f"{r['sample_cost_s']:.2f} s)")
                        + f" > {fp8rule.COST_GOAL_PCT:g}%")
    return {"passed": not problems, "problems": problems, "run": r["run"], "command": r["command"], "date": r["date"],
            "default_every": every, "sample_cost_s": r.get("sample_cost_s"), "cost_at_default_pct": cost,
            "goal_pct": fp8rule.COST_GOAL_PCT, "rows_per_kind": rows,
            # auto trusts the check on the Transformer Engine it ran on only (fp8lab.fp8.te_debug.untested_te)
            **{k: (r.get("versions") or {}).get(k) for k in ("transformer_engine", "nvdlfw_inspect")}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results")
    p.add_argument("out")
    p.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the means")
    p.add_argument("--check", help="also write the GPU check of TE's debug API here (see above)")
    a = p.parse_args(argv)
    arms = sorted((arm(f, a.skip) for f in Path(a.results).glob("*-stats*.jsonl")), key=lambda r: (r["every"], r["source"] or ""))
    off = next((r for r in arms if r["every"] == 0), None)  # without an off run: the within-run cost only
    result = {"off": off, "on": [{**r, **({"overhead_pct": 100 * (r["mean_step_time_s"] / off["mean_step_time_s"] - 1)}
                                          if off else {})} for r in arms if r["every"]]}
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    if a.check:
        steps = max(r["steps"][1] for r in arms)
        Path(a.check).write_text(json.dumps(te_debug_check(arms, steps), indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
