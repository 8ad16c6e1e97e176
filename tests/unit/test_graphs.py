"""--cuda-graphs on a CPU: the policy (when auto turns graphs on), the set-ups that cannot be captured
(refused up front for ``on``, run eagerly for ``auto``), and the same refusal for a planned P5 job.
The captured graphs themselves run in tests/gpu/test_graphs_gpu.py on the H200."""
from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import pytest

from fp8lab.plan import graphs
from fp8lab.launch import PLACEHOLDER_BUCKET, PLACEHOLDER_ROLE, JobSpec
from fp8lab.model.models import get_config

OK = dict(device_type="cuda", backend="te", fuse=True, param_dtype="bf16", world_size=1,
          activation_checkpointing=False, compile=False)


@pytest.mark.parametrize("model,mb,precision,want", [
    ("llama-7b", 1, "fp8", True),      # GPU busy 59-67% eager; graphed 96.5%, 1.42x BF16 (session 8)
    ("llama-7b", 1, "bf16", False),    # busy 97% eager; graphed 1-2% slower (session 8)
    ("llama-7b", 2, "fp8", False),     # FP8 1.51x at 2 x 2048
    ("gptneo-1.3b", 2, "fp8", True),   # busy 72% eager; graphed 1.23x BF16, busy 96%
    ("gptneo-1.3b", 2, "bf16", True),  # busy 85% eager; graphed 14% faster (session 8)
    ("gptneo-1.3b", 8, "fp8", False),  # busy 97.5%, FP8 1.24x
    ("llama-1b", 16, "fp8", False),    # the resolver's default layout
    ("llama-tiny", 4, "bf16", True),
])
def test_auto_follows_the_measured_launch_bound_layouts(model, mb, precision, want):
    d = graphs.decide("auto", get_config(model), micro_batch_size=mb, seq_len=128 if model == "llama-tiny" else 2048,
                      precision=precision, **OK)
    assert d.active is want and d.reason.startswith("auto:")
    assert ("launch-bound" in d.reason) is want


@pytest.mark.parametrize("change,words", [
    ({"device_type": "cpu"}, "need a CUDA GPU"),
    ({"backend": "emulated"}, "--backend te --fuse True"),
    ({"fuse": False}, "--backend te --fuse True"),
    ({"param_dtype": "fp32"}, "--param-dtype bf16"),
    ({"world_size": 8}, "one process only"),
    ({"activation_checkpointing": True}, "activation checkpointing"),
    ({"compile": True}, "--compile"),
])
def test_set_ups_that_cannot_be_captured(change, words):
    setup = {**OK, **change}
    cfg = get_config("llama-7b")
    auto = graphs.decide("auto", cfg, micro_batch_size=1, seq_len=2048, **setup)
    assert auto.active is False and words in auto.reason
    with pytest.raises(ValueError, match="--cuda-graphs on: .*" + words.replace("-", "\\-").replace("+", "\\+")):
        graphs.decide("on", cfg, micro_batch_size=1, seq_len=2048, **setup)
    assert graphs.decide("off", cfg, micro_batch_size=1, seq_len=2048, **setup).active is False


def test_a_layout_that_would_not_fit_graphed_runs_eagerly_or_is_refused():
    """On an H200 with the streamed master-weight step: llama-7b 1 x 2048 FP8 fits graphed (estimate 124.8
    of 134.8 usable GiB; measured peak reserved 124.7 GiB, data/results/graphs-h200/*-s8) and auto graphs it;
    at 2 x 2048 the graphs would hold 32.9 GiB (135.2 GiB in all): auto leaves it eager and on is refused."""
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run
    from fp8lab.train.entry import TrainConfig

    h200 = Machine("cuda", "NVIDIA H200", 139.8, 1, te_usable=True, fp8=True)
    base = dict(model="llama-7b", backend="te", grad_accum=8, seq_len=2048, param_dtype="bf16")
    d = plan_run(TrainConfig(**base, micro_batch_size=1, precision="fp8"), h200).graphs
    assert d.active is True and d.reason.startswith("auto: 4.1e+11 token-params")
    d = plan_run(TrainConfig(**base, micro_batch_size=2, precision="fp8"), h200).graphs
    assert d.active is False and "would need about 135.2 GiB" in d.reason and "of 134.8 GiB usable" in d.reason
    with pytest.raises(ValueError, match=r"--cuda-graphs on: with the blocks captured the run would need about 135\.2 GiB"):
        plan_run(TrainConfig(**base, micro_batch_size=2, precision="fp8", cuda_graphs="on"), h200)
    assert plan_run(TrainConfig(**base, micro_batch_size=1, precision="bf16", cuda_graphs="on"), h200).graphs.active is True  # ran: 103.5 GiB


# Graphed runs on the streamed master-weight step (session 8; earlier graphed runs held full fp32 gradients)
STREAMED_GRAPHED = sorted(Path(__file__).resolve().parents[2].glob("data/results/graphs-h200/*-s8*.jsonl"))


