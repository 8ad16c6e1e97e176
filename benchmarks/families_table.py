"""The speed rows of docs/own-model.md's family table, from the families study's result files.

    python benchmarks/families_table.py [data/results/families-h200]

For each model folder of ``benchmarks/study_families.sh``: tokens/s per GPU in BF16 and FP8 (the
plain commands' default layouts), the FP8/BF16 ratio, BF16 MFU, the layout and the config.json hash.
Prints markdown; a model with one precision missing says so instead of a ratio.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def read(folder: Path) -> dict[str, dict[str, dict]]:
    """model -> precision -> {"run": ..., "summary": ...}"""
    out: dict[str, dict[str, dict]] = {}
    for f in sorted(folder.glob("*.jsonl")):
        recs = {}
        for line in f.read_text().splitlines():
            r = json.loads(line)
            recs.setdefault(r["record"], r)
        if "run" in recs and "summary" in recs:
            out.setdefault(recs["run"]["model"], {})[recs["run"]["precision"]] = recs
    return out


def rows(folder: Path) -> list[str]:
    lines = ["| model | model_type | layout (mb x seq x accum) | BF16 tok/s/GPU | FP8 tok/s/GPU | FP8/BF16 | BF16 MFU | config sha256 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model, by in read(folder).items():
        b, f = by.get("bf16"), by.get("fp8")
        any_run = (b or f)["run"]
        layout = f"{any_run['micro_batch_size']} x {any_run['seq_len']} x {any_run['grad_accum']}"
        bt = f"{b['summary']['tokens_per_sec_per_gpu']:,.0f}" if b else "not measured"
        ft = f"{f['summary']['tokens_per_sec_per_gpu']:,.0f}" if f else "not measured"
        ratio = f"{f['summary']['tokens_per_sec_per_gpu'] / b['summary']['tokens_per_sec_per_gpu']:.3f}x" if b and f else "-"
        mfu = f"{b['summary']['mfu']:.1%}" if b and b["summary"].get("mfu") else "-"
        sha = (any_run.get("model_config_sha256") or "")[:16]
        lines.append(f"| {model} | {any_run.get('model_type')} | {layout} | {bt} | {ft} | {ratio} | {mfu} | {sha} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else REPO / "data" / "results" / "families-h200"
    if not folder.is_dir():
        print(f"no result folder {folder}: run benchmarks/study_families.sh on the H200 first", file=sys.stderr)
        return 1
    print("\n".join(rows(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
