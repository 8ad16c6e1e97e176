"""Loss parity: the same model, data order and hyperparameters in BF16 and FP8; compare final
validation loss. Runs the real trainer once per variant (``throughput.run_variant``) and writes
``data/results/<study>/<model>-<variant>.jsonl`` with every validation point and downsampled steps.

    python benchmarks/loss_parity.py --model llama-1b \
        --model-args "--model-override hidden_size=768,intermediate_size=2048,num_layers=12,num_heads=12,num_kv_heads=4" \
        --steps 400 --val-every 20 --variants te-bf16,te-fp8-delayed,te-fp8-current

Remedies when FP8 trails (recipe, amax history, margin, first/last layers in BF16) are extra variants
(``--variants`` lists them all; see LOSS_VARIANTS).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from throughput import REPO, VARIANTS, prepare_once, run_variant  # noqa: E402
from fp8lab.plan.memory_modes import NAMES as MEMORY_MODES  # noqa: E402

LOSS_VARIANTS: dict[str, list[str]] = {
    "hf-bf16": VARIANTS["hf-bf16"],
    "te-bf16": VARIANTS["te-bf16"],
    "te-fp8-delayed": VARIANTS["te-fp8-delayed"],
    "te-fp8-current": VARIANTS["te-fp8-current"],
    "te-fp8-block": VARIANTS["te-fp8-block"],
    # the memory modes (fp8lab.plan.memory_modes), FP8 delayed as in the loss study
    **{f"te-fp8-delayed-mem-{m}": [*VARIANTS["te-fp8-delayed"], "--memory", m] for m in MEMORY_MODES},
    # the blocks' weights cast from bf16 or kept only in FP8 (fp8lab.plan.fp8_weights), both under --memory offload
    **{f"te-fp8-delayed-fp8w-{w}": [*VARIANTS["te-fp8-delayed"], "--memory", "offload", "--fp8-weights", w]
       for w in ("cast", "primary")},
    "te-fp8-delayed-h16": ["--precision", "fp8", "--backend", "te", "--recipe", "delayed:amax_history_len=16", "--fuse", "True"],
    "te-fp8-delayed-h16-recent": ["--precision", "fp8", "--backend", "te", "--fuse", "True",
                                  "--recipe", "delayed:amax_history_len=16,amax_compute_algo=most_recent"],
    "te-fp8-delayed-margin1": ["--precision", "fp8", "--backend", "te", "--recipe", "delayed:margin=1", "--fuse", "True"],
    "te-fp8-delayed-edge1": [*VARIANTS["te-fp8-delayed"], "--bf16-edge-blocks", "1"],
    # the LM head in FP8 too, over the full logits (session 21's study: the backend's FP8 layer)
    "te-fp8-delayed-head": [*VARIANTS["te-fp8-delayed"], "--fused-loss", "off", "--fp8-lm-head", "True"],
    # the LM head's GEMMs in FP8 in the fused loss's chunks (fp8lab.train.fp8_head), and its control with them in BF16
    "te-fp8-delayed-headchunks": [*VARIANTS["te-fp8-delayed"], "--fused-loss", "on", "--fp8-lm-head", "True"],
    "te-fp8-delayed-headbf16": [*VARIANTS["te-fp8-delayed"], "--fused-loss", "on", "--fp8-lm-head", "False"],
    "te-fp8-current-edge1": [*VARIANTS["te-fp8-current"], "--bf16-edge-blocks", "1"],
    "emulated-fp8-delayed": ["--precision", "fp8", "--backend", "emulated", "--recipe", "delayed"],
    "emulated-fp8-delayed-edge1": ["--precision", "fp8", "--backend", "emulated", "--recipe", "delayed",
                                   "--bf16-edge-blocks", "1"],
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--model-args", default="", help="extra trainer options (model overrides, batch)")
    p.add_argument("--variants", default="te-bf16,te-fp8-delayed", help="comma list of: " + ", ".join(LOSS_VARIANTS))
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--val-every", type=int, default=20)
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--lr", default="6e-4")
    p.add_argument("--common-args", default="--seq-len 1024 --micro-batch-size 16")
    p.add_argument("--data", default=None)
    p.add_argument("--study", default="loss-parity")
    p.add_argument("--out", default=None)
    p.add_argument("--work", default="/tmp/fp8lab-loss")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--tag", default="", help="suffix of every run id (several studies of one model in one folder)")
    p.add_argument("--note", default="", help="free text kept in each run record")
    p.add_argument("--max-step-records", type=int, default=200, help="downsample step records to about this many")
    args = p.parse_args(argv)
    args.warmup = 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in LOSS_VARIANTS]
    if bad:
        p.error(f"--variants: unknown {', '.join(bad)}; allowed: {', '.join(LOSS_VARIANTS)}")
    from fp8lab.analysis import write_result_file

    extra = shlex.split(args.common_args) + shlex.split(args.model_args) + [
        "--val-every", str(args.val_every), "--val-batches", str(args.val_batches), "--lr", args.lr]
    out = Path(args.out) if args.out else REPO / "data" / "results" / args.study
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    args.cpu_smoke = args.model.endswith("-tiny")
    prepare_once(args, work)
    finals = {}
    for v in variants:
        res = run_variant(args.model, v, LOSS_VARIANTS[v], extra, args, work)
        if "error" in res:
            print(f"[loss] {res['run_id']}: FAILED {res['error']}", flush=True)
            continue
        res["run"]["study"] = args.study
        write_result_file(out / f"{res['run_id']}.jsonl", res["run"], res["steps"], res["summary"])
        finals[v] = res["summary"].get("val_loss")
        print(f"[loss] {res['run_id']}: train {res['summary']['first_loss']:.3f}->{res['summary']['loss']:.3f} "
              f"val {finals[v]} ({res['seconds']:.0f}s)", flush=True)
    base = next((finals[v] for v in ("te-bf16", "hf-bf16") if finals.get(v)), None)
    for v, val in finals.items():
        gap = f"{100 * (val / base - 1):+.2f}% vs BF16" if base and val else ""
        print(f"{v:<26} final val loss {val}  {gap}")
    return 0 if len(finals) == len(variants) else 1


if __name__ == "__main__":
    raise SystemExit(main())
