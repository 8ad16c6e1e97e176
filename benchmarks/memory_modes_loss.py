"""The memory modes' loss check: each mode's final validation loss (mean of its seeds) against the plain mode's seeds.

    python benchmarks/memory_modes_loss.py data/results/memory-modes-h100
    python benchmarks/memory_modes_loss.py data/results/fp8-head-chunks-h100 te-fp8-delayed-head bf16

The second form checks other variants alike: those named ``<prefix><name>-<N>m-s<seed>``, against the ``<name>`` given
last (there: the LM head's GEMMs in FP8 in the loss's chunks, ``chunks``, against the same in BF16, ``bf16``).

Reads the loss runs benchmarks/study_loss_parity.py wrote there (``--runs mem-<mode>-s<seed>``: llama-1b, FP8 delayed,
the Linux corpus, the same tokens, init and data order per seed) and writes ``loss.json``: per mode its seeds' losses,
the gap of their mean to the plain mean, and ``holds`` when that gap is inside the plain seeds' band (max(0.5% of the
mean, max - min of the plain seeds): the project's loss criterion, fp8lab.analysis.parity.against_seeds).
fp8lab.plan.evidence reads ``holds``: ``--memory auto`` may pick only a mode that holds.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fp8lab.analysis.load import run_and_summary  # noqa: E402
from fp8lab.analysis.parity import against_seeds  # noqa: E402
from fp8lab.plan import memory_modes  # noqa: E402

PREFIX = "te-fp8-delayed-mem-"


def final_losses(folder: Path, prefix: str = PREFIX) -> dict[str, dict[int, float]]:
    """mode -> seed -> final validation loss, from the run records of ``folder`` whose variant starts with ``prefix``."""
    out: dict[str, dict[int, float]] = {}
    for f in sorted(folder.glob("*.jsonl")):
        run, summary = run_and_summary(f)
        variant = str(run.get("variant", ""))
        if not variant.startswith(prefix) or summary.get("val_loss") is None:
            continue
        mode = variant[len(prefix):].rsplit("-", 2)[0]  # te-fp8-delayed-mem-<mode>-<N>m-s<seed>
        out.setdefault(mode, {})[int(run["seed"])] = float(summary["val_loss"])
    return out


def check(folder: Path, prefix: str = PREFIX, baseline: str = memory_modes.PLAIN) -> dict:
    losses = final_losses(folder, prefix)
    plain = losses.get(baseline, {})
    if len(plain) < 2:
        raise SystemExit(f"{folder}: the {baseline} runs need two seeds, found {sorted(plain)}")
    modes = {}
    for mode, by_seed in losses.items():
        if mode == baseline:
            continue
        mean = sum(by_seed.values()) / len(by_seed)
        g = against_seeds(list(plain.values()), mean)
        modes[mode] = {"val_loss": by_seed, "val_loss_mean": mean, "gap_pct": g["gap_pct"], "band_pct": g["band_pct"],
                       "seeds": len(by_seed), "holds": bool(g["in_band"] and len(by_seed) >= 2)}
    g = against_seeds(list(plain.values()), next(iter(plain.values())))
    return {"criterion": f"|mode mean - {baseline} mean| <= max(0.5% of the {baseline} mean, max - min of the {baseline} "
                         "seeds), final validation loss, two seeds or more each",
            baseline: {"val_loss": plain, "mean": g["mean"], "spread_pct": g["spread_pct"], "band_pct": g["band_pct"]},
            "modes": modes}


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    result = check(folder, *sys.argv[2:4])
    (folder / "loss.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, indent=1, sort_keys=True))
