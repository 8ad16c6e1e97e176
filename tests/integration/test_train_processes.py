"""The trainer as real processes on CPU: torchrun (gloo) DDP and FSDP2 against one process,
kill -9 then restart, and SIGTERM (a spot interruption) then restart."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fp8lab.records import metrics as fmetrics
from fp8lab.train.entry import TrainConfig, train

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def common(prepared, out, steps, *extra):
    return ["--model", "llama-tiny", "--seq-len", "32", "--compute-dtype", "fp32", "--steps", str(steps),
            "--data", str(prepared), "--output-dir", str(out), "--progress", "off", "--plot", "False",
            "--save-model", "False", *extra]


def trainer(args):
    return [sys.executable, "-m", "fp8lab.train", *args]


def torchrun(args, nproc=2):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "fp8lab.train", *args]


def run(cmd, timeout=240):
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(cmd[-20:])}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    return p


def records(out):
    return fmetrics.read_metrics(out / "metrics.jsonl")


def test_ddp_and_fsdp2_under_torchrun_match_one_process(prepared, tmp_path):
    """Global batch 4 sequences: 1 process x 4, 2 ranks x 2 (DDP), 2 ranks x 1 x 2 accumulation (FSDP2).
    A constant learning rate lets a 7-step run be the reference for 5-step runs and their resumption."""
    lr = ["--lr", "0.001", "--min-lr", "0.001", "--warmup-steps", "0"]
    one_cfg = dict(model="llama-tiny", seq_len=32, compute_dtype="fp32", micro_batch_size=4, lr=1e-3, min_lr=1e-3,
                   warmup_steps=0, val_every=5, data=str(prepared), progress="off", plot=False, print_metrics=False,
                   save_model=False)
    one = tmp_path / "one"
    train(TrainConfig(**one_cfg, steps=7, output_dir=str(one)))
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    run(torchrun(common(prepared, ddp, 5, *lr, "--micro-batch-size", "2", "--val-every", "5", "--save-model", "True")))
    run(torchrun(common(prepared, fsdp, 5, *lr, "--micro-batch-size", "1", "--grad-accum", "2", "--parallel", "fsdp",
                        "--val-every", "5", "--checkpoint-every", "5", "--save-model", "True")))
    ref = records(one)[:5]
    for out in (ddp, fsdp):
        recs = records(out)
        assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
        assert all(r["world_size"] == 2 for r in recs)
        for a, b in zip(ref, recs):
            assert b["loss"] == pytest.approx(a["loss"], rel=2e-5)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
            assert b["tokens"] == a["tokens"]
        assert recs[-1]["val_loss"] == pytest.approx(ref[-1]["val_loss"], rel=2e-5)
    assert json.loads((fsdp / "config.json").read_text())["parallel"] == "fsdp"
    # FSDP2 wrote its checkpoint with DCP from both ranks: one rank file each, complete
    # the final HF models agree: FSDP2 gathered its shards into the same weights DDP kept whole
    from safetensors.torch import load_file

    wd, wf = load_file(ddp / "model" / "model.safetensors"), load_file(fsdp / "model" / "model.safetensors")
    assert wd.keys() == wf.keys() and len(wd) == 21
    for k in wd:
        assert wf[k].shape == wd[k].shape and (wf[k] - wd[k]).abs().max() < 1e-5, k
    ck = fsdp / "checkpoints" / "step_00000005"
    assert (ck / ".metadata").is_file() and {"trainer_rank0.pt", "trainer_rank1.pt"} <= {p.name for p in ck.iterdir()}
    # one process resumes the 2-rank FSDP2 checkpoint (DCP reshards) and continues like the 7-step run
    s = train(TrainConfig(**one_cfg, steps=7, output_dir=str(fsdp), resume_with_new_settings=True))  # 5 -> 7 steps, asked for
    assert s["resumed_from_step"] == 5
    cont, full = records(fsdp), records(one)
    assert [r["step"] for r in cont] == list(range(1, 8)) and cont[-1]["world_size"] == 1
    for a, b in zip(full[5:], cont[5:]):
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-5)


def test_fsdp2_keeping_gathered_weights_trains_identically(prepared, tmp_path):
    """--fsdp-keep-weights changes only when FSDP2 gathers and frees weights (once per step instead of
    twice per micro-batch), not the math: same losses, validation, checkpoint and final weights as
    plain FSDP2; a validation pass in between leaves the weights sharded for the checkpoint."""
    base = ["--lr", "0.001", "--min-lr", "0.001", "--warmup-steps", "0", "--micro-batch-size", "1", "--grad-accum", "3",
            "--parallel", "fsdp", "--val-every", "2", "--checkpoint-every", "2", "--save-model", "True"]
    plain, kept = tmp_path / "plain", tmp_path / "kept"
    run(torchrun(common(prepared, plain, 4, *base)))
    run(torchrun(common(prepared, kept, 4, *base, "--fsdp-keep-weights", "True")))
    assert json.loads((kept / "config.json").read_text())["built"]["fsdp_keep_weights"] is True
    assert json.loads((plain / "config.json").read_text())["built"]["fsdp_keep_weights"] is False
    ra, rb = records(plain), records(kept)
    assert [r["step"] for r in rb] == [1, 2, 3, 4]
    for a, b in zip(ra, rb):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6) and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert (a.get("val_loss") is None) == (b.get("val_loss") is None)
        if a.get("val_loss") is not None:
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-6)
    from safetensors.torch import load_file

    wa, wb = load_file(plain / "model" / "model.safetensors"), load_file(kept / "model" / "model.safetensors")
    assert wa.keys() == wb.keys() and all((wa[k] - wb[k]).abs().max() < 1e-6 for k in wa)
    assert (kept / "checkpoints" / "step_00000004" / ".metadata").is_file()


def _start_and_wait(cmd, out, min_steps, timeout=120):
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    metrics = out / "metrics.jsonl"
    while time.time() < deadline:
        if metrics.exists() and len(fmetrics.read_metrics(metrics)) >= min_steps:
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"trainer ended early (rc {proc.returncode}): {proc.stderr.read()[-2000:]}")
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("trainer did not reach the step in time")


@pytest.fixture(scope="module")
def reference(prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    run(trainer(common(prepared, out, 150, "--checkpoint-every", "4")))
    return records(out)


def test_kill_9_then_restart_continues_bit_identically(prepared, reference, tmp_path):
    out = tmp_path / "killed"
    args = common(prepared, out, 150, "--checkpoint-every", "4")
    proc = _start_and_wait(trainer(args), out, min_steps=10)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close(), proc.stderr.close()
    at_kill = len(records(out))
    assert proc.returncode == -signal.SIGKILL and at_kill < 150
    restarted = run(trainer(args))
    resumed = int(restarted.stdout.split("resumed from checkpoint at step ")[1].split()[0])
    assert 4 <= resumed <= at_kill and resumed % 4 == 0
    recs = records(out)
    assert [r["step"] for r in recs] == list(range(1, 151))  # none lost, none repeated
    assert [r["loss"] for r in recs] == [r["loss"] for r in reference]


def test_sigterm_writes_a_checkpoint_and_exits_cleanly(prepared, reference, tmp_path):
    out = tmp_path / "spot"
    args = common(prepared, out, 150)  # no periodic checkpoints: only SIGTERM's
    proc = _start_and_wait(trainer(args), out, min_steps=5)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    step = int(stdout.split("SIGTERM received: checkpoint written at step ")[1].split(";")[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == step < 150
    assert [r["step"] for r in records(out)] == list(range(1, step + 1))
    assert (out / "checkpoints" / f"step_{step:08d}" / ".metadata").is_file()
    run(trainer(args))
    assert [r["loss"] for r in records(out)] == [r["loss"] for r in reference]


def test_sigterm_to_torchrun_checkpoints_every_rank_at_the_same_step(prepared, tmp_path):
    """SageMaker stops a job (spot reclaim) by signalling torchrun, which passes SIGTERM to every rank."""
    out = tmp_path / "spot2"
    proc = _start_and_wait(torchrun(common(prepared, out, 400, "--micro-batch-size", "2")), out, min_steps=5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)  # torchrun itself exits non-zero on the signal; the ranks exit cleanly
    recs = records(out)
    step = recs[-1]["step"]
    assert [r["step"] for r in recs] == list(range(1, step + 1)) and step < 400
    ck = out / "checkpoints" / f"step_{step:08d}"
    assert (ck / ".metadata").is_file() and {"trainer_rank0.pt", "trainer_rank1.pt"} <= {p.name for p in ck.iterdir()}
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    # the job restarts (here as one process with the same global batch of 4) and carries on from there
    s = train(TrainConfig(model="llama-tiny", seq_len=32, compute_dtype="fp32", steps=step + 3, micro_batch_size=4,
                          data=str(prepared), output_dir=str(out), progress="off", plot=False, print_metrics=False,
                          save_model=False, resume_with_new_settings=True))  # 400 steps became step + 3: asked for
    assert s["resumed_from_step"] == step
    assert [r["step"] for r in records(out)] == list(range(1, step + 4))


def test_a_refusal_under_torchrun_is_said_once_and_every_rank_ends_with_it(prepared, tmp_path):
    """A re-run into a finished run's folder with another seed is refused by rank 0 (it reads the checkpoint); the
    other rank ends with the same exit code instead of a broken barrier's traceback, and the line is said once."""
    out = tmp_path / "r"
    run(torchrun(common(prepared, out, 2, "--micro-batch-size", "2")))
    kept = (out / "metrics.jsonl").read_bytes()
    p = subprocess.run(torchrun(common(prepared, out, 2, "--micro-batch-size", "2", "--seed", "7")), env=ENV,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode != 0
    said = p.stderr.count("fp8lab train: error: checkpoint")
    assert said == 1 and "seed: 1234 there, 7 here" in p.stderr, p.stderr[-3000:]
    assert "[rank1]" not in p.stderr and "Connection closed by peer" not in p.stderr, p.stderr[-3000:]
    # rank 0 exits with fp8lab's "bad options" code; rank 1 with it too, unless torchrun's SIGTERM (sent once rank 0
    # is gone) reaches it first: a race of milliseconds either way, with nothing printed
    assert "exitcode  : 2" in p.stderr, p.stderr[-3000:]
    assert (out / "metrics.jsonl").read_bytes() == kept