def test_graphs_memory_estimate_covers_each_measured_graphed_peak():
    """The rule that admits a graphed layout is never below what a graphed run measured, and not far above."""
    from fp8lab.plan import layout as fl
    from fp8lab.core.hardware import Machine

    h200 = Machine("cuda", "NVIDIA H200", 139.8, 1, te_usable=True, fp8=True)
    checked = 0
    for f in STREAMED_GRAPHED:
        lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        run = lines[0]
        if not run["cuda_graphs"]:
            continue
        steps = [r for r in lines if r.get("record") == "step"]
        # the footprint: reserved where recorded (a graph's pool is reserved while its tensors count as freed)
        peak = max(r.get("max_reserved_gib") or r["max_mem_gib"] for r in steps)
        mcfg = get_config(run["model"])
        fp8 = run["precision"] == "fp8"
        est = fl.estimate_memory(mcfg, precision=run["precision"], micro_batch_size=run["micro_batch_size"],
                                 seq_len=run["seq_len"], weight_cache=run["fp8_weight_cache"] and run["grad_accum"] > 1)
        lay = fl.Layout("bf16", run["seq_len"], run["micro_batch_size"], run["grad_accum"], False, est, h200)
        need = fl.graphs_memory_need(lay, mcfg, fp8)
        # measured: llama-7b 1 x 2048 reserved 124.7 (FP8) and 113.0 (BF16) GiB against 127.9 and 113.7;
        # the rule is loosest where activations dominate (llama-1b 16 x 2048: 50.6 allocated, 83.4)
        assert peak <= need <= 1.7 * peak, (f.name, peak, need)
        checked += 1
    assert checked >= 8


MISTRAL_CALIBRATION = (Path(__file__).resolve().parents[2]
                       / "benchmarks/logs/families-session10/mistral-7b-v0.3-graphs-calibration.json")


def test_graphs_rule_covers_the_mistral_calibration_and_admits_it_on_an_h200():
    """Mistral-7B-v0.3 FP8 at 1 x 2048 x 32 reserved 131.0 GiB graphed on the H200: the rule's estimate is at
    or above that, and within the H200's graphs budget, so the plain command captures its blocks; BF16 at the
    same layout stays eager (not launch-bound in BF16, where graphs measured no gain on llama-7b)."""
    from fp8lab.plan.config import TrainConfig
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run
    from fp8lab.plan import layout as fl

    measured = json.loads(MISTRAL_CALIBRATION.read_text())["graphs_on"]["max_reserved_gib"]
    h200 = Machine("cuda", "NVIDIA H200", 139.8, 1, te_usable=True, fp8=True)
    folder = str(Path(__file__).resolve().parents[2] / "data/reference/configs/mistral-7b-v0.3")
    fp8 = plan_run(TrainConfig(model=folder, precision="fp8"), h200)
    assert (fp8.micro_batch_size, fp8.grad_accum) == (1, 32)
    need = fl.graphs_memory_need(fp8.layout, get_config(folder), fp8=True)
    assert measured <= need <= measured + 5, (measured, need)
    assert fp8.graphs.active, fp8.graphs.reason
    bf16 = plan_run(TrainConfig(model=folder, precision="bf16"), h200)
    assert not bf16.graphs.active and "keep the GPU busy in bf16" in bf16.graphs.reason


def test_a_bad_choice_names_the_option_and_the_choices():
    with pytest.raises(ValueError, match=r"--cuda-graphs='maybe' is invalid; allowed: auto \| on \| off"):
        graphs.decide("maybe", get_config("llama-7b"), micro_batch_size=1, seq_len=2048, **OK)


def _train(*args, tmp_path):
    return subprocess.run([sys.executable, "-m", "fp8lab.train", "--model", "llama-tiny", "--steps", "2",
                           "--output-dir", str(tmp_path / "run"), "--progress", "off", *args],
                          capture_output=True, text=True, timeout=300)


def test_trainer_refuses_cuda_graphs_on_a_cpu_before_anything_is_written(tmp_path):
    p = _train("--cuda-graphs", "on", tmp_path=tmp_path)
    assert p.returncode == 2
    assert "--cuda-graphs on: CUDA graphs need a CUDA GPU; use --cuda-graphs auto or off" in p.stderr
    assert not (tmp_path / "run").exists()
    p = _train("--cuda-graphs", "sometimes", tmp_path=tmp_path)
    assert p.returncode == 2 and "--cuda-graphs='sometimes' is invalid; allowed: auto | on | off" in p.stderr


def test_trainer_records_why_graphs_are_off(tmp_path):
    p = _train("--dry-run", "True", tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    p = _train("--steps", "1", "--save-model", "False", "--plot", "False", tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["cuda_graphs"] == "off" and cfg["requested"]["cuda_graphs"] == "auto" and cfg["plan"]["cuda_graphs"] is False
    assert cfg["plan"]["reasons"]["cuda_graphs"] == "auto: CUDA graphs need a CUDA GPU" and cfg["built"]["cuda_graphs_captured"] is None


def test_a_planned_p5_job_with_graphs_on_is_refused_when_the_plan_is_made():
    job = dict(model="llama-7b", precision="fp8", role=PLACEHOLDER_ROLE, bucket=PLACEHOLDER_BUCKET, steps=10)
    with pytest.raises(ValueError, match="the trainer would refuse this job: --cuda-graphs on: .*one process only"):
        JobSpec(**job, options={"cuda_graphs": "on"})
    assert JobSpec(**job).options.get("cuda_graphs", "auto") == "auto"  # auto: sharded jobs run eagerly
    with pytest.raises(ValueError, match=r"--cuda-graphs=.sometimes. is invalid; allowed: auto \| on \| off"):
        JobSpec(**job, options={"cuda_graphs": "sometimes"})
