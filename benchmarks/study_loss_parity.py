"""The one-epoch loss-parity study (issue 31; benchmarks/studies/loss_parity_20m.md), resumable.

Four runs of one model on the same prepared corpus, each >= ``--tokens`` tokens (one epoch or less:
no window is seen twice), validation loss every ``--val-every`` steps on the held-out split:

    bf16-s1234   BF16 (TE layers, FP8 off), seed 1234: model init and data order
    bf16-s4321   BF16, seed 4321: another init and another data order (the seed-to-seed noise band)
    fp8-delayed  FP8 delayed scaling, seed 1234 (the same init and data order as bf16-s1234)
    fp8-current  FP8 current scaling, seed 1234

Runs go ``--gpus`` at a time (one GPU each). At ``--budget-s`` the runs still going get SIGTERM: the
trainer writes a checkpoint and exits, and the same command run again (on the same machine) resumes
them from it. A finished run becomes ``<out>/<run id>.jsonl`` (data/results format; its run record
names the corpus; its FP8 health records follow the summary); its checkpoints are then deleted. Exit 0 when all runs have result files (and ``<out>/parity.json`` holds the gaps), 3
when some are left for the next command.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loss_parity import LOSS_VARIANTS, MEMORY_MODES  # noqa: E402
from throughput import REPO, _arg_value, collect_variant, variant_command  # noqa: E402

RUNS = {"bf16-s1234": ("te-bf16", 1234), "bf16-s4321": ("te-bf16", 4321),
        "fp8-delayed": ("te-fp8-delayed", 1234), "fp8-current": ("te-fp8-current", 1234)}
# The follow-up the first results asked for (benchmarks/studies/loss_parity_20m.md): two more BF16 seeds (a band
# from four) and FP8 delayed at the second seed (a second same-seed pair); then (session 15) FP8 current at the
# second seed and FP8 delayed at a third, so that each recipe's mean is of more than one run. --runs names them;
# the default is RUNS.
FOLLOW_UP = {"bf16-s2025": ("te-bf16", 2025), "bf16-s7777": ("te-bf16", 7777),
             "fp8-delayed-s4321": ("te-fp8-delayed", 4321), "fp8-current-s4321": ("te-fp8-current", 4321),
             "fp8-delayed-s2025": ("te-fp8-delayed", 2025),
             # issue 51 (benchmarks/studies/fp8_lm_head.md): FP8 delayed with the LM head's GEMM in FP8 too, at the two
             # seeds whose FP8-delayed twins (same init, same data order, BF16 head) are committed
             "fp8-delayed-head": ("te-fp8-delayed-head", 1234), "fp8-delayed-head-s4321": ("te-fp8-delayed-head", 4321)}
# The memory modes' loss check (fp8lab.plan.memory_modes; benchmarks/study_memory_modes.sh): FP8 delayed in each mode
# at two seeds, against the plain mode at the same seeds (--tokens 5000000 --study memory-modes-h100)
MEMORY = {f"mem-{m}-s{seed}": (f"te-fp8-delayed-mem-{m}", seed)
          for m in MEMORY_MODES for seed in (1234, 4321)}
# The LM head's GEMMs in FP8 in the fused loss's chunks (benchmarks/studies/fp8_lm_head.md, part two): FP8 delayed with
# them at two seeds against the same with the head in BF16 (--tokens 5000000 --study fp8-head-chunks-h100)
HEAD_CHUNKS = {f"head{h}-s{seed}": (f"te-fp8-delayed-head{h}", seed) for h in ("chunks", "bf16") for seed in (1234, 4321)}
# --fp8-weights primary (fp8lab.plan.fp8_weights): FP8 delayed with the blocks' weights only in FP8 against the cast
# weights, both under --memory offload, at two seeds (--tokens 5000000 --study fp8-weights-h100)
FP8_WEIGHTS = {f"fp8w{w}-s{seed}": (f"te-fp8-delayed-fp8w-{w}", seed) for w in ("cast", "primary")
               for seed in (1234, 4321)}
ALL_RUNS = {**RUNS, **FOLLOW_UP, **MEMORY, **HEAD_CHUNKS, **FP8_WEIGHTS}
CPU_VARIANTS = {"te-bf16": ["--precision", "bf16", "--backend", "emulated"],  # the same script path on a CPU
                "te-fp8-delayed": ["--precision", "fp8", "--backend", "emulated", "--recipe", "delayed"],
                "te-fp8-current": ["--precision", "fp8", "--backend", "emulated", "--recipe", "current"],
                "te-fp8-delayed-head": ["--precision", "fp8", "--backend", "emulated", "--recipe", "delayed",
                                        "--fused-loss", "off", "--fp8-lm-head", "True"],
                "te-fp8-delayed-headchunks": ["--precision", "fp8", "--backend", "emulated", "--recipe", "delayed",
                                              "--fused-loss", "on", "--fp8-lm-head", "True"],
                "te-fp8-delayed-headbf16": ["--precision", "fp8", "--backend", "emulated", "--recipe", "delayed",
                                            "--fused-loss", "on", "--fp8-lm-head", "False"],
                # the memory modes need TE's FusedAdam: on a CPU only the plain mode runs
                "te-fp8-delayed-mem-plain": ["--precision", "fp8", "--backend", "emulated", "--recipe", "delayed",
                                             "--memory", "plain"]}
GRACE_S = 90  # after SIGTERM: time for the checkpoint (~15 GB for llama-1b with its AdamW state)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--data", required=True, help="prepared folder (data/corpus/build_linux.sh makes .corpus/linux-6.1)")
    p.add_argument("--tokens", type=int, default=20_000_000, help="at least this many training tokens per run")
    p.add_argument("--common-args", default="--seq-len 2048 --micro-batch-size 16 --grad-accum 1")
    p.add_argument("--lr", default="3e-4")
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--val-every", type=int, default=25)
    p.add_argument("--val-batches", type=int, default=4)
    p.add_argument("--runs", default=",".join(RUNS), help="comma list of: " + ", ".join(ALL_RUNS))
    p.add_argument("--gpus", type=int, default=0, help="runs at once, one GPU each (0: all visible GPUs, 1 on a CPU)")
    p.add_argument("--budget-s", type=float, default=450, help="seconds of training this command may start and run; then "
                   "SIGTERM and up to 90 s for the checkpoints (a 600 s command: set-up, budget, checkpoint)")
    p.add_argument("--min-left-s", type=float, default=150, help="no new run starts with less of the budget left")
    p.add_argument("--study", default="loss-parity-20m")
    p.add_argument("--tag-prefix", default="20m", help="run ids end <prefix>-s<seed> (the memory modes' check: 5m)")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default=".study/loss-parity-20m", help="run folders and checkpoints (kept between commands)")
    p.add_argument("--mirror", default=None, help="also copy each result file here the moment its run finishes (the "
                   "command's $OUT: a command cut off later still returns it)")
    p.add_argument("--cpu-smoke", action="store_true", help="the emulated backend (tests: a tiny model on a CPU)")
    args = p.parse_args(argv)
    bad = [r for r in args.runs.split(",") if r not in ALL_RUNS]
    if bad:
        p.error(f"--runs: unknown {', '.join(bad)}; allowed: {', '.join(ALL_RUNS)}")
    return args


def run_args(args, name: str):
    """The harness arguments of one run (variant_command reads steps, seed, tag, data from them)."""
    common = shlex.split(args.common_args)
    per_step = math.prod(int(_arg_value(common, k)) for k in ("--seq-len", "--micro-batch-size", "--grad-accum"))
    a = copy.copy(args)
    a.steps = math.ceil(args.tokens / per_step)
    a.seed, a.tag = ALL_RUNS[name][1], f"{args.tag_prefix}-s{ALL_RUNS[name][1]}"
    a.warmup = 0  # collect_variant's timing statistics: every step (the loss is what this study is about)
    a.max_step_records = 400
    a.note = f"issue 31 loss-parity study, run {name}"
    return a


def extra_args(args, name: str) -> list[str]:
    # FP8 runs: FP8 health every 10 steps, as session 11's committed runs sampled (the default then; now auto picks 100
    # at one micro-batch a step), read by fp8lab's hooks as then (auto would now pick TE's debug API where it is
    # installed). Before the common arguments, so a --fp8-stats-every or --fp8-stats-source there wins. BF16 runs get
    # neither: the trainer refuses FP8 statistics without FP8 (the committed BF16 runs' commands carried them unused).
    common = shlex.split(args.common_args)
    if "fp8" not in ALL_RUNS[name][0]:
        common = _without(common, "--fp8-stats-every", "--fp8-stats-source")
    health = ["--fp8-stats-every", "10", "--fp8-stats-source", "fp8lab"] if "fp8" in ALL_RUNS[name][0] else []
    return health + common + [
        "--lr", args.lr, "--warmup-steps", str(args.warmup_steps), "--val-every", str(args.val_every),
        "--val-batches", str(args.val_batches), "--resume", "True", "--checkpoint-every", "0", "--keep-checkpoints", "1"]


def _without(argv: list[str], *options: str) -> list[str]:
    """``argv`` without the given options and their values."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out


