"""Summaries of the long-context study (benchmarks/study_long_context.sh, issue 34), from its result files.

    python3 benchmarks/long_context.py crossover data/results/long-context-h200   # -> crossover.json
    python3 benchmarks/long_context.py loss data/results/long-context-h200        # -> loss.json

``crossover``: per sequence length of the 3B-shape runs (run ids ``*-3b-s<N>``), tokens/s/GPU of BF16, FP8
(attention off) and FP8 + FP8 attention, the FP8/BF16 ratios, and the measured crossover: the shortest
length from which FP8 attention is faster than FP8 without it at that length and every longer one
(``fp8lab.fp8attn.CROSSOVER_SEQ_LEN`` is set to it; ``tests/unit/test_long_context.py`` holds the two equal).
``loss``: the mean loss of the last ``LAST`` steps of the same-seed runs without / with FP8 attention (and with
``NVTE_FP8_DPA_BWD=0``), relative to FP8 without (the issue's bound: 0.5%). Both files say how they were made.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fp8lab.fp8attn import study_runs  # noqa: E402  (the same reader as the notebook's figure)

LAST = 10  # steps averaged for the loss comparison


def _provenance(recs: list[dict], argv: list[str]) -> dict:
    run = recs[0]["run"]
    return {"command": "python3 benchmarks/long_context.py " + " ".join(argv), "gpu_name": run["gpu_name"],
            "versions": run["versions"], "runs": sorted(r["run"]["run_id"] for r in recs)}


def crossover(folder: Path, argv: list[str]) -> dict:
    by_seq = study_runs(folder, "3b")
    rows, faster = {}, []
    for seq in sorted(by_seq):
        r = {role: by_seq[seq][role]["summary"]["tokens_per_sec_per_gpu"] for role in ("bf16", "fp8", "fp8_attn") if role in by_seq[seq]}
        if "bf16" in r:
            r.update({f"{k}_over_bf16": r[k] / r["bf16"] for k in ("fp8", "fp8_attn") if k in r})
        rows[seq] = r
        if "fp8" in r and "fp8_attn" in r:
            faster.append((seq, r["fp8_attn"] > r["fp8"]))
    # the shortest length from which FP8 attention wins at every longer measured length
    cross = next((s for i, (s, _) in enumerate(faster) if all(w for _, w in faster[i:])), None)
    recs = [rec for roles in by_seq.values() for rec in roles.values()]
    if not recs:
        raise SystemExit(f"no long-context result files (variant default-*-3b-s<N>) in {folder}")
    return {"crossover_seq_len": cross, "rule": "shortest sequence from which fp8+FP8 attention beats fp8 at every longer one",
            "tokens_per_sec_per_gpu": {str(k): v for k, v in rows.items()}, **_provenance(recs, argv)}


def _tail_loss(rec: dict) -> float:
    losses = [s["loss"] for s in rec["steps"] if s.get("loss") is not None]
    return sum(losses[-LAST:]) / len(losses[-LAST:])


def loss(folder: Path, argv: list[str]) -> dict:
    runs = {**{f"{role}": r for role, r in next(iter(study_runs(folder, "loss").values()), {}).items()},
            **{f"{role}_bwd0": r for role, r in next(iter(study_runs(folder, "loss-bwd0").values()), {}).items()}}
    if "fp8" not in runs:
        raise SystemExit(f"no loss runs (variant default-fp8-noattn-loss-s<N>) in {folder}")
    base = _tail_loss(runs["fp8"])
    rows = {k: {"mean_loss_last_steps": _tail_loss(r), "relative_to_fp8": _tail_loss(r) / base - 1,
                "nvte_fp8_dpa_bwd": r["run"].get("nvte_fp8_dpa_bwd")} for k, r in runs.items()}
    return {"last_steps": LAST, "bound": 0.005, "within_bound": all(abs(v["relative_to_fp8"]) <= 0.005 for v in rows.values()),
            "runs_by_role": rows, **_provenance(list(runs.values()), argv)}


def main(argv: list[str]) -> int:
    what, folder = argv[0], Path(argv[1])
    result = {"crossover": crossover, "loss": loss}[what](folder, argv)
    (folder / f"{what}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("versions", "runs")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
