"""The FP8 LM head's GPU check: what ``--fp8-lm-head auto`` waits for (fp8lab.plan.evidence).

    python benchmarks/fp8_head_check.py data/results/fp8-head-chunks-h100 --tests-log benchmarks/logs/<session>/tests.txt

Reads what ``benchmarks/study_fp8_head_chunks.sh T S L`` wrote: the GPU tests' pytest summary (``--tests-log``), the
speed runs (per model ``<model>-default-fp8-fp8head-<gpu>`` against ``<model>-default-fp8-bf16head-<gpu>``, and
``<model>-default-bf16-<gpu>``) and the loss check (``loss.json`` of ``benchmarks/memory_modes_loss.py FOLDER
te-fp8-delayed-head bf16``: the head in FP8, ``chunks``, against the head in BF16). Writes ``check.json`` beside them:
``passed`` when the tests passed with none failed or skipped, the FP8 head was faster than the BF16 head for each of
the study's models (MODELS; each record's ``fp8_lm_head`` as its variant says), and its loss stayed inside the
BF16-head runs' band; each part's figures as measured.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fp8lab.analysis.load import run_and_summary  # noqa: E402

FP8_HEAD, BF16_HEAD, BF16 = "default-fp8-fp8head", "default-fp8-bf16head", "default-bf16"
MODELS = ("llama-1b", "llama-3.2-1b", "qwen2.5-1.5b")  # the study's (benchmarks/study_fp8_head_chunks.sh S)
HEAD_OF = {FP8_HEAD: True, BF16_HEAD: False}  # what each variant's records must say they ran


def _speeds(folder: Path) -> dict[str, dict[str, float]]:
    """model -> variant (without the GPU tag) -> tokens/s/GPU, from the run records of ``folder``."""
    out: dict[str, dict[str, float]] = {}
    for f in sorted(folder.glob("*.jsonl")):
        run, summary = run_and_summary(f)
        variant = str(run.get("variant", ""))
        speed = summary.get("tokens_per_sec_per_gpu")
        for name in (FP8_HEAD, BF16_HEAD, BF16):
            if variant.startswith(name + "-") and speed:
                if name in HEAD_OF and run.get("fp8_lm_head") is not HEAD_OF[name]:
                    raise SystemExit(f"{f.name}: fp8_lm_head {run.get('fp8_lm_head')!r}, not {HEAD_OF[name]} as "
                                     f"its variant {variant} says")
                out.setdefault(str(run["model"]), {})[name] = float(speed)
    return out


def tests_outcome(text: str) -> tuple[bool, str]:
    """(passed, pytest's summary line) from a pytest log: passed with none failed, in error or skipped (a GPU test
    skips where Transformer Engine or the GPU is missing: that checks nothing)."""
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", ln)]
    last = lines[-1].strip("= ").strip() if lines else ""
    return bool(last) and "passed" in last and not any(w in last for w in ("failed", "error", "skipped")), last


def check(folder: Path, tests_text: str) -> dict:
    ok_tests, summary = tests_outcome(tests_text)
    speed = {}
    for model, v in _speeds(folder).items():
        if FP8_HEAD in v and BF16_HEAD in v:
            speed[model] = {"fp8_head": v[FP8_HEAD], "bf16_head": v[BF16_HEAD],
                            "gain_pct": 100 * (v[FP8_HEAD] / v[BF16_HEAD] - 1),
                            "fp8_over_bf16": v[FP8_HEAD] / v[BF16] if BF16 in v else None}
    loss_file = folder / "loss.json"
    loss = json.loads(loss_file.read_text()) if loss_file.exists() else {}
    chunks = (loss.get("modes") or {}).get("chunks") or {}
    faster = set(MODELS) <= set(speed) and all(s["gain_pct"] > 0 for s in speed.values())
    holds = chunks.get("holds") is True
    return {"passed": ok_tests and faster and holds,
            "tests": {"passed": ok_tests, "summary": summary},
            "speed": {"faster_everywhere": faster, "models": speed,
                      "missing": sorted(set(MODELS) - set(speed))},
            "loss": {"holds": holds, "gap_pct": chunks.get("gap_pct"), "band_pct": chunks.get("band_pct"),
                     "committed": bool(loss)}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--tests-log", type=Path, required=True, help="the GPU tests' pytest output (part T's tests.txt)")
    args = p.parse_args(argv)
    result = check(args.folder, args.tests_log.read_text(encoding="utf-8"))
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    (args.folder / "check.json").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