def run_id_of(args, name: str) -> str:
    return variant_command(args.model, ALL_RUNS[name][0], [], [], run_args(args, name), Path("."))[0]


def flags_of(args, name: str) -> list[str]:
    variant = ALL_RUNS[name][0]
    return (CPU_VARIANTS if args.cpu_smoke else LOSS_VARIANTS)[variant]


def finish_run(args, name: str, work: Path, out: Path, cmd: list[str], t0: float) -> None:
    """The result file of a completed run, its FP8 health records beside it; its checkpoints removed."""
    from fp8lab.fp8 import stats as fp8stats
    from fp8lab.records import metrics as fmetrics
    from fp8lab.analysis import write_result_file

    a = run_args(args, name)
    variant = ALL_RUNS[name][0]
    res = collect_variant(args.model, variant, flags_of(args, name), extra_args(args, name), a, work, cmd, t0)
    run_id, out_dir, _ = variant_command(args.model, variant, flags_of(args, name), extra_args(args, name), a, work)
    corpus = res["run"]["corpus"]  # throughput.collect_variant's, from --data's manifest
    res["run"].update(study=args.study, loss_comparable=True, seed=a.seed, corpus=corpus,
                      epochs=res["summary"]["tokens"] / corpus["train_tokens"])
    stats = fmetrics.read_metrics(out_dir / "metrics.jsonl", fp8stats.RECORD)  # the FP8 health records, after the summary
    write_result_file(out / f"{run_id}.jsonl", res["run"], res["steps"], res["summary"], others=stats)
    shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    if args.mirror:
        Path(args.mirror).mkdir(parents=True, exist_ok=True)
        shutil.copy2(out / f"{run_id}.jsonl", Path(args.mirror) / f"{run_id}.jsonl")
    print(f"[parity] {run_id}: done, final val loss {res['summary'].get('val_loss')}", flush=True)


