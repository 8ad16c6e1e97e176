"""An evaluation never costs the training: a validation pass that fails (out of memory, as the final evaluation of
Qwen2.5-3B at 8K did on an 80 GB H100) leaves the last checkpoint, the exported model and a summary that says the
validation loss is missing and why; the same command then evaluates again without training."""
from __future__ import annotations

import json

import pytest
import torch

from fp8lab.records import metrics as fmetrics
from fp8lab.train import entry as ftrain
from fp8lab.train import checkpoint as fckpt
from fp8lab.train.trainer import Trainer


def argv(*extra: str) -> list[str]:
    return ["--model", "llama-tiny", "--seq-len", "32", "--micro-batch-size", "2", "--compute-dtype", "fp32",
            "--progress", "off", "--plot", "False", "--print-metrics", "False", "--val-batches", "1", *extra]


def oom(self):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 18.55 GiB")


def test_a_failed_final_evaluation_keeps_checkpoint_model_and_summary(prepared, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    args = argv("--steps", "3", "--data", str(prepared), "--output-dir", str(out))
    monkeypatch.setattr(Trainer, "evaluate", oom)
    assert ftrain.main(args) == ftrain.EXIT_EVAL_FAILED
    err = capsys.readouterr().err
    assert "the final evaluation failed (OutOfMemoryError: CUDA out of memory" in err and "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "eval_failed" and summary["val_loss"] is None and summary["steps"] == 3
    assert summary["val_error"].startswith("OutOfMemoryError") and summary["model_dir"] == "model"
    assert [s for s, _ in fckpt.complete_checkpoints(out / "checkpoints")][0] == 3
    assert (out / "model" / "model.safetensors").is_file() and (out / "model" / "config.json").is_file()
    steps = [r["step"] for r in fmetrics.read_metrics(out / "metrics.jsonl") if r.get("loss") is not None]
    assert steps == [1, 2, 3]

    monkeypatch.undo()  # the same command again: evaluates the kept step 3, trains nothing
    assert ftrain.main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] == 3
    assert summary["val_loss"] is not None and summary["val_error"] is None
    steps = [r["step"] for r in fmetrics.read_metrics(out / "metrics.jsonl") if r.get("loss") is not None]
    assert steps == [1, 2, 3]


def test_a_failed_periodic_evaluation_does_not_stop_the_run(prepared, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real = Trainer.evaluate
    calls = []

    def first_fails(self):
        calls.append(self.state.step)
        return oom(self) if len(calls) == 1 else real(self)

    monkeypatch.setattr(Trainer, "evaluate", first_fails)
    code = ftrain.main(argv("--steps", "4", "--val-every", "2", "--checkpoint-every", "-1", "--save-model", "False",
                            "--data", str(prepared), "--output-dir", str(out)))
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert calls == [2, 4]
    assert "the evaluation at step 2 failed (OutOfMemoryError" in printed.out + printed.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4 and summary["val_loss"] is not None
    assert summary["val_error"].startswith("OutOfMemoryError")  # the earlier failure is on record


@pytest.mark.parametrize("vocab,tokens,kernel", [(151_936, 32_768, "triton"), (128_256, 32_768, "compiled"),
                                                 (32_000, 8192, "eager"), (50_257, 512, "triton")])
def test_a_no_grad_chunk_never_needs_more_than_a_training_chunk(vocab, tokens, kernel):
    from fp8lab.plan import fused_loss as rule

    train = rule.BYTES_PER_LOGIT[kernel] * vocab * rule.chunk_tokens(vocab, tokens, kernel)
    no_grad = rule.no_grad_loss_bytes(vocab=vocab, tokens_per_micro_batch=tokens, kernel=kernel)
    assert 0 < no_grad <= train
    assert 1 <= rule.no_grad_chunk_tokens(vocab, tokens, kernel) <= tokens


def test_the_no_grad_loss_in_small_chunks_equals_the_plain_loss():
    from fp8lab.train.fused_loss import linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(3, 40, 16, generator=g), torch.randn(97, 16, generator=g)
    y = torch.randint(0, 97, (3, 40), generator=g)
    y[0, :5] = -100
    want = torch.nn.functional.cross_entropy((h @ w.t()).reshape(-1, 97), y.reshape(-1), ignore_index=-100)
    with torch.no_grad():
        got = linear_cross_entropy(h, w, y, kernel="eager")  # chunk sizes from the no-grad rule
        got_small = linear_cross_entropy(h, w, y, chunk=7, kernel="eager")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_small, want, rtol=1e-5, atol=1e-5)
