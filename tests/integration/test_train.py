"""The trainer in one process on CPU: outputs, metrics format, FP8 (emulated), overflow guard,
SageMaker layout, resume state, and option validation. Tiny models (2 layers, hidden 64, vocab 512)."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from fp8lab.data import tokens as fdata
from fp8lab.records import metrics as fmetrics
from fp8lab.train import run_paths
from fp8lab.train import entry as ftrain
from fp8lab.plan.options import flag
from fp8lab.train.entry import TrainConfig, main, train

TINY = dict(model="llama-tiny", seq_len=32, micro_batch_size=2, compute_dtype="fp32", plot=False,
            progress="off", print_metrics=False)


def losses(out_dir):
    return [r["loss"] for r in fmetrics.read_metrics(out_dir / "metrics.jsonl")]


def test_cpu_run_writes_metrics_config_checkpoints_and_hf_model(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    s = train(TrainConfig(**{**TINY, "print_metrics": True, "plot": True}, steps=8, lr=3e-3, warmup_steps=2, val_every=4, checkpoint_every=4,
                          data=str(prepared), output_dir=str(out)))
    assert s["status"] == "completed" and s["steps"] == 8 and s["tokens"] == 8 * 2 * 32
    recs = fmetrics.read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(1, 9))
    for r in recs:
        assert set(fmetrics.STEP_KEYS) <= set(r) and set(r) - set(fmetrics.STEP_KEYS) <= {"val_loss"}
        assert r["precision"] == "bf16" and r["backend"] == "none" and r["recipe"] is None and r["mfu"] is None
        assert r["world_size"] == 1 and r["gpu_name"] == "cpu" and r["tokens_per_sec_per_gpu"] > 0
    assert [r["step"] for r in recs if "val_loss" in r] == [4, 8]
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.1  # real text: the loss falls
    assert recs[-1]["val_loss"] < recs[3]["val_loss"]
    assert recs[0]["lr"] < recs[2]["lr"] and recs[-1]["lr"] < recs[2]["lr"]  # warm-up, then cosine decay
    # the stdout line, read with the regexes SageMaker jobs are launched with
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fp8lab-metrics")]
    assert len(lines) == 8 + 2
    assert re.fullmatch(r"fp8lab-metrics step=1 loss=\d+\.\d{6} tokens_per_sec_per_gpu=\d+\.\d mfu=0\.0000 "
                        r"step_time_s=\d+\.\d{4} lr=[0-9.]+ grad_norm=\d+\.\d{4}", lines[0])
    from fp8lab.launch import METRIC_DEFINITIONS, parse_metric_line

    assert float(re.search(METRIC_DEFINITIONS["train:loss"], lines[0]).group(1)) == pytest.approx(recs[0]["loss"], abs=1e-6)
    assert float(re.search(METRIC_DEFINITIONS["validation:loss"], lines[4]).group(1)) == pytest.approx(recs[3]["val_loss"], abs=1e-4)
    assert re.search(METRIC_DEFINITIONS["train:loss"], lines[4]) is None  # val line is not a train loss
    assert parse_metric_line(lines[-2])["lr"] == pytest.approx(recs[-1]["lr"], rel=1e-6)
    cfg = json.loads((out / "config.json").read_text())
    for key in ("model", "precision", "backend", "seq_len", "micro_batch_size", "grad_accum", "world_size",
                "gpu_name", "torch", "transformers", "transformer_engine", "command"):
        assert key in cfg
    assert cfg["world_size"] == 1 and cfg["data_manifest"]["vocab_size"] == 512
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith(".")) == ["step_00000004", "step_00000008"]
    assert (out / "loss.png").stat().st_size > 1000
    # the final model is a plain HF checkpoint with its tokenizer
    from transformers import AutoTokenizer, LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(out / "model")
    tok = AutoTokenizer.from_pretrained(out / "model")
    assert tok.decode(tok("In the beginning")["input_ids"]) == "In the beginning"
    assert hf.config.num_hidden_layers == 2 and hf.config.vocab_size == 512


def test_fp8_emulated_fused_run_and_hf_export(prepared, tmp_path):
    out = tmp_path / "fp8"
    s = train(TrainConfig(**TINY, precision="fp8", backend="emulated", recipe="current", steps=4,
                          data=str(prepared), output_dir=str(out)))
    recs = fmetrics.read_metrics(out / "metrics.jsonl")
    assert s["status"] == "completed" and all(r["precision"] == "fp8" for r in recs)
    assert {r["backend"] for r in recs} == {"emulated"} and {r["recipe"] for r in recs} == {"current"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["plan"]["backend"] == "emulated" and "current" in cfg["plan"]["recipe"]
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(out / "model")  # fused QKV / gate-up split back
    assert hf.model.layers[0].self_attn.k_proj.weight.shape == (32, 64)


def test_loss_remedies_reach_the_model_and_the_profile_is_written(prepared, tmp_path):
    """A recipe string with settings, BF16 edge blocks and --profile-steps in one emulated FP8 run."""
    out = tmp_path / "remedy"
    s = train(TrainConfig(**TINY, model_overrides={"num_layers": 4}, precision="fp8", backend="emulated",
                          recipe="delayed:amax_history_len=16,margin=1", bf16_edge_blocks=1, steps=5,
                          profile_steps=(3, 4), checkpoint_every=-1, save_model=False, data=str(prepared),
                          output_dir=str(out)))
    assert s["status"] == "completed"
    cfg = json.loads((out / "config.json").read_text())
    assert "margin=1" in cfg["plan"]["recipe"] and "amax_history_len=16" in cfg["plan"]["recipe"]
    assert cfg["bf16_edge_blocks"] == 1
    assert "blocks.0" in cfg["conversion"]["high_precision"] and "blocks.3" in cfg["conversion"]["high_precision"]
    assert "blocks.1" not in cfg["conversion"]["high_precision"]
    recs = fmetrics.read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs if r.get("profiled")] == [3, 4]
    prof = json.loads((out / "profile.json").read_text())
    assert prof["steps"] == 2 and prof["source"] == "cpu ops (self time)"  # no GPU here: CPU op times
    assert prof["categories_ms"]["gemm (bf16/fp32)"] > 0 and prof["time_ms_per_step"] > 0
    assert prof["unprofiled_step_ms"] > 0 and prof["gpu_busy"] is None


def test_fp8_weight_cache_is_only_active_where_the_backend_has_one(prepared, tmp_path):
    """--grad-accum > 1 on the emulated fused model: no FP8 weight cache there, recorded as inactive."""
    out = tmp_path / "ga"
    train(TrainConfig(**TINY, precision="fp8", backend="emulated", steps=2, grad_accum=2, checkpoint_every=-1,
                      save_model=False, data=str(prepared), output_dir=str(out)))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["fp8_weight_cache"] is True and cfg["built"]["fp8_weight_cache"] is False


@pytest.mark.parametrize("backend,parallel,precision,param_dtype,distributed,refused", [
    ("te", "fsdp", "bf16", "fp32", True, True),
    ("te", "fsdp", "bf16", "bf16", True, False),
    ("te", "fsdp", "fp8", "fp32", True, False),
    ("te", "ddp", "bf16", "fp32", True, False),
    ("te", "fsdp", "bf16", "fp32", False, False),
    (None, "fsdp", "bf16", "fp32", True, False),
])
def test_fsdp2_with_te_in_bf16_needs_bf16_parameters(backend, parallel, precision, param_dtype, distributed, refused):
    from fp8lab.plan.runplan import fsdp_te_problem

    c = TrainConfig(model="llama-tiny", precision=precision, parallel=parallel, param_dtype=param_dtype,
                    backend="te" if backend else "none")
    problem = fsdp_te_problem(c, backend, distributed)
    assert (problem is not None) == refused
    if refused:
        assert "--param-dtype bf16" in problem and "allowed:" in problem


def test_nan_step_is_skipped_and_counted(prepared, tmp_path, capsys):
    out = tmp_path / "nan"
    s = train(TrainConfig(**TINY, steps=6, inject_nan_at_steps=(3,), data=str(prepared), output_dir=str(out)))
    recs = fmetrics.read_metrics(out / "metrics.jsonl")
    assert s["status"] == "completed" and s["nonfinite_steps"] == 1 and s["steps"] == 6
    assert recs[2]["step"] == 3 and recs[2]["skipped"] is True and recs[2]["loss"] is None
    assert all(r["loss"] is not None and "skipped" not in r for i, r in enumerate(recs) if i != 2)
    assert "step 3 skipped: non-finite loss or gradient (1 in a row, 1 in total" in capsys.readouterr().out


def test_nan_run_stops_cleanly_with_last_good_checkpoint(prepared, tmp_path, capsys):
    out = tmp_path / "nans"
    argv = ["--model", "llama-tiny", "--seq-len", "32", "--micro-batch-size", "2", "--compute-dtype", "fp32",
            "--steps", "10", "--checkpoint-every", "2", "--max-bad-steps", "3", "--study", "--inject-nan-at-steps", "4,5,6",
            "--data", str(prepared), "--output-dir", str(out), "--progress", "off", "--plot", "False"]
    assert main(argv) == ftrain.EXIT_OVERFLOW
    err = capsys.readouterr().err
    assert "stopped at step 6: 3 steps in a row had a non-finite loss" in err and "Weights are those of step 3" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped_nonfinite" and summary["nonfinite_steps"] == 3 and summary["model_dir"] is None
    assert [r["step"] for r in fmetrics.read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    from fp8lab.train.checkpoint import complete_checkpoints

    assert [s for s, _ in complete_checkpoints(out / "checkpoints")] == [2]
    assert not (out / "model").exists()


def test_resume_continues_exactly_and_metrics_have_no_gap_or_duplicate(prepared, tmp_path):
    base = dict(**TINY, steps=6, checkpoint_every=3, data=str(prepared), save_model=False)
    a, b = tmp_path / "a", tmp_path / "b"
    train(TrainConfig(**base, output_dir=str(a)))
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_00000006")  # as if the run died after step 5
    s = train(TrainConfig(**base, output_dir=str(b)))
    assert s["resumed_from_step"] == 3
    assert [r["step"] for r in fmetrics.read_metrics(b / "metrics.jsonl")] == list(range(1, 7))
    assert losses(b) == losses(a)  # bit-identical on CPU: weights, AdamW state, LR schedule, data position


def test_resume_rejects_a_checkpoint_of_another_run(prepared, tmp_path):
    out = tmp_path / "r"
    train(TrainConfig(**TINY, steps=2, data=str(prepared), output_dir=str(out), save_model=False))
    with pytest.raises(ValueError, match="seq_len: 32 there, 64 here"):
        train(TrainConfig(**{**TINY, "seq_len": 64}, steps=4, data=str(prepared), output_dir=str(out)))


def test_fp8_delayed_scaling_state_survives_resume(prepared, tmp_path):
    """Delayed scaling keeps an amax history per tensor: a resumed run must get it back from the checkpoint."""
    base = dict(**TINY, precision="fp8", backend="emulated", recipe="delayed", steps=6, checkpoint_every=3,
                data=str(prepared), save_model=False)
    a, b = tmp_path / "a", tmp_path / "b"
    train(TrainConfig(**base, output_dir=str(a)))
    from fp8lab.fp8.convert import convert_model
    from fp8lab.model.models import build_model

    keys = convert_model(build_model("llama-tiny"), backend="emulated", fuse=True).state_dict().keys()
    assert any(k.endswith("_extra_state") for k in keys), "the emulated backend must checkpoint its amax histories"
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_00000006")
    s = train(TrainConfig(**base, output_dir=str(b)))
    assert s["resumed_from_step"] == 3 and losses(b) == losses(a)


def test_an_emulated_bf16_run_resumes_from_its_own_checkpoint(prepared, tmp_path):
    """The emulated backend's modules checkpoint an (empty, for BF16) extra state: it must travel as a tensor,
    not pickled bytes, or loading with weights_only refused every checkpoint of the run (session 10)."""
    out = tmp_path / "emu"
    base = dict(**TINY, backend="emulated", precision="bf16", steps=4, checkpoint_every=2, data=str(prepared),
                save_model=False)
    train(TrainConfig(**base, output_dir=str(out)))
    shutil.rmtree(out / "checkpoints" / "step_00000004")  # as if the run died after step 3
    s = train(TrainConfig(**base, output_dir=str(out)))
    assert s["status"] == "completed" and s["resumed_from_step"] == 2


def test_sagemaker_entry_point_layout(prepared, tmp_path, monkeypatch):
    """Hyperparameters from SM_HPS, data from the train channel, outputs where SageMaker collects them."""
    ml = tmp_path / "opt" / "ml"
    channel = ml / "input" / "data" / "train"
    shutil.copytree(prepared, channel)
    for name, path in (("SM_MODEL_DIR", ml / "model"), ("SM_OUTPUT_DATA_DIR", ml / "output" / "data"),
                       ("SM_CHANNEL_TRAIN", channel)):
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(name, str(path))
    monkeypatch.setenv("SM_TRAINING_ENV", json.dumps({"job_name": "fp8lab-test"}))
    # where SageMaker syncs checkpoints is /opt/ml/checkpoints; the test points it at tmp
    assert run_paths.resolve_paths(TrainConfig()).checkpoint_dir.as_posix() == "/opt/ml/checkpoints"
    monkeypatch.setenv(run_paths.CHECKPOINT_DIR_ENV, str(ml / "checkpoints"))
    hps = {"model": "llama-tiny", "precision": "fp8", "backend": "emulated", "recipe": "current", "steps": 3,
           "seq-len": 32, "micro-batch-size": 2, "grad-accum": 1, "lr": 0.001, "seed": 0, "fuse": "True",
           "compile": "False", "checkpoint-every": 2, "progress": "off", "plot": "True",
           "sagemaker_program": "sm_entry.py"}
    monkeypatch.setenv("SM_HPS", json.dumps(hps))
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    assert (ml / "model" / "model.safetensors").is_file() and (ml / "model" / "tokenizer.json").is_file()
    out = ml / "output" / "data"
    assert {"metrics.jsonl", "config.json", "summary.json", "loss.png"} <= {p.name for p in out.iterdir()}
    assert [r["step"] for r in fmetrics.read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    assert sorted(p.name for p in (ml / "checkpoints").iterdir() if not p.name.startswith(".")) == ["step_00000002", "step_00000003"]
    assert not (out / "data").exists()  # the channel was already prepared: used as is
    assert not (tmp_path / "runs").exists()


def test_text_channel_is_tokenized_on_the_fly(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("\n\n".join(f"Verse {i}: and the light was good, and it was so." for i in range(200)))
    out = tmp_path / "out"
    s = train(TrainConfig(**TINY, steps=2, data=str(texts), output_dir=str(out), save_model=False))
    assert s["status"] == "completed"
    assert fdata.read_manifest(out / "data")["source"]["files"] == ["a.txt"]


BAD = [
    (["--model", "gpt5"], "--model='gpt5' is invalid; allowed: llama-tiny"),
    (["--precision", "fp16"], "--precision='fp16' is invalid; allowed: bf16 | fp8"),
    (["--backend", "cuda"], "--backend='cuda' is invalid; allowed: auto | none | te | torchao | emulated"),
    (["--recipe", "dynamic"], "--recipe='dynamic' is invalid; allowed: auto | delayed"),
    (["--fuse", "maybe"], "--fuse='maybe' is invalid; allowed: True | False"),
    (["--steps", "0"], "--steps=0 is invalid; allowed: a positive integer"),
    (["--steps", "ten"], "--steps='ten' is invalid; allowed: an integer"),
    (["--steps", "5", "--tokens", "1000"], "give one of them, not both"),
    (["--micro-batch-size", "-1"], "--micro-batch-size=-1 is invalid"),
    (["--grad-accum", "1.5"], "--grad-accum='1.5' is invalid; allowed: an integer"),
    (["--model", "gptneo-tiny", "--seq-len", "4096"], "--seq-len=4096 is invalid; allowed: at most 256 for gptneo-tiny"),  # Llama's is raised (#34)
    (["--lr", "2"], "--lr=2.0 is invalid; allowed: a number in (0, 1)"),
    (["--lr", "nan"], "--lr=nan is invalid"),
    (["--min-lr", "0.1"], "--min-lr=0.1 is invalid; allowed: a number in [0, --lr=0.0003]"),
    (["--warmup-steps", "10", "--steps", "10"], "--warmup-steps=10 is invalid; allowed: fewer than --steps (10)"),
    (["--checkpoint-every", "-5"], "--checkpoint-every=-5 is invalid"),
    (["--compile", "perhaps"], "--compile='perhaps' is invalid; allowed: True | False"),
    (["--seed", "-3"], "--seed=-3 is invalid; allowed: an integer from 0 to 4294967295"),
    (["--parallel", "tp"], "--parallel='tp' is invalid; allowed: ddp | fsdp"),
    (["--data", "/nonexistent/tokens"], "--data='/nonexistent/tokens' is invalid; allowed: an existing folder"),
    (["--model-override", "num_layers=0"], "--model-override: llama-tiny: num_layers must be a positive integer"),
    (["--model-override", "n_layer=2"], "--model-override: unknown override(s) n_layer"),
    (["--model-override", "oops"], "--model-override 'oops' is invalid; allowed: key=value"),
    (["--precision", "fp8", "--backend", "none"], "--backend none cannot run --precision fp8"),
    (["--beta2", "1"], "--beta2=1.0 is invalid; allowed: a number in [0, 1)"),
    (["--fp8-weight-cache", "sometimes"], "--fp8-weight-cache='sometimes' is invalid; allowed: True | False"),
    (["--no-such-option", "1"], "unrecognized arguments: --no-such-option"),
    (["--recipe", "delayed:history=16"], "--recipe='delayed:history=16' is invalid: recipe 'delayed:history=16': 'history=16' is not key=value"),
    (["--recipe", "auto:margin=1"], "--recipe='auto:margin=1' is invalid; allowed: auto | delayed"),
    (["--bf16-edge-blocks", "1"], "--bf16-edge-blocks=1 is invalid; allowed: an integer >= 0 that leaves some of llama-tiny's 2 blocks in FP8 (at most 0)"),
    (["--profile-steps", "3,x"], "--profile-steps='3,x' is invalid; allowed: comma-separated step numbers"),
    (["--steps", "4", "--profile-steps", "5"], "--profile-steps=(5,) is invalid; allowed: steps within the run's --steps 4"),
]


@pytest.mark.parametrize("argv,expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_options_are_rejected_with_one_clear_line(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv + ["--progress", "off"]) == ftrain.EXIT_BAD_OPTIONS
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1 and err.startswith("fp8lab train: error: ")
    assert not (tmp_path / "runs").exists()  # rejected before anything was written


def test_unusable_backend_and_device_rejected_before_compute(capsys, tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only messages")
    monkeypatch.chdir(tmp_path)
    assert main(["--precision", "fp8", "--backend", "te", "--progress", "off"]) == ftrain.EXIT_BAD_OPTIONS
    assert "--backend te: not usable on this machine" in capsys.readouterr().err
    assert main(["--device", "cuda", "--progress", "off"]) == ftrain.EXIT_BAD_OPTIONS
    assert "--device cuda: no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_cli_spellings_and_sagemaker_booleans():
    c = ftrain.parse_args(["--micro_batch_size", "3", "--grad-accum", "2", "--compile", "--fuse", "False",
                           "--model-override", "num_layers=1,hidden_size=32", "--model-override", "num_heads=2",
                           "--steps", "None", "--tokens", "5000", "--study", "--inject-nan-at-steps", "2,7"])
    assert (c.micro_batch_size, c.grad_accum, c.compile, c.fuse, c.steps, c.tokens) == (3, 2, True, False, None, 5000)
    assert c.model_overrides == {"num_layers": 1, "hidden_size": 32, "num_heads": 2}
    assert c.inject_nan_at_steps == (2, 7)


def test_mfu_uses_the_dense_bf16_peak():
    assert fmetrics.peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert fmetrics.peak_bf16_flops("NVIDIA H200") == 989e12
    assert fmetrics.peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert fmetrics.peak_bf16_flops("NVIDIA GH200 480GB") == 989e12
    assert fmetrics.peak_bf16_flops("cpu") is None and fmetrics.peak_bf16_flops("Some Future GPU") is None
    assert fmetrics.mfu(6e9, 10_000, 989e12) == pytest.approx(6e13 / 989e12)
    assert fmetrics.mfu(6e9, 10_000, None) is None
    assert fmetrics.plain(3e-5, 10) == "0.00003" and fmetrics.plain(0.0, 10) == "0"


def test_metrics_log_truncates_past_the_checkpoint_and_torn_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"step": i, "loss": 1.0}) + "\n" for i in range(1, 8)) + '{"step": 8, "lo')
    log = fmetrics.MetricsLog(p, resume_step=5)
    log.write({"step": 6, "loss": 2.0})
    log.close()
    assert [(r["step"], r["loss"]) for r in fmetrics.read_metrics(p)] == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 1.0), (6, 2.0)]
    fmetrics.MetricsLog(p, resume_step=None).close()
    assert p.read_text() == ""


@pytest.mark.parametrize("precision,backend", [("bf16", "auto"), ("fp8", "emulated")])
def test_activation_checkpointing_recomputes_the_same_math(prepared, tmp_path, precision, backend):
    base = dict(**TINY, precision=precision, backend=backend, recipe="current", steps=3, data=str(prepared),
                save_model=False, checkpoint_every=-1)
    train(TrainConfig(**base, output_dir=str(tmp_path / "plain")))
    train(TrainConfig(**base, activation_checkpointing=True, output_dir=str(tmp_path / "ac")))
    assert losses(tmp_path / "ac") == pytest.approx(losses(tmp_path / "plain"), rel=1e-6)
    assert not (tmp_path / "ac" / "checkpoints").exists()  # --checkpoint-every -1: none at all


def test_tokens_budget_sets_the_number_of_steps(prepared, tmp_path):
    s = train(TrainConfig(**TINY, tokens=200, grad_accum=2, data=str(prepared), output_dir=str(tmp_path / "t"),
                          save_model=False, checkpoint_every=-1))
    assert s["total_steps"] == 2 and s["tokens"] == 2 * 2 * 2 * 32  # ceil(200 / 128) steps of 128 tokens


def test_help_lists_every_option_with_its_default(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert main(["--study", "--help"]) == 0
    with_study = capsys.readouterr().out
    for f in ftrain.dataclasses.fields(TrainConfig):
        name = flag(f.name) if f.name != "model_overrides" else "--model-override"
        assert name in with_study and (name in text) is (ftrain.section_of(f) != ftrain.STUDY)
    # layout options default to "auto" (fp8lab.plan.layout): the help says what it does, the run says what it chose
    assert 'sequences per GPU per forward/backward; auto: the largest that fits (default: "auto")' in " ".join(text.split())


def test_only_the_newest_checkpoints_are_kept_and_partial_ones_ignored(prepared, tmp_path):
    out = tmp_path / "k"
    cfg = dict(**TINY, checkpoint_every=2, keep_checkpoints=2, data=str(prepared), output_dir=str(out), save_model=False)
    train(TrainConfig(**cfg, steps=6))
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith(".")) == ["step_00000004", "step_00000006"]
    # a save killed mid-write leaves step_N.tmp: never resumed from, removed at the next start
    shutil.copytree(out / "checkpoints" / "step_00000006", out / "checkpoints" / "step_00000008.tmp")
    s = train(TrainConfig(**cfg, steps=8, resume_with_new_settings=True))  # a longer run: asked for explicitly
    assert s["resumed_from_step"] == 6
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith(".")) == ["step_00000006", "step_00000008"]


def test_single_process_gets_fused_adamw_even_with_parallel_fsdp():
    """--parallel fsdp only shards under torchrun; one process must not get foreach AdamW (slower, and
    its full-size temporaries ran llama-7b out of memory on one H200)."""
    import torch

    from fp8lab.train.optim import make_optimizer

    c = TrainConfig(model="llama-tiny", parallel="fsdp")
    params = [torch.nn.Parameter(torch.zeros(4, 4)), torch.nn.Parameter(torch.zeros(4))]
    one = make_optimizer(params, c, torch.device("cuda"))
    many = make_optimizer(params, c, torch.device("cuda"), sharded=True)
    assert one.defaults["fused"] is True and not one.defaults.get("foreach")
    assert many.defaults["foreach"] is True and not many.defaults.get("fused")
    assert [len(g["params"]) for g in one.param_groups] == [1, 1]  # decay on matrices only
