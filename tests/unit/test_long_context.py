"""Sequences past a named shape's max_seq_len, --fp8-attention's plan decision, the layout at 4K-16K."""
from __future__ import annotations

import pytest

from fp8lab.analysis import long_context
from fp8lab.plan import fp8attn
from fp8lab.plan.config import TrainConfig
from fp8lab.core.hardware import Machine
from fp8lab.core.paths import REPO_ROOT
from fp8lab.plan.evidence import Evidence
from fp8lab.plan.runplan import plan_run
from fp8lab.fp8.recipe import Recipe

H200 = Machine.planned("H200", 1, fp8=True)
H100 = Machine.planned("H100 80GB", 1, fp8=True)
CPU = Machine("cpu", "cpu", 64.0)
# a Llama-3.2-3B shape (head_dim 128, GQA 24/8, 128K vocabulary, tied), plain RoPE, as the study trains it
SHAPE_3B = dict(hidden_size=3072, intermediate_size=8192, num_layers=28, num_heads=24, num_kv_heads=8,
                vocab_size=128256, tie_embeddings=True, rope_theta=500000.0)


MEASURED = Evidence(fp8_attention_crossover=8192, fp8_attention_loss=True)
CROSSOVER = MEASURED.fp8_attention_crossover


def _plan(machine=H200, evidence=MEASURED, **kw):
    kw = {"model": "llama-1b", "precision": "fp8", "backend": "te", **kw}
    return plan_run(TrainConfig(**kw), machine, evidence)


# ------------------------------------------------------------------------------ sequence length

def test_a_named_llama_shape_trains_longer_sequences_from_scratch_and_says_so():
    p = _plan(seq_len=8192)
    assert p.seq_len == 8192 and p.config.shape_overrides == {"max_seq_len": 8192}
    assert p.reasons["max_seq_len"] == ("llama-1b at 8192: trained from scratch, max_seq_len raised from 2048 "
                                        "(RoPE has no learned position table: nothing else changes)")
    assert "max_seq_len" not in _plan(seq_len=2048).reasons


def test_an_explicit_max_seq_len_and_gptneo_position_tables_still_limit_the_sequence():
    with pytest.raises(ValueError, match=r"--seq-len=4096 is invalid; allowed: at most 1024 for llama-1b \(its --model-override max_seq_len\)"):
        TrainConfig(model="llama-1b", seq_len=4096, model_overrides={"max_seq_len": 1024})
    with pytest.raises(ValueError, match=r"at most 2048 for gptneo-125m \(its learned position table has 2048 rows; .*--model-override max_seq_len=N"):
        TrainConfig(model="gptneo-125m", seq_len=4096)
    assert TrainConfig(model="gptneo-125m", seq_len=4096, model_overrides={"max_seq_len": 4096}).seq_len == 4096


def test_a_user_model_folder_is_limited_to_its_max_position_embeddings(tmp_path):
    import json

    cfg = json.loads(open("data/reference/configs/llama-3.2-1b/config.json").read())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    limit = cfg["max_position_embeddings"]
    assert TrainConfig(model=str(tmp_path), seq_len=limit).shape_overrides == {}
    with pytest.raises(ValueError, match=rf"at most {limit} .*its max_position_embeddings"):
        TrainConfig(model=str(tmp_path), seq_len=limit + 1)


# ------------------------------------------------------------------------------ FP8 attention

def test_auto_waits_for_the_loss_check_before_turning_fp8_attention_on():
    """Past the measured crossover, auto stays off until a committed loss check holds, and says so."""
    off = _plan(seq_len=CROSSOVER, model_overrides=SHAPE_3B, evidence=Evidence(fp8_attention_crossover=CROSSOVER))
    assert not off.fp8_attention and "its loss check is not committed yet (pass --fp8-attention on" in off.reasons["fp8_attention"]
    failed = Evidence(fp8_attention_crossover=CROSSOVER, fp8_attention_loss=False)
    off = _plan(seq_len=CROSSOVER, model_overrides=SHAPE_3B, evidence=failed)
    assert not off.fp8_attention and "its committed loss check is outside the bound" in off.reasons["fp8_attention"]


