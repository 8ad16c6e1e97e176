"""Full-training-step throughput of BF16 and FP8 variants, one process per variant.

Each variant is a run of the real trainer (``python -m fp8lab.train``): embedding, every layer, LM
head, loss, backward, clipping and the AdamW step, on batches of the shipped corpus. The trainer
synchronises the GPU at the end of every step and logs ``step_time_s``; this script drops the
warm-up steps and reports the median (and quartiles, min, max) of the rest, and writes one result
file per variant under ``data/results/<study>/`` with its provenance (GPU, driver, CUDA, torch, TE,
torchao, the exact trainer command).

Run on the GPU machine, from the repository root::

    python benchmarks/throughput.py --models llama-1b --variants all --steps 40 --warmup 15

Variants (``--variants all`` or a comma list):
  hf-bf16              plain transformers model, torch.autocast bf16: what a user starts from
  hf-bf16-compile      the same with torch.compile on every decoder block
  te-bf16              Transformer Engine fused layers, FP8 off (the best BF16 fp8lab offers, or not)
  te-fp8-delayed       TE fused layers, FP8 DelayedScaling (HYBRID)
  te-fp8-current       TE fused layers, FP8 per-tensor current scaling
  te-fp8-block         TE fused layers, FP8 block scaling (1x128 / 128x128)
  te-fp8-delayed-swap  the source blog's approach: nn.Linear -> te.Linear one for one, delayed scaling
  torchao-fp8-compile  torchao float8 (tensorwise) with torch.compile on every block
  default-bf16         `fp8lab train --precision bf16` with nothing else set: what the layout resolver picks
  default-fp8          `fp8lab train --precision fp8` with nothing else set (give --common-args '')

Layout fields of each result (micro-batch, accumulation, sequence, parameter dtype) are read from
the run's own config.json, i.e. what the trainer resolved, with the resolver's memory estimate.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANTS: dict[str, list[str]] = {
    "hf-bf16": ["--precision", "bf16", "--backend", "none"],
    "hf-bf16-compile": ["--precision", "bf16", "--backend", "none", "--compile", "True"],
    "hf-bf16-compile-p16": ["--precision", "bf16", "--backend", "none", "--compile", "True", "--param-dtype", "bf16"],
    "te-bf16": ["--precision", "bf16", "--backend", "te", "--fuse", "True"],
    "te-fp8-delayed": ["--precision", "fp8", "--backend", "te", "--recipe", "delayed", "--fuse", "True"],
    "te-fp8-current": ["--precision", "fp8", "--backend", "te", "--recipe", "current", "--fuse", "True"],
    "te-fp8-block": ["--precision", "fp8", "--backend", "te", "--recipe", "block", "--fuse", "True"],
    "te-fp8-delayed-swap": ["--precision", "fp8", "--backend", "te", "--recipe", "delayed", "--fuse", "False"],
    "torchao-fp8-compile": ["--precision", "fp8", "--backend", "torchao", "--recipe", "current", "--compile", "True"],
    # bf16 parameters, fp32 master weights in the optimizer (--param-dtype bf16; fp8lab.train.master_weights)
    "te-bf16-p16": ["--precision", "bf16", "--backend", "te", "--fuse", "True", "--param-dtype", "bf16"],
    "te-fp8-delayed-p16": ["--precision", "fp8", "--backend", "te", "--recipe", "delayed", "--fuse", "True",
                           "--param-dtype", "bf16"],
    "te-fp8-current-p16": ["--precision", "fp8", "--backend", "te", "--recipe", "current", "--fuse", "True",
                           "--param-dtype", "bf16"],
    # the plain commands: everything else as fp8lab.plan.layout resolves it on this machine
    "default-bf16": ["--precision", "bf16"],
    "default-fp8": ["--precision", "fp8"],
    # the plain FP8 command with the LM head's GEMM in FP8 over the full logits (issue 51's study, session 21)
    "default-fp8-head": ["--precision", "fp8", "--fused-loss", "off", "--fp8-lm-head", "True"],
    # the plain FP8 command with the LM head's GEMMs in BF16 (the default before they ran in FP8 in the loss's chunks)
    "default-fp8-bf16head": ["--precision", "fp8", "--fp8-lm-head", "False"],
    # the plain FP8 command with the LM head's GEMMs in FP8 in the loss's chunks, asked for by name
    "default-fp8-fp8head": ["--precision", "fp8", "--fp8-lm-head", "True"],
    # the plain FP8 command with TE's FP8 attention forced on / off (#34; auto decides by fp8lab.plan.fp8attn's rule)
    "default-fp8-attn": ["--precision", "fp8", "--fp8-attention", "on"],
    "default-fp8-noattn": ["--precision", "fp8", "--fp8-attention", "off"],
    # FP8 weights re-cast for every micro-batch (the default caches them once per step under --grad-accum)
    "te-fp8-delayed-nocache": ["--precision", "fp8", "--backend", "te", "--recipe", "delayed", "--fuse", "True",
                               "--fp8-weight-cache", "False"],
}
# CPU smoke variants (emulated FP8: for checking this script, never for speed claims)
CPU_VARIANTS: dict[str, list[str]] = {
    "hf-bf16": VARIANTS["hf-bf16"],
    "emulated-fp8-delayed": ["--precision", "fp8", "--backend", "emulated", "--recipe", "delayed"],
}


def _arg_value(args: list[str], name: str, default: str | None = None) -> str | None:
    """The value of the last ``name`` in ``args`` (argparse keeps the last one too)."""
    at = [i for i, a in enumerate(args[:-1]) if a == name]
    return args[at[-1] + 1] if at else default


def versions() -> dict:
    """Driver, CUDA, torch, transformers, TE and torchao versions of this machine."""
    out: dict = {"python": sys.version.split()[0]}
    try:
        out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:
        out["driver"] = None
    for mod, key in (("torch", "torch"), ("transformers", "transformers"), ("transformer_engine", "transformer_engine"),
                     ("torchao", "torchao")):
        try:
            out[key] = __import__(mod).__version__
        except Exception:
            out[key] = None
    from fp8lab.core.pins import installed

    out["nvdlfw_inspect"] = installed("nvdlfw-inspect")  # TE's debug API (--fp8-stats-source te-debug)
    try:
        import torch

        out["cuda"] = torch.version.cuda
    except Exception:
        out["cuda"] = None
    return out


def quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": xs[0], "max": xs[-1]}


def _peak_tflops(gpu_name: str) -> float | None:
    """The dense BF16 peak the trainer divided by for MFU (fp8lab.records.metrics' table)."""
    from fp8lab.records.metrics import peak_bf16_flops

    peak = peak_bf16_flops(gpu_name)
    return peak / 1e12 if peak else None


def _harness_command(args) -> str:
    """This script's command line, with machine-specific folders replaced by placeholders."""
    line = "python " + " ".join(shlex.quote(a) for a in sys.argv).replace(str(REPO) + "/", "")
    if getattr(args, "out", None):
        line = line.replace(str(args.out), "<out>")
    if getattr(args, "data", None):
        line = line.replace(str(args.data), "<data>")
    if getattr(args, "mirror", None):
        line = line.replace(str(args.mirror), "<mirror>")
    for m in getattr(args, "models", "").split(","):
        if model_label(m.strip()) != m.strip():
            line = line.replace(str(Path(m.strip()).parent), "<models>")
    line = line.replace(str(args.work), "<work>")
    # a folder given twice (the later one wins in argparse) keeps its first spelling: no temp path may stay
    return line.replace(tempfile.gettempdir().rstrip("/") + "/", "<tmp>/")


def model_label(model: str) -> str:
    """A named shape as it is; a model folder by its name (result files hold no machine path)."""
    return Path(model).name if Path(model).is_dir() and not model.startswith("hf:") else model


def variant_command(model: str, variant: str, flags: list[str], extra: list[str], args, work: Path) -> tuple[str, Path, list[str]]:
    """(run id, output folder, trainer command) of one variant: ``args.steps`` steps in a fresh process."""
    nproc = getattr(args, "nproc", 1)
    label = model_label(model)
    run_id = f"{label}-{variant}" + (f"-{nproc}gpu-{args.parallel}" if nproc > 1 else "") + (f"-{args.tag}" if getattr(args, "tag", "") else "")
    out_dir = work / run_id
    # several GPUs: torchrun's own rendezvous (--standalone), one process per GPU
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
                if nproc > 1 else [sys.executable])
    # fixed options first: argparse keeps the last value, so ``flags``/``extra`` may override them
    cmd = [*launcher, "-m", "fp8lab.train", "--model", model, "--parallel", getattr(args, "parallel", "ddp"),
           "--steps", str(args.steps), "--warmup-steps", str(min(5, args.steps - 1)), "--output-dir", str(out_dir),
           "--checkpoint-every", "-1", "--save-model", "False", "--plot", "False", "--progress", "off",
           "--val-every", "0", "--val-batches", "1", "--resume", "False", "--seed", str(args.seed), *flags, *extra]
    if args.data:
        cmd += ["--data", args.data]
    return run_id, out_dir, cmd


