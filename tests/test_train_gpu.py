"""The trainer on CUDA with Transformer Engine (skipped without a GPU): real FP8, MFU, TE scaling
state in checkpoints, and torchrun DDP / FSDP2 on two GPUs when there are two."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from fp8lab import data as fdata
from fp8lab import metrics as fmetrics
from fp8lab.train import TrainConfig, train

pytestmark = pytest.mark.gpu
TINY = dict(model="llama-tiny", seq_len=128, micro_batch_size=8, lr=2e-3, progress="off", print_metrics=False,
            plot=False, device="cuda")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    fdata.prepare_data(None, out, None, vocab_size=512)
    return out


def _te_or_skip():
    from fp8lab.backends import get_backend

    reason = get_backend("te").available()
    if reason:
        pytest.skip(f"te backend not usable: {reason}")


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_te_run_on_one_gpu(prepared, tmp_path, precision):
    _te_or_skip()
    out = tmp_path / precision
    s = train(TrainConfig(**TINY, precision=precision, backend="te", steps=40, checkpoint_every=20,
                          data=str(prepared), output_dir=str(out)))
    recs = fmetrics.read_metrics(out / "metrics.jsonl")
    assert s["status"] == "completed" and s["nonfinite_steps"] == 0
    assert recs[-1]["loss"] < recs[0]["loss"] - 1.0
    assert all(r["gpu_name"] != "cpu" and r["max_mem_gib"] > 0 for r in recs)
    if fmetrics.peak_bf16_flops(recs[0]["gpu_name"]):
        assert all(0 < r["mfu"] < 1.5 for r in recs)
    from transformers import LlamaForCausalLM

    LlamaForCausalLM.from_pretrained(out / "model")


def test_te_fp8_scaling_state_is_checkpointed_and_resumed(prepared, tmp_path):
    _te_or_skip()
    import torch.distributed.checkpoint as dcp

    base = dict(**TINY, precision="fp8", backend="te", recipe="delayed", steps=10, checkpoint_every=5,
                data=str(prepared), save_model=False)
    a, b = tmp_path / "a", tmp_path / "b"
    train(TrainConfig(**base, output_dir=str(a)))
    meta = dcp.FileSystemReader(str(a / "checkpoints" / "step_00000005")).read_metadata()
    assert any(k.endswith("_extra_state") for k in meta.state_dict_metadata)  # TE's amax history and scales
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_00000010")
    train(TrainConfig(**base, output_dir=str(b)))
    la = [r["loss"] for r in fmetrics.read_metrics(a / "metrics.jsonl")]
    lb = [r["loss"] for r in fmetrics.read_metrics(b / "metrics.jsonl")]
    assert lb[:5] == la[:5] and lb[5:] == pytest.approx(la[5:], rel=1e-3)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_two_gpus(prepared, tmp_path, parallel):
    import torch

    _te_or_skip()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    out = tmp_path / parallel
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "fp8lab.train",
           "--model", "llama-tiny", "--precision", "fp8", "--backend", "te", "--steps", "30", "--seq-len", "128",
           "--micro-batch-size", "4", "--lr", "0.002", "--parallel", parallel, "--checkpoint-every", "15",
           "--data", str(prepared), "--output-dir", str(out), "--progress", "off", "--plot", "False"]
    p = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = fmetrics.read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(1, 31)) and recs[-1]["world_size"] == 2
    assert recs[-1]["loss"] < recs[0]["loss"] - 1.0
    assert (out / "model" / "model.safetensors").is_file()
