"""How long ``fp8lab report`` takes on a results folder of many small result files: the median wall time of
``--repeats`` fresh processes (after one untimed warm-up), on ``--files`` files written by this script.

    .venv/bin/python benchmarks/report_many_files.py --files 5000 --out benchmarks/logs/session27/report-5000.json

Each file is one run in the result-file format (data/results/README.md): a ``run`` record, ``--steps`` step
records and a ``summary`` record, BF16 and FP8 runs of a few models, as a folder of a few thousand runs holds.
Writes a JSON file with every run's wall and CPU seconds, their medians, the machine (CPUs), the load average (1 min)
before each run and the commit. Timings on a machine shared with other work are slower than on an idle one.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = ("llama-1b", "llama-7b", "gptneo-125m", "gptneo-1.3b")


def write_files(folder: Path, n: int, steps: int) -> None:
    """``n`` result files of ``steps`` steps each, in ``folder/<study>/``."""
    for i in range(n):
        model, precision = MODELS[i % len(MODELS)], ("bf16", "fp8")[(i // len(MODELS)) % 2]
        study = f"study-{i // 500:02d}"
        run_id = f"{model}-{precision}-{i:05d}"
        run = {"record": "run", "run_id": run_id, "study": study, "model": model, "variant": precision,
               "precision": precision, "backend": "te", "recipe": "delayed" if precision == "fp8" else None,
               "gpu_name": "NVIDIA H200", "world_size": 1, "instances": 1, "micro_batch_size": 8, "grad_accum": 1,
               "seq_len": 2048, "params": 1_235_814_400, "flops_per_token": 7.4e9, "loss_comparable": True}
        lines = [run]
        for s in range(1, steps + 1):
            tps = 30000.0 * (1.3 if precision == "fp8" else 1.0) * (1 + 0.01 * (i % 7))
            lines.append({"record": "step", "step": s, "tokens": s * 16384, "loss": 10.0 / (1 + 0.1 * s) + 0.001 * (i % 13),
                          "grad_norm": 1.0, "step_time_s": 16384 / tps, "tokens_per_sec": tps,
                          "tokens_per_sec_per_gpu": tps, "mfu": 0.4, "max_mem_gib": 40.0})
        lines.append({"record": "summary", "steps": steps, "tokens_per_sec_per_gpu_median": lines[-1]["tokens_per_sec"]})
        d = folder / study
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{run_id}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=5000)
    p.add_argument("--steps", type=int, default=10, help="step records per file")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, help="JSON file for the timings (default: print only)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fp8lab-report-bench-") as tmp:
        runs = Path(tmp) / "runs"
        write_files(runs, args.files, args.steps)
        cmd = [sys.executable, "-m", "fp8lab", "report", str(runs), "--out", str(Path(tmp) / "report.html")]
        env = {**os.environ, "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache")}
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tmp)  # warm-up: caches as after an install
        seconds, cpu, loads = [], [], []
        for _ in range(args.repeats):
            loads.append(os.getloadavg()[0])
            t0, c0 = time.perf_counter(), os.times()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
            seconds.append(time.perf_counter() - t0)
            c1 = os.times()
            cpu.append(c1.children_user + c1.children_system - c0.children_user - c0.children_system)
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    result = {"command": "fp8lab report RUNS --out report.html", "files": args.files, "steps_per_file": args.steps,
              "seconds": [round(s, 2) for s in seconds], "median_s": round(statistics.median(seconds), 2),
              "cpu_seconds": [round(s, 2) for s in cpu], "median_cpu_s": round(statistics.median(cpu), 2),
              "load_average_1min_before": [round(x, 2) for x in loads], "cpus": os.cpu_count(),
              "platform": platform.platform(), "python": platform.python_version(), "commit": commit}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