def launch(args, name: str, work: Path, gpu: int | None):
    a = run_args(args, name)
    run_id, out_dir, cmd = variant_command(args.model, ALL_RUNS[name][0], flags_of(args, name), extra_args(args, name), a, work)
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {})}
    log = open(work / f"{run_id}.log", "a")
    print(f"[parity] {run_id}: start{' on GPU ' + str(gpu) if gpu is not None else ''} ({a.steps} steps)", flush=True)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), cmd, time.time()


def summarize(args, out: Path) -> dict:
    """Final validation losses of every run with a result file, the BF16 mean and seed spread (max - min over the
    BF16 seeds), each FP8 run's gap to that mean against issue 31's band, and to the BF16 run of its own seed; and
    per FP8 set-up the mean of its seeds against the same band (``fp8_by_recipe``)."""
    from fp8lab.analysis.load import read_jsonl
    from fp8lab.analysis.parity import against_seeds

    vals = {}
    for name in ALL_RUNS:
        f = out / f"{run_id_of(args, name)}.jsonl"
        if f.exists():  # data/results' reader: a corrupt line is an error naming the file, not a silent skip
            v = next(r for _, r in read_jsonl(f) if r.get("record") == "summary").get("val_loss")
            if v is not None and v == v:  # a run without a final validation loss has no place in the comparison
                vals[name] = v
    bf = {k: v for k, v in vals.items() if ALL_RUNS[k][0] == "te-bf16"}
    twin = {ALL_RUNS[k][1]: v for k, v in bf.items()}  # seed -> the BF16 run of that seed
    gaps = {}
    for k, v in vals.items():
        if k in bf:
            continue
        g = against_seeds(list(bf.values()), v)
        gaps[k] = {"val_loss": v, "gap": g["gap"], "gap_pct": g["gap_pct"],
                   "within": g["in_band"],  # issue 31's criterion, two-sided
                   "not_above_band": v <= g["mean"] + g["band"],  # supplementary: FP8 no worse than BF16's noise allows
                   "gap_to_same_seed_pct": (100 * (v / twin[ALL_RUNS[k][1]] - 1) if ALL_RUNS[k][1] in twin else None)}
    by_recipe = {}  # each FP8 set-up's seeds, their mean against the BF16 mean (what the headline quotes)
    for variant in dict.fromkeys(ALL_RUNS[k][0] for k in gaps):
        runs = [k for k in gaps if ALL_RUNS[k][0] == variant]
        m = sum(vals[k] for k in runs) / len(runs)
        g = against_seeds(list(bf.values()), m)
        by_recipe[variant] = {"runs": runs, "seeds": len(runs), "val_loss_mean": m, "gap_pct": g["gap_pct"],
                              "within": g["in_band"], "spread_pct": 100 * (max(vals[k] for k in runs) - min(vals[k] for k in runs)) / m}
    g = against_seeds(list(bf.values()), next(iter(bf.values())))
    mean, spread, band = g["mean"], g["spread"], g["band"]
    return {"criterion": "|FP8 - BF16 mean| <= max(0.5% of the mean, max - min of the BF16 seeds), final validation loss",
            "val_loss": vals, "bf16_seeds": len(bf), "bf16_mean": mean, "bf16_spread": spread,
            "bf16_spread_pct": 100 * spread / mean, "band": band, "band_pct": 100 * band / mean, "fp8": gaps,
            "fp8_by_recipe": by_recipe}


