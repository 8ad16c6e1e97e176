"""fp8lab.plan.runplan: one torch-free plan of every effective decision, the request kept apart, JobSpec planned afresh."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from fp8lab.plan import layout as fl
from fp8lab.core.hardware import Machine
from fp8lab.fp8.backends import detect_machine
from fp8lab.plan.runplan import plan_run, select_backend
from fp8lab.train.entry import TrainConfig

H200 = Machine("cuda", "NVIDIA H200", 139.8, te_usable=True, fp8=True)
CPU = Machine("cpu", "cpu", 24.0)


def test_planning_a_job_imports_no_torch():
    code = ("import sys\n"
            "import fp8lab.plan.runplan\n"
            "from fp8lab.launch import JobSpec, PLACEHOLDER_ROLE, PLACEHOLDER_BUCKET\n"
            "spec = JobSpec(model='llama-7b', precision='fp8', role=PLACEHOLDER_ROLE, bucket=PLACEHOLDER_BUCKET, tokens=10**9)\n"
            "print(spec.plan.micro_batch_size)\n"
            "assert 'torch' not in sys.modules, 'planning imported torch'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert int(res.stdout.strip()) >= 1


def test_the_plan_owns_each_decision_with_its_reason_and_leaves_the_request_as_it_was():
    c = TrainConfig(model="llama-1b", precision="fp8")
    p = plan_run(c, H200)
    assert (p.backend, p.recipe.kind, p.compute_dtype) == ("te", "delayed", "bf16")
    assert (p.param_dtype, p.seq_len, p.micro_batch_size, p.grad_accum) == ("bf16", 2048, 16, 4)
    assert p.master_weights and p.fused_wgrad and p.weight_cache and not p.keep_weights and not p.sharded
    assert c.micro_batch_size == c.grad_accum == c.param_dtype == c.backend == "auto"  # never replaced
    assert p.tokens_per_step == 16 * 2048 * 4 and p.total_steps == 100 and p.warmup_steps == 5
    reasons = p.all_reasons()
    for key in ("backend", "micro_batch_size", "grad_accum", "cuda_graphs", "fp8_weight_cache", "compute_dtype"):
        assert reasons[key], key
    record = p.record()
    assert json.loads(json.dumps(record))["micro_batch_size"] == 16 and record["reasons"] == reasons
    # a BF16 run on the same machine: TE's layers with FP8 off, no FP8 weight cache
    b = plan_run(TrainConfig(model="llama-1b", precision="bf16"), H200)
    assert b.backend == "te" and not b.weight_cache and b.recipe_kind is None
    assert b.differences(p) == {"fp8_weight_cache": (True, False)}


def test_auto_scales_a_fine_tune_by_each_tensors_current_amax_and_keeps_te_s_history_for_pretraining():
    sft = plan_run(TrainConfig(model="llama-1b", precision="fp8", task="sft"), H200)
    assert sft.recipe.kind == "current" and sft.all_reasons()["recipe"].startswith("auto: current scaling for --task sft")
    pre = plan_run(TrainConfig(model="llama-1b", precision="fp8"), H200)
    assert pre.recipe.kind == "delayed" and pre.all_reasons()["recipe"] == "auto: te's default, delayed scaling"
    assert plan_run(TrainConfig(precision="fp8", task="sft"), CPU).recipe.kind == "current"  # the emulator too
    kept = plan_run(TrainConfig(model="llama-1b", precision="fp8", task="sft", recipe="delayed"), H200)
    assert kept.recipe.kind == "delayed" and kept.all_reasons()["recipe"] == "--recipe delayed"
    # the same fine-tune's layout otherwise: the recipe changes nothing else the plan decides
    assert sft.differences(plan_run(TrainConfig(model="llama-1b", precision="fp8", task="sft", recipe="delayed"),
                                    H200)).keys() == {"recipe"}


def test_backend_selection_is_one_function_of_the_request_and_the_machine():
    assert select_backend(TrainConfig(precision="fp8"), CPU)[0] == "emulated"
    assert select_backend(TrainConfig(precision="bf16"), CPU)[0] is None
    assert select_backend(TrainConfig(precision="bf16"), H200)[0] == "te"
    assert select_backend(TrainConfig(precision="bf16", backend="none"), H200)[0] is None
    seen = Machine("cpu", "cpu", 24.0, unusable=(("te", "no CUDA GPU"),))
    with pytest.raises(ValueError, match=r"--backend te: not usable on this machine: no CUDA GPU"):
        plan_run(TrainConfig(backend="te", precision="fp8"), seen)


def test_the_memory_estimate_counts_the_fp8_weight_cache_only_where_the_trainer_builds_one():
    """Accumulation 1: no later micro-batch reuses the FP8 weights, so the trainer builds no cache and the
    estimate has none (it once counted 12.1 GiB for llama-7b)."""
    one = plan_run(TrainConfig(model="llama-7b", precision="fp8", backend="te", micro_batch_size=1, grad_accum=1), H200)
    assert one.weight_cache is False and "accumulation 1" in one.reasons["fp8_weight_cache"]
    c8 = TrainConfig(model="llama-7b", precision="fp8", backend="te", micro_batch_size=1, grad_accum=8)
    eight = plan_run(c8, H200)
    assert eight.weight_cache is True
    assert one.layout.memory.fp8_cache == 0.0 and eight.layout.memory.fp8_cache > 12  # what a cache costs at 7B
    lay_one = fl.resolve(TrainConfig(model="llama-7b", precision="fp8", backend="te", micro_batch_size=1,
                                     grad_accum=1), H200, "te")
    assert lay_one.memory.fp8_cache == 0.0


def test_a_copied_job_spec_is_planned_afresh():
    """dataclasses.replace(spec_1b, model="llama-7b"): the 7B job gets its own layout, not the 1B micro-batch 16."""
    from fp8lab import launch as L

    one_b = L.JobSpec(model="llama-1b", precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET,
                      tokens=10**9)
    assert one_b.plan.micro_batch_size == 16 and one_b.micro_batch_size == "auto"
    seven_b = dataclasses.replace(one_b, model="llama-7b")
    assert seven_b.plan.micro_batch_size < 16 and seven_b.layout.memory.peak <= 79.2
    assert L.hyperparameters(seven_b)["micro-batch-size"] == seven_b.plan.micro_batch_size
    assert L.job_name(seven_b) != L.job_name(one_b)


def test_job_defaults_are_the_trainers_except_the_declared_ones():
    from fp8lab.launch import spec as S

    fields = {f.name: f.default for f in dataclasses.fields(S.JobSpec)}
    trainer = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for name in S.SPEC_OPTIONS:
        if name != "model":
            assert fields[name] == S.JOB_DEFAULTS.get(name, trainer[name]), name
    assert S.JOB_DEFAULTS == {"parallel": "auto"}  # fsdp on several GPUs, ddp on one (S.job_parallel)
    assert S.job_parallel("auto", 8) == "fsdp" and S.job_parallel("auto", 1) == "ddp" and S.job_parallel("ddp", 8) == "ddp"


def test_the_trainer_refuses_a_job_planned_differently(tmp_path, monkeypatch):
    """Inside a job the trainer re-plans on its machine and compares with the launch's plan."""
    from fp8lab.train.entry import EXIT_BAD_OPTIONS, main

    monkeypatch.chdir(tmp_path)
    argv = ["--model", "llama-tiny", "--precision", "fp8", "--backend", "emulated", "--device", "cpu",
            "--steps", "1", "--progress", "off", "--dry-run"]
    here = plan_run(TrainConfig(model="llama-tiny", precision="fp8", backend="emulated", steps=1, dry_run=True),
                    detect_machine("cpu"))
    assert main(argv, planned=here.decisions()) == 0
    other = {**here.decisions(), "micro_batch_size": 99}
    assert main(argv, planned=other) == EXIT_BAD_OPTIONS


