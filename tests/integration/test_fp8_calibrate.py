"""Delayed scaling's first step (emulated FP8 on CPU): a new run's calibration pass gives step 1 measured scales."""
from __future__ import annotations

import json
import shutil

from fp8lab.train.entry import TrainConfig, train

TINY = dict(model="llama-tiny", seq_len=32, micro_batch_size=2, compute_dtype="fp32", plot=False, progress="off",
            print_metrics=False, precision="fp8", backend="emulated", save_model=False)


def _step1_casts(prepared, out, **kw):
    s = train(TrainConfig(**TINY, steps=2, fp8_stats_every=1, data=str(prepared), output_dir=str(out), **kw))
    assert s["status"] == "completed"
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    stats = [r for r in recs if r.get("record") == "fp8_stats" and r["step"] == 1]
    assert len(stats) == 1
    return stats[0]["layers"], [r["loss"] for r in recs if r.get("record") is None]


def test_a_new_delayed_run_casts_step_one_with_measured_scales(prepared, tmp_path):
    calibrated, loss_c = _step1_casts(prepared, tmp_path / "c")
    plain, loss_p = _step1_casts(prepared, tmp_path / "p", fp8_calibrate=False)
    kinds = {"activation", "weight", "gradient"}
    assert {c["kind"] for c in calibrated} == {c["kind"] for c in plain} == kinds
    # without the pass every first cast uses TE's starting scale 1.0; with it, none does
    assert all(c["scale"] == 1.0 for c in plain)
    assert all(c["scale"] != 1.0 for c in calibrated)
    # the pass does not consume data: step 1 sees the same batch (same first activation amax)
    assert calibrated[0]["kind"] == "activation" and calibrated[0]["amax"] == plain[0]["amax"]

    def underflow(layers):
        return sum(c["underflow"] for c in layers if c["kind"] == "gradient")

    # at scale 1.0 the small loss gradients fall below E5M2's smallest values; measured scales keep them
    assert underflow(calibrated) < underflow(plain) / 10
    assert len(loss_c) == len(loss_p) == 2


def _spy_on_the_pass(monkeypatch) -> list[dict]:
    """What each calibration pass did: its forwards, and whether it left weights, gradients and the data as it found
    them."""
    import torch

    from fp8lab.train.trainer import Trainer

    seen, real = [], Trainer.calibrate_fp8

    def spy(self):
        before = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        position, calls = self.loader.state_dict(), []
        hook = self.model.register_forward_hook(lambda *a: calls.append(1))
        try:
            real(self)
        finally:
            hook.remove()
        params = list(self.model.parameters())
        grads = [g for p in params for g in (p.grad, getattr(p, "main_grad", None)) if g is not None]
        seen.append({"forwards": len(calls), "step": self.state.step, "position": self.loader.state_dict() == position,
                     "weights": all(torch.equal(before[n], p) for n, p in self.model.named_parameters()),
                     "no_gradients": all(not g.any() for g in grads)})

    monkeypatch.setattr(Trainer, "calibrate_fp8", spy)
    return seen


def test_the_pass_updates_nothing_and_leaves_the_data_where_it_was(prepared, tmp_path, monkeypatch):
    seen = _spy_on_the_pass(monkeypatch)
    s = train(TrainConfig(**TINY, steps=1, grad_accum=2, data=str(prepared), output_dir=str(tmp_path / "a")))
    assert s["status"] == "completed"
    assert seen == [{"forwards": 1, "step": 0, "position": True, "weights": True, "no_gradients": True}]


def test_current_scaling_and_a_resumed_run_need_no_calibration(prepared, tmp_path, monkeypatch):
    seen = _spy_on_the_pass(monkeypatch)
    layers, _ = _step1_casts(prepared, tmp_path / "cur", recipe="current")
    assert all(c["scale"] != 1.0 for c in layers)  # its own amax, every cast
    assert seen[-1]["forwards"] == 0  # no history to fill: the pass returns at once
    a, b = tmp_path / "a", tmp_path / "b"
    base = dict(**TINY, fp8_stats_every=1, data=str(prepared), steps=4, checkpoint_every=2)
    assert train(TrainConfig(**base, output_dir=str(a)))["status"] == "completed"
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_00000004")
    again = train(TrainConfig(**base, output_dir=str(b)))  # from step 2's checkpoint and its amax history
    assert again["status"] == "completed" and again["resumed_from_step"] == 2

    def after_two(out):
        recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [(r.get("record"), r.get("loss"), r.get("layers")) for r in recs if r["step"] > 2]

    # no second calibration on resume: steps 3 and 4 cast with the same scales and give the same losses
    assert after_two(b) == after_two(a)