def test_auto_turns_fp8_attention_on_from_the_crossover_for_head_dim_128_on_hopper():
    short = _plan(seq_len=CROSSOVER // 2, model_overrides=SHAPE_3B)
    long = _plan(seq_len=CROSSOVER, model_overrides=SHAPE_3B)
    assert not short.fp8_attention and short.reasons["fp8_attention"].startswith(f"auto: off at sequence {CROSSOVER // 2}")
    assert long.fp8_attention and long.recipe == Recipe(fp8_attention=True)
    assert long.reasons["fp8_attention"].startswith(f"auto: on at sequence {CROSSOVER} >= ")
    assert "measured: long-context-h200" in long.reasons["fp8_attention"]
    assert long.decisions()["fp8_attention"] is True and long.decisions()["recipe"].endswith(", FP8 attention")
    assert long.record()["reasons"]["fp8_attention"] == long.reasons["fp8_attention"]
    later = _plan(seq_len=CROSSOVER, model_overrides=SHAPE_3B,  # the crossover is the evidence's
                  evidence=Evidence(fp8_attention_crossover=2 * CROSSOVER, fp8_attention_loss=True))
    assert not later.fp8_attention and f"pays from {2 * CROSSOVER} tokens" in later.reasons["fp8_attention"]
    provisional = _plan(seq_len=CROSSOVER, model_overrides=SHAPE_3B, evidence=Evidence(fp8_attention_loss=True))
    assert provisional.fp8_attention and "provisional" in provisional.reasons["fp8_attention"]


@pytest.mark.parametrize("kw,machine,why", [
    ({}, H200, "head_dim 64: TE's FP8 attention on Hopper needs head_dim exactly 128"),
    ({"model_overrides": SHAPE_3B, "recipe": "current"}, H200, "--recipe current: TE's FP8 attention on Hopper needs recipe delayed"),
    ({"model_overrides": SHAPE_3B, "fuse": False}, H200, "it needs --fuse True"),
    ({"model_overrides": SHAPE_3B, "backend": "emulated", "seq_len": 256}, CPU, "it needs --backend te"),
    ({"model_overrides": SHAPE_3B, "precision": "bf16"}, H200, "it needs --precision fp8"),
    ({"model_overrides": SHAPE_3B}, Machine.planned("A100 80GB", 1, fp8=False), "A100 80GB has no FP8 fused attention in TE"),
])
def test_on_is_refused_where_it_cannot_run_and_auto_says_why_it_is_off(kw, machine, why):
    kw = {"seq_len": 8192, **kw}
    if machine.fp8 or kw.get("precision") == "bf16" or kw.get("backend") == "emulated":
        p = _plan(machine, **kw)
        assert not p.fp8_attention and p.reasons["fp8_attention"].startswith(f"auto: off, {why}")
    with pytest.raises(ValueError, match=r"--fp8-attention on cannot run: .*allowed: auto \| off"):
        _plan(machine, fp8_attention="on", **kw)


def test_off_and_an_unmeasured_gpu_keep_bf16_attention():
    assert _plan(seq_len=8192, model_overrides=SHAPE_3B, fp8_attention="off").reasons["fp8_attention"] == "--fp8-attention off"
    b200 = Machine.planned("B200", 1, fp8=True)
    p = _plan(b200, seq_len=8192, model_overrides=SHAPE_3B)
    assert not p.fp8_attention and "not measured on Blackwell" in p.reasons["fp8_attention"]
    assert _plan(b200, seq_len=8192, model_overrides=SHAPE_3B, fp8_attention="on").fp8_attention


def test_the_option_is_in_the_schema_and_refuses_other_values():
    with pytest.raises(ValueError, match=r"--fp8-attention='maybe' is invalid; allowed: auto \| on \| off"):
        TrainConfig(fp8_attention="maybe")


def test_the_crossover_is_the_committed_study_result(tmp_path):
    import json

    from fp8lab.core.paths import RESULTS_DIR
    from fp8lab.plan import evidence

    measured = json.loads((RESULTS_DIR / evidence.FP8_ATTENTION_STUDY / "crossover.json").read_text())
    assert evidence.load().fp8_attention_crossover == measured["crossover_seq_len"] == fp8attn.CROSSOVER_SEQ_LEN
    (tmp_path / evidence.FP8_ATTENTION_STUDY).mkdir()
    (tmp_path / evidence.FP8_ATTENTION_STUDY / "crossover.json").write_text('{"crossover_seq_len": 4096}')
    assert evidence.from_results(tmp_path)["fp8_attention"]["crossover_seq_len"] == 4096
    assert evidence.from_results(tmp_path / "none")["fp8_attention"]["crossover_seq_len"] is None


def test_the_recipe_carries_fp8_attention_and_refuses_non_bools():
    assert Recipe(fp8_attention=True) != Recipe() and "FP8 attention" not in Recipe().describe()
    with pytest.raises(ValueError, match="Recipe.fp8_attention must be True or False"):
        Recipe(fp8_attention="yes")


# ------------------------------------------------------------------------------ the layout at 4K-16K

@pytest.mark.parametrize("seq", [4096, 8192, 16384])
@pytest.mark.parametrize("model,overrides", [("llama-1b", {}), ("llama-1b", SHAPE_3B), ("llama-7b", {})])
def test_the_layout_sizes_long_sequences_on_an_h200(model, overrides, seq):
    p = _plan(model=model, model_overrides=overrides, seq_len=seq, precision="bf16")
    lay = p.layout
    assert lay.seq_len == seq and lay.memory.peak <= H200.memory_gib - 5
    assert lay.micro_batch_size * seq <= 32_768
    # the plan is the same for the FP8 run of the pair: one layout, one recompute decision
    f = _plan(model=model, model_overrides=overrides, seq_len=seq).layout
    assert (f.micro_batch_size, f.grad_accum, f.activation_checkpointing) == (
        lay.micro_batch_size, lay.grad_accum, lay.activation_checkpointing)
    if lay.activation_checkpointing:
        assert lay.micro_batch_size == 1 or "activation_checkpointing" in lay.reasons
        assert "activation checkpointing" in lay.header()


def test_llama_7b_at_8k_fits_an_h200_only_with_activation_checkpointing():
    lay = _plan(model="llama-7b", seq_len=8192).layout
    assert lay.activation_checkpointing and "fits H200 only recomputing each block" in lay.reasons["activation_checkpointing"]
    assert not _plan(model="llama-7b", seq_len=4096).layout.activation_checkpointing
    with pytest.raises(ValueError, match="does not fit H200 .* even at micro-batch 1 x 8192: "):
        _plan(model="llama-7b", seq_len=8192, activation_checkpointing=False)


def test_memory_grows_with_the_sequence_at_a_fixed_micro_batch():
    from fp8lab.plan.layout import estimate_memory
    from fp8lab.model.models import get_config

    acts = [estimate_memory(get_config("llama-1b", **SHAPE_3B), precision="fp8", micro_batch_size=1, seq_len=s).activations
            for s in (4096, 8192, 16384)]
    assert acts[1] == pytest.approx(2 * acts[0]) and acts[2] == pytest.approx(2 * acts[1])  # flash/cuDNN attention: O(seq)


@pytest.mark.parametrize("seq", [4096, 8192, 16384])
def test_the_layout_on_an_h100(seq):
    assert _plan(H100, seq_len=seq).layout.memory.peak <= H100.memory_gib - 5
    with pytest.raises(ValueError, match=r"llama-7b does not fit H100 80GB .* with activation checkpointing: .*--parallel fsdp"):
        _plan(H100, model="llama-7b", seq_len=seq)  # its model states alone (100 GiB) exceed the GPU
    if seq < 16384:
        p = _plan(H100, model_overrides=SHAPE_3B, seq_len=seq)
        assert p.layout.memory.peak <= H100.memory_gib - 5
        # below the measured crossover (8192): off, saying why; from it on, on (the committed loss check holds:
        # test_the_committed_loss_check_is_what_auto_reads)
        state = "on" if seq >= CROSSOVER else "off"
        assert p.fp8_attention is (state == "on") and p.reasons["fp8_attention"].startswith(f"auto: {state} at sequence {seq}")
        assert p.layout.activation_checkpointing == (seq == 8192)
    else:  # 16K x 128K-vocabulary logits (~30 GiB) stay whatever the blocks recompute, unless the loss is chunked
        with pytest.raises(ValueError, match=r"even at micro-batch 1 x 16384 with activation checkpointing"):
            _plan(H100, model_overrides=SHAPE_3B, seq_len=seq, fused_loss="off")
        p = _plan(H100, model_overrides=SHAPE_3B, seq_len=seq)  # auto: the fused loss makes it fit
        assert p.fused_loss and p.layout.memory.peak <= H100.memory_gib - 5


# ------------------------------------------------------------------------------ the study's figure and summaries

# fixture tokens/s/GPU (made up for the test, not measurements): bf16, fp8, fp8 + FP8 attention per length
FIXTURE_TPS = {2048: (100.0, 140.0, 135.0), 4096: (90.0, 126.0, 130.5), 8192: (80.0, 104.0, 118.4), 16384: (60.0, 81.0, 88.2)}


def _write_study(folder, tps=FIXTURE_TPS, tag="3b", model="llama-1b", val_loss=None):
    from fp8lab.analysis import write_result_file

    for seq, values in tps.items():
        for variant, t in zip(long_context.ROLES, values):
            run = {"run_id": f"{model}-{variant}-{tag}-s{seq}", "variant": f"{variant}-{tag}-s{seq}", "model": model,
                   "precision": "bf16" if variant.endswith("bf16") else "fp8", "gpu_name": "NVIDIA H200",
                   "world_size": 1, "command": "fixture", "date": "2026-12-01T00:00:00Z", "versions": {}}
            steps = [{"step": i, "loss": 5.0 - 0.01 * i + (0.001 if variant == "default-fp8-attn" else 0.0)} for i in range(1, 41)]
            summary = {"tokens_per_sec_per_gpu": t, **({"val_loss": val_loss[variant]} if val_loss else {})}
            write_result_file(folder / f"{run['run_id']}.jsonl", run, steps, summary)


def _long_context_script():
    """benchmarks/long_context.py as a module (the study's summaries: crossover, loss)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("long_context", REPO_ROOT / "benchmarks" / "long_context.py")
    lc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lc)
    return lc


def test_the_long_context_figure_draws_one_bar_per_length_and_fp8_role(tmp_path):
    from fp8lab.views import plots

    _write_study(tmp_path)
    table = long_context.speedup_table(tmp_path)
    assert len(table) == 8 and set(table["role"]) == {"fp8", "fp8_attn"}
    fig = plots.long_context_figure(table)
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 3) for p in ax.patches)
    expected = sorted(round(v[i] / v[0], 3) for v in FIXTURE_TPS.values() for i in (1, 2))
    assert heights == expected
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2K", "4K", "8K", "16K"]
    labels = {t.get_text() for t in ax.texts}
    assert "1.48x" in labels and "1.30x" in labels  # 118.4 / 80, 104 / 80
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["FP8 GEMMs, BF16 attention", "FP8 GEMMs + FP8 attention"]


def test_without_the_study_the_figure_says_so(tmp_path):
    from fp8lab.views import plots

    fig = plots.long_context_figure(long_context.speedup_table(tmp_path / "absent"))
    assert "no long-context study committed yet" in " ".join(t.get_text() for t in fig.axes[0].texts)


def test_the_study_summaries_find_the_crossover_and_the_loss_gap(tmp_path):
    lc = _long_context_script()
    _write_study(tmp_path)
    assert lc.crossover(tmp_path, ["crossover", "x"])["crossover_seq_len"] == 4096  # 130.5 > 126 from 4K on
    _write_study(tmp_path, {4096: (0.0, 1.0, 1.0)}, tag="loss")
    loss = lc.loss(tmp_path, ["loss", "x"])["runs_by_role"]
    assert loss["fp8"]["relative_to_fp8"] == 0.0
    assert loss["fp8_attn"]["relative_to_fp8"] == pytest.approx(0.001 / (5.0 - 0.01 * 35.5))


# ------------------------------------------------------------------------------ the run's first lines and record

def test_a_run_past_max_seq_len_says_so_and_records_its_decisions(prepared, tmp_path, capsys):
    import json

    from fp8lab.train.entry import train

    out = tmp_path / "run"
    train(TrainConfig(model="llama-tiny", seq_len=512, micro_batch_size=1, steps=1, precision="fp8", backend="emulated",
                      fp8_attention="off", data=str(prepared), output_dir=str(out), progress="off", print_metrics=False,
                      plot=False, save_model=False, checkpoint_every=-1))
    head = capsys.readouterr().out.splitlines()[:6]
    assert "fp8lab: llama-tiny at 512: trained from scratch, max_seq_len raised from 256" in "\n".join(head)
    assert "fp8lab: FP8 attention off: --fp8-attention off" in head
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["fp8_attention"] == "off" and cfg["activation_checkpointing"] is False and cfg["seq_len"] == 512
    # a layout decision like the others: what was asked beside it, and the plan's value
    assert cfg["requested"]["activation_checkpointing"] == "auto" and cfg["plan"]["activation_checkpointing"] is False
    assert cfg["plan"]["fp8_attention"] is False and cfg["plan"]["reasons"]["fp8_attention"] == "--fp8-attention off"
    assert cfg["plan"]["reasons"]["max_seq_len"].startswith("llama-tiny at 512")


def test_a_p5_job_plans_long_sequences_and_refuses_fp8_attention_it_cannot_run():
    from fp8lab import launch as L

    base = dict(role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, tokens=10**9, precision="fp8")
    spec = L.JobSpec(model="llama-1b", seq_len=8192, **base)
    assert spec.plan.seq_len == 8192 and spec.plan.reasons["max_seq_len"].startswith("llama-1b at 8192: trained from scratch")
    assert L.hyperparameters(spec)["seq-len"] == 8192
    with pytest.raises(ValueError, match=r"--fp8-attention on cannot run: head_dim 64: .*allowed: auto \| off"):
        L.JobSpec(model="llama-1b", seq_len=8192, options={"fp8_attention": "on"}, **base)
    with pytest.raises(ValueError, match=r"--fp8-attention='sometimes' is invalid; allowed: auto \| on \| off"):
        L.JobSpec(model="llama-1b", options={"fp8_attention": "sometimes"}, **base)


def test_the_study_reader_names_a_corrupt_result_file_and_line(tmp_path):
    from fp8lab.analysis import RunFileError

    _write_study(tmp_path, {2048: FIXTURE_TPS[2048]})
    bad = sorted(tmp_path.glob("*.jsonl"))[0]
    lines = bad.read_text().splitlines()
    bad.write_text("\n".join([lines[0], "{not json"] + lines[1:]) + "\n")
    with pytest.raises(RunFileError, match=rf"{bad.name}: line 2 is not valid JSON"):
        long_context.study_runs(tmp_path)


def test_the_committed_loss_check_is_what_auto_reads():
    """The study's loss check (benchmarks/long_context.py loss): the chosen backward's gap, the seed noise, and
    whether it holds, as --fp8-attention auto reads it."""
    import json

    check = json.loads((long_context.STUDY_DIR / "loss.json").read_text())
    assert check["chosen_nvte_fp8_dpa_bwd"] == fp8attn.FP8_DPA_BWD and check["runs_tag"] == "loss450"
    gap, noise, rows = check["fp8_attention_gap"], check["seed_noise"], check["runs_by_role"]
    pairs = [rows["fp8_attn"]["loss"] / rows["fp8"]["loss"] - 1, rows["fp8_attn_seed"]["loss"] / rows["fp8_seed"]["loss"] - 1]
    assert gap == pytest.approx(sum(pairs) / 2) and sorted(check["gap_by_pair"].values()) == pytest.approx(sorted(pairs))
    assert noise > 0
    assert check["within_bound"] is (abs(gap) <= 0.005) and check["holds"] is (abs(gap) <= max(0.005, noise))
    from fp8lab.plan import evidence

    assert evidence.load().fp8_attention_loss is check["holds"]
    assert {r["steps"] for r in check["runs_by_role"].values()} == {450}
    assert check["runs_by_role"]["fp8_seed"]["seed"] != check["runs_by_role"]["fp8"]["seed"]


def test_a_loss_check_that_fails_its_band_leaves_auto_off(tmp_path):
    from fp8lab.plan import evidence

    (tmp_path / evidence.FP8_ATTENTION_STUDY).mkdir()
    f = tmp_path / evidence.FP8_ATTENTION_STUDY / "loss.json"
    f.write_text('{"within_bound": false, "holds": false, "bound": 0.005}')
    assert evidence.from_results(tmp_path)["fp8_attention"]["loss_holds"] is False
    f.write_text('{"within_bound": false, "holds": true, "bound": 0.005}')
    assert evidence.from_results(tmp_path)["fp8_attention"]["loss_holds"] is True
    f.write_text('{"within_bound": true, "bound": 0.005}')  # an earlier file without "holds": the bound alone
    assert evidence.from_results(tmp_path)["fp8_attention"]["loss_holds"] is True
    assert evidence.from_results(tmp_path / "none")["fp8_attention"]["loss_holds"] is None


def test_the_figure_has_one_panel_per_model(tmp_path):
    from fp8lab.views import plots

    _write_study(tmp_path)
    _write_study(tmp_path, {8192: (50.0, 70.0, 75.0)}, tag="7b", model="llama-7b")
    table = long_context.speedup_table(tmp_path)
    assert list(dict.fromkeys(table["model"])) == ["llama-1b", "llama-7b"]
    fig = plots.long_context_figure(table)
    assert len(fig.axes) == 2 and fig.axes[1].get_title().startswith("llama-7b on NVIDIA H200")
    assert sorted(round(b.get_height(), 3) for b in fig.axes[1].patches) == [1.4, 1.5]
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == ["8K"]


def test_the_loss_summary_reads_validation_loss_and_the_seed_noise(tmp_path):
    lc = _long_context_script()
    val = {"default-bf16": 4.5, "default-fp8-noattn": 4.0, "default-fp8-attn": 4.04}  # FP8 attention +1.0%
    _write_study(tmp_path, {4096: (0.0, 1.0, 1.0)}, tag="loss160", val_loss=val)
    out = lc.loss(tmp_path, ["loss", "x"])
    assert out["runs_tag"] == "loss160" and out["metric"].startswith("final validation loss")
    assert out["fp8_attention_gap"] == pytest.approx(0.01) and out["seed_noise"] is None
    assert out["within_bound"] is False and out["holds"] is False  # no seed noise measured: the 0.5% bound alone
    _write_study(tmp_path, {4096: (0.0, 1.0, 1.0)}, tag="loss160-seed",  # the other seed: 2% apart, FP8 attention +1%
                 val_loss={**val, "default-fp8-noattn": 3.92, "default-fp8-attn": 3.92 * 1.01})
    out = lc.loss(tmp_path, ["loss", "x"])
    assert out["seed_noise"] == pytest.approx(0.02) and out["within_bound"] is False and out["holds"] is True


def test_the_loss_gap_is_the_mean_of_the_same_seed_pairs(tmp_path):
    """With FP8 attention run at both seeds, the gap is the mean of the two same-seed pairs (each kept), not the
    second seed's FP8-attention run against the first seed's FP8 run."""
    lc = _long_context_script()
    _write_study(tmp_path, {4096: (0.0, 1.0, 1.0)}, tag="loss450",
                 val_loss={"default-bf16": 3.0, "default-fp8-noattn": 2.0, "default-fp8-attn": 2.0 * 1.002})
    _write_study(tmp_path, {4096: (0.0, 1.0, 1.0)}, tag="loss450-seed",
                 val_loss={"default-bf16": 3.0, "default-fp8-noattn": 2.02, "default-fp8-attn": 2.02 * 0.994})
    out = lc.loss(tmp_path, ["loss", "x"])
    assert out["runs_tag"] == "loss450"
    assert sorted(out["gap_by_pair"].values()) == pytest.approx([-0.006, 0.002])
    assert out["fp8_attention_gap"] == pytest.approx(-0.002) and out["seed_noise"] == pytest.approx(0.01)
    assert out["within_bound"] is True and out["holds"] is True
    # the pair alone at the second seed would be outside the bound: the mean, not the larger pair, is the check
    assert abs(out["gap_by_pair"]["fp8_seed"]) > out["bound"]


def test_the_loss_summary_refuses_unlike_or_non_finite_losses(tmp_path):
    lc = _long_context_script()
    _write_study(tmp_path, {4096: (0.0, 1.0, 1.0)}, tag="loss160", val_loss={"default-bf16": 4.5, "default-fp8-noattn": 4.0,
                                                                            "default-fp8-attn": float("nan")})
    with pytest.raises(SystemExit, match="fp8_attn have no finite loss"):
        lc.loss(tmp_path, ["loss", "x"])
    _write_study(tmp_path, {4096: (0.0, 1.0, 1.0)}, tag="loss160")  # now without validation losses ...
    _write_study(tmp_path, {4096: (0.0, 1.0, 1.0)}, tag="loss160-seed", val_loss={"default-bf16": 4.5,
                                                                                 "default-fp8-noattn": 4.0,
                                                                                 "default-fp8-attn": 4.0})
    with pytest.raises(SystemExit, match="measured different losses"):  # ... beside a seed run with one
        lc.loss(tmp_path, ["loss", "x"])