def run_variant(model: str, variant: str, flags: list[str], extra: list[str], args, work: Path) -> dict:
    """Train ``args.steps`` steps in a fresh process; return the run record, steps and summary."""
    run_id, out_dir, cmd = variant_command(model, variant, flags, extra, args, work)
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    except subprocess.TimeoutExpired as exc:  # one slow variant must not take the others with it
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        (work / f"{run_id}.log").write_text(out + "\n--- stderr ---\n" + err)
        return {"run_id": run_id, "error": f"timed out after {args.timeout} s (--timeout)", "seconds": time.time() - t0}
    (work / f"{run_id}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"run_id": run_id, "error": f"exit {proc.returncode}: {' | '.join(tail)}", "seconds": time.time() - t0}
    return collect_variant(model, variant, flags, extra, args, work, cmd, t0)


def collect_variant(model: str, variant: str, flags: list[str], extra: list[str], args, work: Path, cmd: list[str],
                    t0: float) -> dict:
    """The run record, downsampled steps and summary of a finished run of ``cmd`` (variant_command's)."""
    from fp8lab.analysis.labels import task_label
    from fp8lab.records.data_format import PRETRAIN
    from fp8lab.analysis.run_config import read_config
    from fp8lab.plan.layout import AUTO_FIELDS as LAYOUT_FIELDS
    from fp8lab.records import metrics as fmetrics

    label, nproc = model_label(model), getattr(args, "nproc", 1)
    run_id, out_dir, _ = variant_command(model, variant, flags, extra, args, work)
    shown = " ".join(shlex.quote(c) for c in ["python" if i == 0 else c for i, c in enumerate(cmd)]).replace(str(work), "<work>")
    if label != model:  # a folder: <models>/name, never the machine's path
        shown = shown.replace(str(Path(model).parent), "<models>")
    if args.data:  # machine paths stay out of result files
        shown = shown.replace(str(args.data), "<data>")
    recs = fmetrics.read_metrics(out_dir / "metrics.jsonl")  # the step records (not fp8lab.fp8.stats')
    cfg = read_config(out_dir)  # config.json in today's form (an old run folder's too)
    plan, built = cfg["plan"], cfg["built"]
    timed = [r for r in recs if r["step"] > args.warmup and r.get("loss") is not None and not r.get("profiled")]
    tps = quantiles([r["tokens_per_sec_per_gpu"] for r in timed])
    mfus = [r["mfu"] for r in timed if r.get("mfu") is not None]
    backend = plan.get("backend", _arg_value(flags, "--backend"))  # "none": plain transformers
    run = {
        "record": "run", "run_id": run_id, "study": args.study, "model": label,
        # a folder model: its model_type and the SHA-256 of its config.json (the run's own model_source)
        "model_type": (cfg.get("model_source") or {}).get("model_type"),
        "model_config_sha256": (cfg.get("model_source") or {}).get("config_sha256"),
        "variant": variant + (f"-{args.tag}" if getattr(args, "tag", "") else ""),
        "precision": _arg_value(flags, "--precision"),
        "backend": "hf" if backend == "none" else backend,
        "recipe": (((_arg_value(flags + extra, "--recipe") or "").partition(":")[0]
                    or (plan.get("recipe") or "").partition(" ")[0] or None)
                   if _arg_value(flags, "--precision") == "fp8" else None),
        "recipe_spec": _arg_value(flags + extra, "--recipe"),
        "bf16_edge_blocks": int(_arg_value(flags + extra, "--bf16-edge-blocks", "0")),
        "warmup_lr_steps": int(_arg_value(cmd, "--warmup-steps", "0")),
        "fuse": None if backend == "none" else (cfg["fuse"] if isinstance(cfg.get("fuse"), bool)  # as it ran
                                                else _arg_value(flags + extra, "--fuse", "True") == "True"),
        "compile": _arg_value(flags, "--compile", "False") == "True",
        "activation_checkpointing": bool(cfg.get("activation_checkpointing")),  # as the run resolved it (auto: fp8lab.plan.layout)
        "fp8_attention": plan.get("fp8_attention"),
        "fp8_attention_reason": (plan.get("reasons") or {}).get("fp8_attention"),
        "nvte_fp8_dpa_bwd": plan.get("NVTE_FP8_DPA_BWD"),
        # issue 31: the FP8 health statistics as they ran (0: off) and who read them (te-debug | fp8lab)
        "fp8_stats_every": cfg.get("fp8_stats_every"), "fp8_stats_source": cfg.get("fp8_stats_source"),
        # issue 51: the LM head's loss chunked over tokens (fp8lab.train.fused_loss), as the plan decided it
        "fused_loss": plan.get("fused_loss"),
        "fused_loss_reason": (plan.get("reasons") or {}).get("fused_loss"),
        "fused_loss_kernel": plan.get("fused_loss_kernel"),  # the chunks' kernel (fp8lab.plan.fused_loss.KERNELS)
        "fp8_lm_head": bool(cfg.get("fp8_lm_head")),  # issue 51's study: the LM head's GEMM in FP8 too
        "gpu_name": recs[-1]["gpu_name"], "world_size": recs[-1]["world_size"], "instances": 1,
        "parallel": args.parallel if nproc > 1 else None,
        "loss_comparable": False,  # tens of steps: too short to compare losses (benchmarks/loss_parity.py runs those)
        # the layout the trainer ran (resolved from "auto" where not given), and the resolver's estimate
        "micro_batch_size": cfg["micro_batch_size"], "grad_accum": cfg["grad_accum"], "seq_len": cfg["seq_len"],
        "params": cfg.get("params"), "flops_per_token": cfg.get("flops_per_token"),
        "param_dtype": cfg["param_dtype"],
        "layout_requested": {k: (cfg.get("requested") or {}).get(k) for k in LAYOUT_FIELDS},
        "layout_reasons": {k: v for k, v in (plan.get("reasons") or {}).items() if k in LAYOUT_FIELDS},
        "memory_estimate_gib": plan.get("memory_estimate_peak_gib"),
        "gpu_memory_gib": cfg.get("gpu_memory_gib") or None,
        "fp8_weight_cache": built.get("fp8_weight_cache"),
        "fuse_wgrad_accumulation": built.get("fuse_wgrad_accumulation"),
        "fsdp_keep_weights": built.get("fsdp_keep_weights"),
        "cuda_graphs": plan.get("cuda_graphs"), "cuda_graphs_captured": built.get("cuda_graphs_captured"),
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "memory": plan.get("memory") or "plain",  # bytes of state per parameter (fp8lab.plan.memory_modes)
        "task": task_label(cfg.get("task") or PRETRAIN, cfg.get("lora_rank") or 0),
        "seed": cfg.get("seed"),  # model init and data order: a loss comparison pairs runs of one seed
        "optimizer": (f"AdamW ({built.get('adamw_impl', 'kernels not recorded')}) on "
                      + ("fp32 parameters, bf16 autocast" if cfg["param_dtype"] == "fp32"
                         else "fp32 master weights, bf16 parameters")),
        "versions": versions(), "command": shown, "harness": _harness_command(args),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    overrides = cfg.get("model_overrides") or {}
    if overrides:  # --model-override: another shape than the named model's; named for what it is
        run.update(model=getattr(args, "model_label", "") or f"{label}-override", base_model=label, model_overrides=overrides)
    if args.data and (Path(args.data) / "manifest.json").is_file():  # the corpus it read, and how much of it
        from fp8lab.data.tokens import corpus_record

        run["corpus"] = corpus_record(args.data)
        run["epochs"] = recs[-1]["tokens"] / run["corpus"]["train_tokens"]
    if getattr(args, "note", ""):
        run["note"] = args.note
    summary = {
        "record": "summary", "tokens_per_sec_per_gpu": tps["median"], "tokens_per_sec_per_gpu_p25": tps["p25"],
        "tokens_per_sec_per_gpu_p75": tps["p75"], "tokens_per_sec_per_gpu_min": tps["min"],
        "tokens_per_sec_per_gpu_max": tps["max"], "timed_steps": len(timed), "warmup_steps": args.warmup,
        "step_time_s": statistics.median(r["step_time_s"] for r in timed),
        "mfu": statistics.median(mfus) if mfus else None, "mfu_peak_tflops": _peak_tflops(recs[-1]["gpu_name"]) if mfus else None,
        "max_mem_gib": max(r["max_mem_gib"] or 0 for r in recs),
        "max_reserved_gib": max((r["max_reserved_gib"] for r in recs if r.get("max_reserved_gib") is not None), default=None),
        "tokens": recs[-1]["tokens"],
        "loss": recs[-1]["loss"], "first_loss": recs[0]["loss"],
    }
    every = max(1, len(recs) // args.max_step_records) if getattr(args, "max_step_records", 0) else 1
    keep = [r for i, r in enumerate(recs) if i % every == 0 or r is recs[-1] or r.get("val_loss") is not None]
    steps = [{"record": "step", **{k: r.get(k) for k in ("step", "tokens", "loss", "val_loss", "grad_norm", "step_time_s",
                                                         "tokens_per_sec", "tokens_per_sec_per_gpu", "mfu", "max_mem_gib",
                                                         "max_reserved_gib")
                                   if k not in ("val_loss", "max_reserved_gib") or r.get(k) is not None}}
             for r in keep]
    vals = [r["val_loss"] for r in recs if r.get("val_loss") is not None]
    if vals:
        summary["val_loss"] = vals[-1]
    out = {"run_id": run_id, "run": run, "steps": steps, "summary": summary, "seconds": time.time() - t0,
           "fp8_stats": fmetrics.read_metrics(out_dir / "metrics.jsonl", "fp8_stats")}  # FP8 health, after the summary
    if (out_dir / "profile.json").exists():  # --profile-steps: where the time went (those steps are not timed)
        out["profile"] = json.loads((out_dir / "profile.json").read_text())
    return out


def prepare_once(args, work: Path) -> None:
    """Tokenize the shipped corpus once for every variant (same tokens, same order, no repeated work)."""
    if args.data is None:
        from fp8lab.data.tokens import prepare_data

        target = work / "data-32k"
        prepare_data(None, target, None, vocab_size=512 if args.cpu_smoke else 32000)
        args.data = str(target)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama-1b", help="comma list of fp8lab.model.models names or model folders")
    p.add_argument("--variants", default="all", help="'all' or a comma list of: " + ", ".join(VARIANTS))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=15, help="steps left out of the statistics")
    p.add_argument("--model-args", action="append", default=[], metavar="MODEL=ARGS",
                   help="trainer options for one model, e.g. 'llama-7b=--micro-batch-size 2 --activation-checkpointing True'")
    p.add_argument("--common-args", default="--seq-len 2048 --micro-batch-size 8", help="trainer options for every run")
    p.add_argument("--data", default=None, help="prepared data folder (default: the shipped corpus)")
    p.add_argument("--study", default="throughput-h200")
    p.add_argument("--tag", default="", help="suffix of every run id (e.g. ga4 for a --grad-accum 4 layout), so layouts do not overwrite each other")
    p.add_argument("--out", default=None, help="result folder (default data/results/<study>)")
    p.add_argument("--work", default="/tmp/fp8lab-bench")
    p.add_argument("--timeout", type=int, default=600, help="seconds per variant")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--nproc", type=int, default=1, help="GPUs per run (torchrun when > 1)")
    p.add_argument("--parallel", default="fsdp", choices=["ddp", "fsdp"], help="how runs with --nproc > 1 split the model")
    p.add_argument("--model-label", default="", help="the model's name in the run records of --model-override runs "
                   "(e.g. llama-3b-shape); base_model and model_overrides say what it was built from (default: <model>-override)")
    p.add_argument("--note", default="", help="free text kept in each run record (e.g. what else ran on the machine)")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny CPU check of this script (emulated FP8; no speed claim)")
    args = p.parse_args(argv)

    table = CPU_VARIANTS if args.cpu_smoke else VARIANTS
    variants = list(table) if args.variants == "all" else [v.strip() for v in args.variants.split(",")]
    bad = [v for v in variants if v not in table]
    if bad:
        p.error(f"--variants: unknown {', '.join(bad)}; allowed: all, {', '.join(table)}")
    per_model = {}
    for item in args.model_args:
        name, _, rest = item.partition("=")
        per_model[name.strip()] = shlex.split(rest)
    from fp8lab.analysis import write_result_file

    out = Path(args.out) if args.out else REPO / "data" / "results" / args.study
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    prepare_once(args, work)
    rows = []
    for model in [m.strip() for m in args.models.split(",")]:
        extra = shlex.split(args.common_args) + per_model.get(model, [])
        for variant in variants:
            res = run_variant(model, variant, table[variant], extra, args, work)
            if "error" in res:
                print(f"[bench] {res['run_id']}: FAILED ({res['seconds']:.0f}s) {res['error']}", flush=True)
                rows.append((res["run_id"], None, None, None))
                continue
            path = write_result_file(out / f"{res['run_id']}.jsonl", res["run"], res["steps"], res["summary"],
                                     others=res["fp8_stats"])
            if "profile" in res:  # beside the result file, with the run's provenance
                (out / f"{res['run_id']}.profile.json").write_text(
                    json.dumps({"run": res["run"], "profile": res["profile"]}, indent=1) + "\n")
            s = res["summary"]
            print(f"[bench] {res['run_id']}: {s['tokens_per_sec_per_gpu']:.0f} tok/s/GPU "
                  f"(IQR {s['tokens_per_sec_per_gpu_p25']:.0f}-{s['tokens_per_sec_per_gpu_p75']:.0f}) "
                  f"mfu={s['mfu'] if s['mfu'] is None else round(s['mfu'], 3)} mem={s['max_mem_gib']:.1f}GiB "
                  f"loss {s['first_loss']:.3f}->{s['loss']:.3f} ({res['seconds']:.0f}s) -> {path.name}", flush=True)
            rows.append((res["run_id"], s["tokens_per_sec_per_gpu"], s["mfu"], s["max_mem_gib"]))
    print("\nrun                                  tok/s/GPU     MFU   mem GiB")
    for run_id, tps, mfu, mem in rows:
        print(f"{run_id:<36} {tps if tps is None else f'{tps:>9.0f}'} {'' if mfu is None else f'{mfu:7.3f}'} "
              f"{'' if mem is None else f'{mem:8.1f}'}")
    return 0 if all(r[1] is not None for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
