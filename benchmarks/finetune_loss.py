"""The fine-tune loss study's table (benchmarks/study_finetune.sh parts F, U, C): each variant's held-out answer
loss per seed, its mean's gap to BF16's mean, and BF16's seed band (max - min over mean), from the result files.

    python benchmarks/finetune_loss.py data/results/finetune-h100            # prints the table
    python benchmarks/finetune_loss.py data/results/finetune-h100 --write    # and writes its loss.json
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TAG = re.compile(r"^default-(?P<precision>bf16|fp8)-(?P<tag>ft(?:-[a-z]+)?)-s(?P<seed>\d+)$")


def table(folder: Path) -> dict:
    runs: dict[str, dict[int, float]] = {}
    for f in sorted(folder.glob("*-ft*-s*.jsonl")):
        recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        meta = next(r for r in recs if r.get("record") == "run")
        end = next((r for r in recs if r.get("record") == "summary"), {})
        m = TAG.match(meta["variant"])
        if m is None or end.get("val_loss") is None:
            continue
        name = f"{m['precision']} {m['tag']}"
        runs.setdefault(name, {})[int(m["seed"])] = float(end["val_loss"])
    base = runs.get("bf16 ft")
    if not base or len(base) < 2:
        raise SystemExit(f"{folder}: no two BF16 seeds (bf16 ft) to make the band from")
    mean = sum(base.values()) / len(base)
    out = {"bf16_mean": mean, "band_pct": 100 * (max(base.values()) - min(base.values())) / mean, "variants": {}}
    for name, seeds in sorted(runs.items()):
        vmean = sum(seeds.values()) / len(seeds)
        pairs = {s: 100 * (v / base[s] - 1) for s, v in seeds.items() if s in base}
        out["variants"][name] = {"seeds": seeds, "mean": vmean, "gap_pct": 100 * (vmean / mean - 1),
                                 "same_seed_gap_pct": pairs}
    return out


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    if sys.argv[2:] not in ([], ["--write"]):
        raise SystemExit("usage: finetune_loss.py FOLDER [--write]")
    t = table(folder)
    print(f"BF16 mean {t['bf16_mean']:.4f}, band {t['band_pct']:.2f}%")
    for name, v in t["variants"].items():
        seeds = " / ".join(f"{s}: {x:.4f}" for s, x in sorted(v["seeds"].items()))
        print(f"{name:18s} {seeds}  mean {v['mean']:.4f}  gap {v['gap_pct']:+.2f}%")
    if sys.argv[2:] == ["--write"]:
        (folder / "loss.json").write_text(json.dumps(t, indent=1) + "\n")