def test_plan_curve_estimates_a_model_without_measurements():
    """plan_curve once raised AttributeError where no run was measured (its stand-in job had no model_cfg)."""
    from fp8lab.launch import plan_curve

    curve = plan_curve(["llama-tiny"], ["bf16", "fp8"], [1, 2], 10**9)
    assert len(curve) == 4 and not curve["measured"].any()
    assert (curve["hours"] > 0).all() and curve.sort_values("instances")["hours"].is_monotonic_decreasing


def test_fp8lab_launch_takes_the_trainers_flags_from_its_schema(capsys):
    """`fp8lab launch plan` sets recipe, backend, grad-accum and lr as `fp8lab train` spells them."""
    from fp8lab import launch as L

    argv = ["plan", "--models", "llama-1b", "--precisions", "fp8", "--instance-counts", "1"]
    assert L.main(argv + ["--grad-accum", "2", "--lr", "1e-4", "--recipe", "current", "--backend", "te"]) == 0
    out = capsys.readouterr().out
    assert " 16 x 2048 x 2 " in out
    assert L.main(argv + ["--lr", "3"]) == 1
    assert "JobSpec.lr=3.0 is invalid" in capsys.readouterr().err
    assert L.main(argv + ["--backend", "apex"]) == 1
    assert "JobSpec.backend='apex' is invalid; allowed: auto, te, torchao" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_the_cpu_rules(precision):
    """Every "auto" a CPU run decides, with the GPU's answer beside it: a change of a CPU rule fails here."""
    cpu = plan_run(TrainConfig(model="llama-tiny", precision=precision), CPU)
    gpu = plan_run(TrainConfig(model="llama-tiny", precision=precision), H200)
    assert (cpu.compute_dtype, gpu.compute_dtype) == ("fp32", "bf16")
    assert "fp32 on a CPU" in cpu.reasons["compute_dtype"]
    assert (cpu.param_dtype, cpu.seq_len, cpu.micro_batch_size, cpu.grad_accum) == ("fp32", 256, 4, 1)
    assert gpu.param_dtype == "bf16"
    assert cpu.backend == ("emulated" if precision == "fp8" else None) and gpu.backend == "te"
    assert cpu.recipe_kind == ("delayed" if precision == "fp8" else None)
    assert not cpu.graphs.active and not cpu.fp8_attention and not cpu.fp8_all_gather
    assert not cpu.master_weights and not cpu.streamed_step and not cpu.fused_wgrad
    assert cpu.fused_loss is False and "off on a CPU" in cpu.reasons["fused_loss"]
    assert plan_run(TrainConfig(model="llama-tiny", precision=precision, fused_loss="on"), CPU).fused_loss_kernel == "eager"
    assert cpu.fp8_stats_every == (10 if precision == "fp8" else 0)
    assert "auto" not in {v for v in cpu.options().values() if isinstance(v, str)}
