"""``--fused-loss`` in the trainer on the CPU (issue 51): the chunked loss trains the same model as the plain
loss (fp32, same seed: the same losses and validation loss), on the plain transformers model, the emulated
FP8 backend's fused blocks and GPT-Neo (tied head); the decision and its reason are in the run record."""
from __future__ import annotations

import json

import pytest

from fp8lab.records import metrics as fmetrics
from fp8lab.train.entry import TrainConfig, train

TINY = dict(seq_len=32, micro_batch_size=2, grad_accum=2, compute_dtype="fp32", plot=False, progress="off",
            print_metrics=False, steps=3, val_every=3, val_batches=1, checkpoint_every=-1)


def _records(out):
    return [(r["loss"], r.get("val_loss")) for r in fmetrics.read_metrics(out / "metrics.jsonl")]


@pytest.mark.parametrize("model,precision,backend", [("llama-tiny", "bf16", "none"), ("llama-tiny", "fp8", "emulated"),
                                                     ("gptneo-tiny", "bf16", "none")])
def test_fused_loss_trains_like_the_plain_loss(prepared, tmp_path, model, precision, backend):
    base = dict(**TINY, model=model, precision=precision, backend=backend, data=str(prepared))
    train(TrainConfig(**base, fused_loss="off", save_model=False, output_dir=str(tmp_path / "off")))
    s = train(TrainConfig(**base, fused_loss="on", output_dir=str(tmp_path / "on")))
    assert s["status"] == "completed"
    plain, fused = _records(tmp_path / "off"), _records(tmp_path / "on")
    assert [x[0] for x in fused] == pytest.approx([x[0] for x in plain], rel=1e-4)
    assert fused[-1][1] is not None and fused[-1][1] == pytest.approx(plain[-1][1], rel=1e-4)
    cfg = json.loads((tmp_path / "on" / "config.json").read_text())
    assert cfg["fused_loss"] == "on" and cfg["plan"]["fused_loss"] is True
    assert cfg["plan"]["reasons"]["fused_loss"].startswith("--fused-loss on")
    assert cfg["requested"]["fused_loss"] == "on"
    assert (tmp_path / "on" / "model" / "config.json").is_file()  # the export sees a plain head


def test_auto_is_off_on_a_cpu_with_its_reason(prepared, tmp_path, capsys):
    train(TrainConfig(**TINY, model="llama-tiny", data=str(prepared), save_model=False, output_dir=str(tmp_path / "a")))
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["fused_loss"] == "off" and "auto: off on a CPU" in cfg["plan"]["reasons"]["fused_loss"]