def main(argv=None) -> int:
    args = parse(argv)
    t_start = time.time()
    out, work = Path(args.out), (REPO / args.work if not Path(args.work).is_absolute() else Path(args.work))
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    args.data = str(Path(args.data).resolve())
    names = [r for r in args.runs.split(",")]
    pending = []
    for name in names:
        if not (out / f"{run_id_of(args, name)}.jsonl").exists():
            pending.append(name)
    gpus = args.gpus or (int(_cuda_count()) or 1)
    interrupted, failed = [], []
    while pending and time.time() - t_start < args.budget_s - args.min_left_s:
        wave, pending = pending[:gpus], pending[gpus:]
        procs = {n: launch(args, n, work, i if not args.cpu_smoke else None) for i, n in enumerate(wave)}
        left = _wait(procs, t_start + args.budget_s)
        for n, (proc, cmd, t0) in procs.items():
            run_id = run_id_of(args, n)
            if proc.returncode == 0 and n not in left:
                finish_run(args, n, work, out, cmd, t0)
            elif n in left:
                print(f"[parity] {run_id}: stopped at the budget, checkpoint written: resumes next command", flush=True)
                interrupted.append(n)
            else:
                print(f"[parity] {run_id}: FAILED (exit {proc.returncode}); see {run_id}.log", flush=True)
                failed.append(n)
    left_over = interrupted + pending
    if left_over:
        print(f"[parity] {len(left_over)} run(s) left: {', '.join(left_over)}; run the same command again", flush=True)
    if failed or left_over:
        return 1 if failed else 3
    if all((out / f"{run_id_of(args, n)}.jsonl").exists() for n in RUNS):  # the study's four, and any follow-up
        result = summarize(args, out)
        (out / "parity.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2), flush=True)
    return 0


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def _wait(procs: dict, deadline: float) -> set:
    """Wait for the runs; SIGTERM those still going at ``deadline`` (their checkpoint), then wait for them."""
    while any(p.poll() is None for p, _, _ in procs.values()) and time.time() < deadline:
        time.sleep(1)
    left = {n for n, (p, _, _) in procs.items() if p.poll() is None}
    for n in left:
        procs[n][0].send_signal(signal.SIGTERM)
    for n in left:
        try:
            procs[n][0].wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            procs[n][0].kill()
            procs[n][0].wait()
    return left


if __name__ == "__main__":
    raise SystemExit(main())
