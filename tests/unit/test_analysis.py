"""fp8lab.analysis: loading runs (good, partial, corrupt), summaries with known answers,
BF16-vs-FP8 comparison, cost, scaling and the generated verdict.

The helpers at the top build realistic run files (trainer output folders and result files);
test_plots, test_report and test_notebook_05 import them.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fp8lab import analysis
from fp8lab.core.paths import RESULTS_DIR

from fake_runs import GPU, bench as _bench, make_pair, make_trainer_run, run_meta, step_records  # noqa: F401


# ------------------------------------------------------------------------------------ loading

def test_trainer_folder_loads_steps_with_metadata_from_config(tmp_path):
    make_trainer_run(tmp_path, "run-a", "fp8", 1000.0, n=12)
    df = analysis.load_runs(tmp_path / "run-a")
    assert len(df) == 12 and set(df["record"]) == {"step"}
    assert list(df.columns[: len(analysis.COLUMNS)]) == analysis.COLUMNS
    row = df.iloc[0]
    assert row["run_id"] == "run-a" and row["model"] == "llama-1b" and row["precision"] == "fp8"
    assert row["micro_batch_size"] == 4 and row["grad_accum"] == 2 and row["seq_len"] == 512  # from config.json
    assert row["gpu_name"] == GPU and row["world_size"] == 1 and row["instances"] == 1
    assert row["variant"] == "fp8 te delayed"
    assert not Path(row["source"]).is_absolute()  # no machine paths in tables
    assert df["step"].tolist() == list(range(1, 13))


def test_result_file_with_steps_and_summary_and_summary_only(tmp_path):
    study = tmp_path / "throughput"
    analysis.write_result_file(study / "a.jsonl", run_meta("llama-1b", "bf16"), step_records(5, 900.0, "bf16"))
    analysis.write_result_file(study / "b.jsonl", run_meta("llama-1b", "fp8", run_id="fp8-bench"),
                               summary={"tokens_per_sec_per_gpu": 1200.0, "tokens_per_sec_per_gpu_p25": 1190.0,
                                        "tokens_per_sec_per_gpu_p75": 1210.0, "mfu": 0.5, "max_mem_gib": 40.0,
                                        "tokens": 20480, "timed_steps": 50})
    trainer = make_trainer_run(tmp_path / "local", "bf16-local", "bf16", 500.0, n=3)
    (trainer / "checkpoints").mkdir()
    (trainer / "checkpoints" / "state.jsonl").write_text('{"not": "a result file"}\n')  # ignored: inside a run folder
    df = analysis.load_runs(tmp_path)  # a folder: searched recursively
    assert set(df.loc[df["run_id"] == "bf16-local", "study"]) == {"local"}
    df = df[df["run_id"] != "bf16-local"]
    assert sorted(df["run_id"].unique()) == ["a", "fp8-bench"]
    assert (df.loc[df["run_id"] == "a", "record"] == "step").sum() == 5
    summ = df[df["run_id"] == "fp8-bench"]
    assert summ["record"].tolist() == ["summary"] and summ["study"].iloc[0] == "throughput"
    assert summ["tokens_per_sec_per_gpu"].iloc[0] == 1200.0 and summ["tokens_per_sec_per_gpu_p25"].iloc[0] == 1190.0
    # provenance of the run record: versions flattened, command and date kept on every row
    assert set(df["torch"]) == {"2.x"} and set(df["command"]) == {"python benchmarks/x.py"}
    assert set(df["date"]) == {"2026-11-29T20:00:00Z"}
    s = analysis.summarize_runs(df, warmup_steps=0).set_index("run_id")
    assert s.loc["fp8-bench", "tokens_per_sec_per_gpu"] == 1200.0
    assert s.loc["fp8-bench", "tps_iqr"] == pytest.approx(20.0)
    assert s.loc["fp8-bench", "throughput_from"] == "benchmark summary record"
    assert s.loc["a", "tokens_per_sec_per_gpu"] == 900.0


def test_summary_with_min_max_of_repeats_only(tmp_path):
    analysis.write_result_file(tmp_path / "r.jsonl", run_meta("llama-7b", "fp8"),
                               summary={"tokens_per_sec_per_gpu": 500.0, "tokens_per_sec_per_gpu_min": 490.0,
                                        "tokens_per_sec_per_gpu_max": 520.0, "repeats": 3})
    s = analysis.summarize_runs(analysis.load_runs(tmp_path)).iloc[0]
    assert s["tps_iqr"] == 30.0 and s["tps_spread_pct"] == pytest.approx(6.0)
    assert s["throughput_from"] == "benchmark summary record (spread: min-max of repeats)"


def test_truncated_last_line_is_read_up_to_last_complete_line_with_warning(tmp_path):
    d = make_trainer_run(tmp_path, "live", "bf16", 1000.0, n=8)
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "tokens": 36864, "lo')  # the trainer is mid-write
    with pytest.warns(analysis.RunFileWarning, match=r"metrics.jsonl: line 9 is incomplete"):
        df = analysis.load_runs(d)
    assert df["step"].max() == 8 and len(df) == 8


@pytest.mark.parametrize("bad, match", [
    ('{"step": 3, "loss": }\n', r"a\.jsonl: line 3 is not valid JSON"),
    ('[1, 2]\n', r"a\.jsonl: line 3 is not a JSON object"),
    ('{"record": "step", "loss": 1.0}\n', r"a\.jsonl: line 3 has no 'step' key"),
    ('{"record": "metrics", "step": 3}\n', r"a\.jsonl: line 3 has record='metrics'; allowed after line 1: 'step', 'summary'"),
])
def test_corrupt_result_file_names_file_and_line(tmp_path, bad, match):
    p = analysis.write_result_file(tmp_path / "a.jsonl", run_meta("llama-1b", "bf16"), step_records(1, 1.0, "bf16"))
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines) + bad + json.dumps({"record": "step", "step": 4}) + "\n")
    with pytest.raises(analysis.RunFileError, match=match):
        analysis.load_runs(p)


def test_corrupt_line_in_the_middle_of_metrics_is_an_error_not_a_warning(tmp_path):
    d = make_trainer_run(tmp_path, "r", "bf16", 1000.0, n=3)
    text = (d / "metrics.jsonl").read_text().splitlines()
    text[1] = text[1][:20]
    (d / "metrics.jsonl").write_text("\n".join(text) + "\n")
    with pytest.raises(analysis.RunFileError, match=r"metrics\.jsonl: line 2 is not valid JSON"):
        analysis.load_runs(d)


def test_result_file_must_start_with_run_record(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"record": "step", "step": 1}) + "\n")
    with pytest.raises(analysis.RunFileError, match=r"x\.jsonl: line 1 must be the run record"):
        analysis.load_runs(p)


def test_missing_source_and_wrong_type_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        analysis.load_runs(tmp_path / "nope")
    with pytest.raises(ValueError, match="sources"):
        analysis.load_runs([42])
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"expected a \.jsonl or \.csv file, or a folder"):
        analysis.load_runs(tmp_path / "notes.txt")


def test_validation_record_for_the_same_step_is_merged(tmp_path):
    d = make_trainer_run(tmp_path, "v", "bf16", 1000.0, n=4)
    with open(d / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "val_loss": 3.25}) + "\n")
    df = analysis.load_runs(d)
    assert len(df) == 4
    last = df[df["step"] == 4].iloc[0]
    assert last["val_loss"] == 3.25 and last["loss"] == pytest.approx(10 / 4 ** 0.1)


def test_collect_table_is_accepted_and_checked():
    recs = step_records(6, 800.0, "fp8")
    table = pd.DataFrame([{**r, "job_name": "fp8lab-llama-1b-fp8-2x", "instance_count": 2, "world_size": 16} for r in recs])
    df = analysis.load_runs(table)
    assert set(df["run_id"]) == {"fp8lab-llama-1b-fp8-2x"}
    assert set(df["instances"]) == {2} and set(df["world_size"]) == {16} and len(df) == 6
    with pytest.raises(ValueError, match="job_name"):
        analysis.load_runs(table.drop(columns=["job_name"]))


def test_table_shaped_like_launch_collect_output():
    """launch.collect names the job column 'job' and adds 'source' and 'instance_count'."""
    recs = step_records(4, 700.0, "bf16")
    table = pd.DataFrame([{"job": "fp8lab-llama-1b-bf16-1x", **r, "instance_count": 1, "source": "s3:output.tar.gz"}
                          for r in recs])
    df = analysis.load_runs(table)
    assert set(df["run_id"]) == {"fp8lab-llama-1b-bf16-1x"} and set(df["source"]) == {"s3:output.tar.gz"}


def test_collect_csv_file_is_a_source(tmp_path):
    recs = step_records(4, 700.0, "fp8")
    pd.DataFrame([{"job": "j1", **r, "instance_count": 2} for r in recs]).to_csv(tmp_path / "jobs.csv", index=False)
    df = analysis.load_runs(tmp_path / "jobs.csv")
    assert set(df["run_id"]) == {"j1"} and set(df["instances"]) == {2} and df["step"].tolist() == [1, 2, 3, 4]
    pd.DataFrame({"x": [1]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match=r"bad\.csv: sources: the collect table lacks column\(s\) step"):
        analysis.load_runs(tmp_path / "bad.csv")


def test_default_price_is_the_one_the_launch_helper_uses():
    launch = pytest.importorskip("fp8lab.launch")
    assert analysis.DEFAULT_PRICE_PER_INSTANCE_HOUR == launch.DEFAULT_PRICES_USD_PER_HOUR["ml.p5.48xlarge"]


def test_same_folder_name_in_two_places_keeps_runs_apart(tmp_path):
    make_trainer_run(tmp_path / "a", "bf16", "bf16", 1000.0, n=3)
    make_trainer_run(tmp_path / "b", "bf16", "bf16", 2000.0, n=3)
    df = analysis.load_runs([tmp_path / "a" / "bf16", tmp_path / "b" / "bf16"])
    assert df["run_id"].nunique() == 2


def test_empty_sources_give_an_empty_table_with_all_columns(tmp_path):
    df = analysis.load_runs(tmp_path)
    assert len(df) == 0 and list(df.columns) == analysis.COLUMNS
    assert "No measured runs yet" in analysis.describe(df)
    s = analysis.summarize_runs(df)
    assert len(s) == 0 and len(analysis.compare_precisions(s)) == 0


def test_committed_result_files_load_and_carry_provenance():
    """Whatever GPU results are committed in data/results/ must follow the README's format."""
    files = [p for p in RESULTS_DIR.rglob("*.jsonl") if not any(x.startswith(".") for x in p.parts)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", analysis.RunFileWarning)  # committed files must be complete
        df = analysis.load_runs()
    assert df["run_id"].nunique() == len(files)
    for p in files:
        first = json.loads(p.read_text().splitlines()[0])
        missing = [k for k in analysis.RUN_RECORD_REQUIRED if k not in first]
        assert not missing, f"{p.name}: run record lacks {missing}"


def test_write_result_file_checks_its_input(tmp_path):
    with pytest.raises(ValueError, match="run: missing key"):
        analysis.write_result_file(tmp_path / "a.jsonl", {"model": "x"}, step_records(1, 1.0, "bf16"))
    with pytest.raises(ValueError, match="steps/summary"):
        analysis.write_result_file(tmp_path / "a.jsonl", run_meta("x", "bf16"))
    assert not (tmp_path / "a.jsonl").exists()


def test_reference_holds_the_source_headline_figures():
    ref = analysis.load_reference().set_index("model_size")
    assert ref.loc["1B", "speedup"] == 1.13 and ref.loc["7B", "speedup"] == 1.18
    assert ref.loc["1B", "loss_gap_pct"] == 3.0 and ref.loc["7B", "loss_gap_pct"] == 2.0
    assert set(ref["label"]) == {"reported by the source, not measured here"}
    assert set(ref["tokens"]) == {24e9}


def test_model_size_parsing():
    assert analysis.model_size_b("llama-1b") == 1.0
    assert analysis.model_size_b("gptneo-1.3b") == 1.3
    assert analysis.model_size_b("llama-125m") == pytest.approx(0.125)
    assert math.isnan(analysis.model_size_b("llama-tiny"))


# ---------------------------------------------------------------------------------- summaries

def test_summary_excludes_warmup_and_gives_median_and_quartiles(tmp_path):
    # 5 slow warm-up steps, then steady steps at 1000, 1000, 1100, 1200 tokens/s/GPU repeated
    recs = step_records(25, 1000.0, "bf16", warmup_tps=10.0, warmup=5)
    steady = [1000.0, 1000.0, 1100.0, 1200.0] * 5
    for r, v in zip(recs[5:], steady):
        r["tokens_per_sec_per_gpu"] = v
        r["mfu"] = v / 1e4
    analysis.write_result_file(tmp_path / "r.jsonl", run_meta("llama-1b", "bf16"), recs)
    s = analysis.summarize_runs(analysis.load_runs(tmp_path), warmup_steps=5).iloc[0]
    assert s["steady_steps"] == 20
    assert s["tokens_per_sec_per_gpu"] == np.median(steady) == 1050.0
    assert s["tps_p25"] == np.quantile(steady, 0.25) and s["tps_p75"] == np.quantile(steady, 0.75)
    assert s["tps_spread_pct"] == pytest.approx(100 * (np.quantile(steady, 0.75) - np.quantile(steady, 0.25)) / 1050.0)
    assert s["mfu"] == pytest.approx(0.105)
    assert s["max_mem_gib"] == pytest.approx(10.25) and s["tokens"] == 25 * 4096
    assert s["final_loss"] == pytest.approx(10 / 25 ** 0.1)
    # without excluding warm-up the slow steps drag the median down
    s0 = analysis.summarize_runs(analysis.load_runs(tmp_path), warmup_steps=0).iloc[0]
    assert s0["tokens_per_sec_per_gpu"] == np.median([10.0] * 5 + steady) == 1000.0


def test_smoothed_loss_ema_window_and_none():
    x = pd.Series([4.0, 2.0, 6.0, 0.0])
    alpha = 2 / (3 + 1)  # pandas span convention
    w = np.array([(1 - alpha) ** k for k in range(4)])[::-1]
    assert analysis.smooth(x, "ema", 3).iloc[-1] == pytest.approx(float((w * x).sum() / w.sum()))
    assert analysis.smooth(x, "window", 2).tolist() == [4.0, 3.0, 4.0, 3.0]
    assert analysis.smooth(x, "none", 5).tolist() == x.tolist()
    with pytest.raises(ValueError, match=r"smoothing='median'; allowed: ema, window, none"):
        analysis.smooth(x, "median", 3)
    with pytest.raises(ValueError, match="smoothing_span"):
        analysis.smooth(x, "ema", 0)


def test_summary_rejects_bad_parameters():
    empty = analysis.load_runs([])
    with pytest.raises(ValueError, match="warmup_steps"):
        analysis.summarize_runs(empty, warmup_steps=-1)
    with pytest.raises(ValueError, match="smoothing"):
        analysis.summarize_runs(empty, smoothing="gaussian")


def test_warmup_counts_steps_not_records_in_downsampled_files(tmp_path):
    recs = step_records(40, 1000.0, "bf16", warmup_tps=10.0, warmup=10)[::5]  # steps 1, 6, 11, ... 36
    analysis.write_result_file(tmp_path / "r.jsonl", run_meta("llama-1b", "bf16"), recs)
    s = analysis.summarize_runs(analysis.load_runs(tmp_path), warmup_steps=10).iloc[0]
    assert s["steady_steps"] == 6 and s["tokens_per_sec_per_gpu"] == 1000.0  # steps 11..36 are steady


def test_all_steps_in_warmup_is_said_not_hidden(tmp_path):
    make_trainer_run(tmp_path, "short", "bf16", 1000.0, n=4)
    s = analysis.summarize_runs(analysis.load_runs(tmp_path / "short"), warmup_steps=10).iloc[0]
    assert math.isnan(s["tokens_per_sec_per_gpu"]) and "warmup_steps=10" in s["note"]


def test_speedup_and_loss_gap_known_answers(tmp_path):
    make_pair(tmp_path, 1000.0, 1250.0, val_every=10)
    s = analysis.summarize_runs(analysis.load_runs(tmp_path), warmup_steps=10, smoothing="window", smoothing_span=5)
    c = analysis.compare_precisions(s)
    assert len(c) == 1
    r = c.iloc[0]
    assert r["baseline_run"] == "bf16" and r["fp8_run"] == "fp8" and bool(r["valid"])
    assert r["speedup"] == pytest.approx(1.25)
    # FP8 loss is exactly 1.03x BF16 at every step, so every smoothed gap is exactly +3%
    assert r["loss_gap_pct"] == pytest.approx(3.0)
    bf_val, f8_val = 10 / 30 ** 0.1 + 0.1, 1.03 * 10 / 30 ** 0.1 + 0.1
    assert r["val_loss_gap_pct"] == pytest.approx(100 * (f8_val - bf_val) / bf_val)
    c_final = analysis.compare_precisions(s, loss="final")
    assert c_final.iloc[0]["loss_baseline"] == pytest.approx(10 / 30 ** 0.1)
    with pytest.raises(ValueError, match="loss='best'"):
        analysis.compare_precisions(s, loss="best")


def test_loss_not_compared_when_tokens_differ(tmp_path):
    make_trainer_run(tmp_path, "bf16", "bf16", 1000.0, n=30)
    make_trainer_run(tmp_path, "fp8", "fp8", 1200.0, n=20)
    c = analysis.compare_precisions(analysis.summarize_runs(analysis.load_runs(tmp_path)))
    r = c.iloc[0]
    assert not r["valid"] and math.isnan(r["loss_gap_pct"]) and "different tokens" in r["note"]
    assert r["speedup"] == pytest.approx(1.2)  # rates still compare
    text = analysis.verdict(c)
    assert "did not see the same tokens" in text


def test_baseline_is_fastest_bf16_or_the_named_backend(tmp_path):
    make_trainer_run(tmp_path, "hf-bf16", "bf16", 800.0, backend="none")  # the trainer's name for plain HF
    make_trainer_run(tmp_path, "te-bf16", "bf16", 1000.0, backend="te")
    make_trainer_run(tmp_path, "te-fp8", "fp8", 1400.0)
    s = analysis.summarize_runs(analysis.load_runs(tmp_path))
    best = analysis.compare_precisions(s).iloc[0]
    assert best["baseline_run"] == "te-bf16" and best["speedup"] == pytest.approx(1.4)
    hf = analysis.compare_precisions(s, baseline_backend="hf").iloc[0]
    assert hf["baseline_run"] == "hf-bf16" and hf["speedup"] == pytest.approx(1.75)


def test_comparison_rows_are_ordered_by_model_size_then_speedup(tmp_path):
    for model, f8 in (("llama-7b", (300.0, 320.0)), ("llama-1b", (1200.0, 1300.0))):
        make_trainer_run(tmp_path, f"{model}-bf16", "bf16", 1000.0 if model == "llama-1b" else 250.0, model=model)
        make_trainer_run(tmp_path, f"{model}-fp8-a", "fp8", f8[0], model=model, recipe="block")
        make_trainer_run(tmp_path, f"{model}-fp8-b", "fp8", f8[1], model=model, recipe="current")
    c = analysis.compare_precisions(analysis.summarize_runs(analysis.load_runs(tmp_path)))
    assert c["fp8_run"].tolist() == ["llama-1b-fp8-b", "llama-1b-fp8-a", "llama-7b-fp8-b", "llama-7b-fp8-a"]


def test_runs_pair_only_within_model_and_scale(tmp_path):
    make_trainer_run(tmp_path, "bf16-1b", "bf16", 1000.0, model="llama-1b")
    make_trainer_run(tmp_path, "fp8-7b", "fp8", 300.0, model="llama-7b")
    make_trainer_run(tmp_path, "fp8-1b-2gpu", "fp8", 1200.0, model="llama-1b", world_size=2)
    assert len(analysis.compare_precisions(analysis.summarize_runs(analysis.load_runs(tmp_path)))) == 0


def test_cost_table_known_numbers(tmp_path):
    make_pair(tmp_path, 1000.0, 1250.0)
    s = analysis.summarize_runs(analysis.load_runs(tmp_path))
    tokens = 1000.0 * 8 * 3600  # one hour of 8 GPUs at 1000 tokens/s/GPU
    cost = analysis.cost_table(s, tokens=tokens, price_per_instance_hour=50.0, gpus_per_instance=8).set_index("run_id")
    # the plan's estimate of a job resting on each run (no two-GPU runs here: efficiency 1.0; H200 -> H100
    # peak x1.00), plus its 600 s start-up: the formula of the Answer's costs
    start = 600 / 3600
    assert cost.loc["bf16", "hours"] == pytest.approx(1.0 + start) and cost.loc["bf16", "cost_usd"] == pytest.approx(50.0 * (1 + start))
    assert cost.loc["fp8", "hours"] == pytest.approx(0.8 + start) and cost.loc["fp8", "cost_usd"] == pytest.approx(50.0 * (0.8 + start))
    assert cost["projected"].all()  # measured on 1 GPU, priced on 8-GPU instances
    answer = analysis.Answer.of(s, tokens=tokens, price_per_instance_hour=50.0).rows.iloc[0]
    assert (answer["hours_bf16"], answer["cost_fp8"]) == pytest.approx((cost.loc["bf16", "hours"], cost.loc["fp8", "cost_usd"]))
    four = analysis.cost_table(s, tokens=tokens, price_per_instance_hour=50.0, gpus_per_instance=4).set_index("run_id")
    assert four.loc["bf16", "hours"] == pytest.approx(2.0 + start)  # the plan's formula on 4 GPUs
    for bad in ({"tokens": 0}, {"price_per_instance_hour": -1.0}, {"gpus_per_instance": 0}):
        with pytest.raises(ValueError, match=list(bad)[0]):
            analysis.cost_table(s, **bad)


def test_scaling_efficiency(tmp_path):
    table = pd.concat([
        pd.DataFrame([{**r, "job_name": f"bf16-{n}x", "instance_count": n, "world_size": 8 * n}
                      for r in step_records(12, tps, "bf16")]) for n, tps in ((1, 1000.0), (2, 950.0), (4, 900.0))])
    s = analysis.summarize_runs(analysis.load_runs(table), warmup_steps=2)
    sc = analysis.scaling_table(s, by="instances")
    assert sc["instances"].tolist() == [1, 2, 4]
    assert sc["efficiency"].tolist() == pytest.approx([1.0, 0.95, 0.9])
    with pytest.raises(ValueError, match="by='nodes'"):
        analysis.scaling_table(s, by="nodes")
    assert analysis.scaling_table(s)["instances"].tolist() == [1, 2, 4]  # auto: instance counts differ


@pytest.mark.parametrize("row,label", [
    ({"precision": "bf16", "backend": "te", "recipe": "delayed", "fuse": True}, "bf16 te"),
    ({"precision": "fp8", "backend": "te", "recipe": "delayed", "fuse": False}, "fp8 te delayed unfused"),
    ({"precision": "fp8", "backend": "torchao", "recipe": "current", "fuse": True, "compile": True}, "fp8 torchao current compile"),
    ({"precision": "bf16", "backend": "none", "compile": True, "param_dtype": "bf16"}, "bf16 compile bf16-params"),
    ({"precision": "fp8", "backend": "te", "recipe": "delayed", "fuse": True, "recipe_spec": "delayed:margin=1",
      "bf16_edge_blocks": 1, "activation_checkpointing": True}, "fp8 te delayed fused (margin=1) bf16-edge-blocks=1 act-ckpt"),
    ({"precision": "fp8", "backend": "te", "recipe": "delayed", "fuse": True, "parallel": "fsdp", "world_size": 1,
      "fsdp_keep_weights": True}, "fp8 te delayed fused"),
    ({"precision": "fp8", "backend": "te", "recipe": "delayed", "fuse": True, "parallel": "fsdp", "world_size": 2,
      "fsdp_keep_weights": True}, "fp8 te delayed fused fsdp keep-weights"),
    ({"precision": "fp8", "backend": "te", "recipe": "delayed", "fuse": True, "fp8_attention": True,
      "nvte_fp8_dpa_bwd": "1"}, "fp8 te delayed fused fp8-attention"),
    ({"precision": "fp8", "backend": "te", "recipe": "delayed", "fuse": True, "fp8_attention": True,
      "nvte_fp8_dpa_bwd": "0"}, "fp8 te delayed fused fp8-attention bf16-attention-backward"),
])
def test_variant_label_names_what_ran(row, label):
    assert analysis.variant_label(row) == label


def test_scaling_pairs_each_run_with_the_same_set_up_measured_closest_in_time(tmp_path):
    """Variant names (tags) and the data-parallel mode do not split a set-up; the layout does; the
    reference is the one-GPU run of the same session, and the fastest one-GPU run is a second column."""
    _bench(tmp_path, "one-a", 1000.0, 1, "2026-11-29T10:00:00Z")
    _bench(tmp_path, "two-a", 960.0, 2, "2026-11-29T10:05:00Z", parallel="fsdp", fsdp_keep_weights=True)
    _bench(tmp_path, "one-b", 1050.0, 1, "2026-11-30T10:00:00Z")
    _bench(tmp_path, "two-b", 1000.0, 2, "2026-11-30T10:03:00Z", parallel="fsdp")
    _bench(tmp_path, "two-other-layout", 500.0, 2, "2026-11-30T10:04:00Z", parallel="fsdp", micro_batch_size=8)
    _bench(tmp_path, "one-only", 700.0, 1, "2026-11-30T11:00:00Z", micro_batch_size=2)
    sc = analysis.scaling_table(analysis.summarize_runs(analysis.load_runs(tmp_path), warmup_steps=2))
    rows = sc.set_index("run_id")
    assert set(rows.index) == {"one-a", "two-a", "one-b", "two-b"}  # one scale only: left out
    assert rows.loc["two-a", "reference_run_id"] == "one-a" and rows.loc["two-b", "reference_run_id"] == "one-b"
    assert rows.loc["two-a", "efficiency"] == pytest.approx(0.96)
    assert rows.loc["two-b", "efficiency"] == pytest.approx(1000.0 / 1050.0)
    assert rows.loc["two-a", "efficiency_vs_fastest"] == pytest.approx(960.0 / 1050.0)
    assert rows.loc["two-a", "hours_apart"] == pytest.approx(5 / 60)
    assert rows.loc["one-a", "efficiency"] == 1.0
    assert rows["variant"].nunique() == 1 and "fsdp" not in rows["variant"].iloc[0]
    assert "4x1024" in rows["variant"].iloc[0]


def test_verdict_mentions_the_speedup_range_across_scales():
    rows = [{**r, "job_name": f"{p}-{n}x", "instance_count": n, "world_size": 8 * n}
            for n, bf, f8 in ((1, 1000.0, 1200.0), (2, 950.0, 1100.0))
            for p, tps in (("bf16", bf), ("fp8", f8)) for r in step_records(12, tps, p)]
    c = analysis.compare_precisions(analysis.summarize_runs(analysis.load_runs(pd.DataFrame(rows)), warmup_steps=2))
    text = analysis.verdict(c)
    assert "on 8 GPUs of NVIDIA H200" in text and "1.20x" in text
    assert f"across 8 to 16 GPUs its speedup ranged from {1100 / 950:.2f}x to 1.20x" in text


# ------------------------------------------------------------------------------------ verdict

def test_verdict_is_written_from_the_numbers(tmp_path):
    make_pair(tmp_path, 1000.0, 1250.0)
    c = analysis.compare_precisions(analysis.summarize_runs(analysis.load_runs(tmp_path)))
    s = analysis.summarize_runs(analysis.load_runs(tmp_path))
    text = analysis.Answer.of(s, c, analysis.load_reference(), tokens=24e9, price_per_instance_hour=100.0).verdict()
    # its cost is the plan's: 8 GPUs at the run's rate (no two-GPU runs here: efficiency 1.0) + 600 s start-up
    hours_bf16, hours_fp8 = ((24e9 / (tps * 8) + 600) / 3600 for tps in (1000.0, 1250.0))
    assert "1.25x" in text and "+3.00%" in text and f"{100 * (1 - hours_fp8 / hours_bf16):.0f}% saved" in text
    assert f"${hours_bf16 * 100:,.0f}" in text and f"${hours_fp8 * 100:,.0f}" in text
    assert "saved" not in analysis.verdict(c) and "$" not in analysis.verdict(c)  # costs: the Answer's only
    assert "more than 1% above" in text  # 3% gap > 1% tolerance
    assert "reported (not measured here) 1.13x" in text and "1.18x" in text
    assert "(the source reported 1.13x at 1B)" in text  # llama-1b is set beside the source's 1B figure
    assert "pays off" in analysis.verdict(c, loss_tolerance_pct=5.0)
    with pytest.raises(ValueError, match="loss_tolerance_pct"):
        analysis.verdict(c, loss_tolerance_pct=-1)
    with pytest.raises(ValueError, match="price_per_instance_hour"):
        analysis.Answer.of(s, price_per_instance_hour=-5.0)


def test_emulated_fp8_on_cpu_is_not_a_speed_claim(tmp_path):
    make_trainer_run(tmp_path, "bf16", "bf16", 100.0, backend="hf")
    make_trainer_run(tmp_path, "fp8", "fp8", 150.0, backend="emulated", loss_scale=1.002)
    c = analysis.compare_precisions(analysis.summarize_runs(analysis.load_runs(tmp_path)))
    assert not c.iloc[0]["hardware_fp8"] and "emulated" in c.iloc[0]["note"]
    text = analysis.verdict(c)
    assert "1.50x" in text and "not a measurement of FP8 speed" in text
    assert "saved" not in text and "pays off for" not in text and "+0.20%" in text


def test_verdict_without_loss_or_pairs_says_so(tmp_path):
    recs = step_records(20, 1000.0, "bf16")
    recs_f = step_records(20, 900.0, "fp8")
    for r in recs + recs_f:
        del r["loss"]
    analysis.write_result_file(tmp_path / "b.jsonl", run_meta("llama-1b", "bf16"), recs)
    analysis.write_result_file(tmp_path / "f.jsonl", run_meta("llama-1b", "fp8"), recs_f)
    c = analysis.compare_precisions(analysis.summarize_runs(analysis.load_runs(tmp_path)))
    text = analysis.verdict(c)
    assert "0.90x" in text and "no loss was recorded" in text and "not faster than BF16" in text
    empty = analysis.verdict(analysis.compare_precisions(analysis.summarize_runs(analysis.load_runs([]))))
    assert "no measured BF16/FP8 pairs" in empty


def test_fp8_pairs_with_the_best_bf16_of_its_own_batch_layout(tmp_path):
    """Accumulation changes tokens/s for both precisions: a 1-step FP8 run must not meet an 8-step BF16 run."""
    study = tmp_path / "throughput-h200"
    for name, prec, ga, tps in [("b1", "bf16", 1, 1000.0), ("b8", "bf16", 8, 1200.0),
                                ("f1", "fp8", 1, 1250.0), ("f8", "fp8", 8, 1560.0)]:
        analysis.write_result_file(study / f"{name}.jsonl", run_meta("llama-1b", prec, run_id=name, grad_accum=ga,
                                                                     micro_batch_size=8, seq_len=2048, study=study.name),
                                   step_records(12, tps, prec))
    summary = analysis.summarize_runs(analysis.load_runs(study), warmup_steps=2)
    c = analysis.compare_precisions(summary).set_index("fp8_run")
    assert c.loc["f1", "baseline_run"] == "b1" and c.loc["f1", "speedup"] == pytest.approx(1.25)
    assert c.loc["f8", "baseline_run"] == "b8" and c.loc["f8", "speedup"] == pytest.approx(1.3)
    assert c.loc["f8", "layout"] == "8x2048, accum 8" and c.loc["f1", "layout"] == "8x2048"
    mixed = analysis.compare_precisions(summary, by_layout=False).set_index("fp8_run")
    assert set(mixed["baseline_run"]) == {"b8"}  # without layouts: the fastest BF16 of the model and scale


def test_graphed_runs_are_labelled_as_such_in_the_runs_table_and_in_the_profiles():
    """A graphed run and its eager twin are different set-ups: the label says 'graphs' where the run
    record has cuda_graphs true (runs table, pairs, scaling keys and profiles alike)."""
    on, off = (RESULTS_DIR / "graphs-h200" / f"llama-7b-te-fp8-delayed-p16-mb1-ga8-graphs-{g}-s8.jsonl" for g in ("on", "off"))
    runs = analysis.load_runs([on, off])
    labels = runs.groupby("run_id")["variant"].first()
    assert "graphs" in labels[on.stem].split() and "graphs" not in labels[off.stem].split()
    profiles = analysis.load_profiles([on.with_name(on.stem + ".profile.json")])
    assert profiles["variant"].iloc[0] == labels[on.stem]


def test_an_fp8_run_pairs_with_the_bf16_run_of_its_seed():
    """Two BF16 seeds (a noise band, issue 31): the FP8 run's loss gap is against the same init and data order."""
    base = dict(model="m", gpu_name="NVIDIA H200", instances=1, world_size=1, study="s", micro_batch_size=8,
                grad_accum=1, seq_len=2048, tokens=1e6, loss_comparable=True, smoothed_loss=3.0, final_loss=3.0)
    base = {**{c: None for c in analysis.load.META_COLUMNS}, "mfu": None, "nonfinite_losses": 0, **base}
    summary = pd.DataFrame([
        {**base, "run_id": "b1", "variant": "bf16", "precision": "bf16", "backend": "te", "seed": 1, "tokens_per_sec_per_gpu": 10, "val_loss": 3.0},
        {**base, "run_id": "b2", "variant": "bf16", "precision": "bf16", "backend": "te", "seed": 2, "tokens_per_sec_per_gpu": 11, "val_loss": 3.3},
        {**base, "run_id": "f1", "variant": "fp8", "precision": "fp8", "backend": "te", "seed": 1, "tokens_per_sec_per_gpu": 14, "val_loss": 3.03},
    ])
    c = analysis.compare_precisions(summary)
    assert list(c["baseline_run"]) == ["b1"] and c["val_loss_gap_pct"].iloc[0] == pytest.approx(1.0)
    c2 = analysis.compare_precisions(summary.assign(seed=np.nan))  # no seeds recorded: the fastest, as before
    assert list(c2["baseline_run"]) == ["b2"]


def test_the_headline_loss_gap_is_to_the_mean_of_the_bf16_seeds_beside_their_spread():
    """Issue 31: where a loss study has several BF16 seeds, the headline's gap is to their mean, with how far apart
    they ended; the README's table and notes, and the verdict, say so. One seed: the same-seed pair, as before."""
    from fp8lab.views import report

    base = dict(model="m", gpu_name="NVIDIA H200", instances=1, world_size=1, study="s", micro_batch_size=8,
                grad_accum=1, seq_len=2048, tokens=2e7, loss_comparable=True, smoothed_loss=3.0, final_loss=3.0)
    base = {**{c: None for c in analysis.load.META_COLUMNS}, "mfu": None, "nonfinite_losses": 0, **base}
    rows = [
        {**base, "run_id": "b1", "variant": "bf16", "precision": "bf16", "backend": "te", "seed": 1, "tokens_per_sec_per_gpu": 10, "val_loss": 3.0},
        {**base, "run_id": "b2", "variant": "bf16", "precision": "bf16", "backend": "te", "seed": 2, "tokens_per_sec_per_gpu": 11, "val_loss": 3.2},
        {**base, "run_id": "f1", "variant": "fp8", "precision": "fp8", "backend": "te", "recipe": "delayed", "seed": 1,
         "tokens_per_sec_per_gpu": 14, "val_loss": 2.9},
    ]
    row = analysis.headline_table(pd.DataFrame(rows)).iloc[0]
    assert row["loss_baseline_run"] == "b1"  # the pair is still the same seed
    assert row["loss_gap_pct"] == pytest.approx(100 * (2.9 / 3.1 - 1))  # but the gap is to the mean of 3.0 and 3.2
    assert row["loss_bf16_seeds"] == 2 and row["loss_bf16_spread_pct"] == pytest.approx(100 * 0.2 / 3.1)
    md = report.headline_markdown(pd.DataFrame([{**row.to_dict(), "cost_fp8": np.nan}]))
    assert "| -6.45% |" in md and "against the mean of 2 BF16 seeds (6.45% apart) after 20M tokens" in md
    assert row["loss_bf16_runs"] == "b1, b2" and row["loss_in_band"]  # |-6.45%| <= max(0.5%, the 6.45% spread)
    others = [{**rows[1], "run_id": "h100", "gpu_name": "NVIDIA H100 80GB HBM3", "seed": 3, "val_loss": 4.0},
              {**rows[1], "run_id": "short", "seq_len": 512, "seed": 4, "val_loss": 4.0},
              {**rows[1], "run_id": "nan", "nonfinite_losses": 3, "seed": 5, "val_loss": 4.0},
              {**rows[1], "run_id": "fast", "loss_comparable": False, "seed": 6, "val_loss": 4.0}]
    head = analysis.headline_table(pd.DataFrame(rows + others))
    mixed = head[head["gpu_name"] == head.loc[head["fp8_run"] == "f1", "gpu_name"].iloc[0]].iloc[0]
    assert mixed["loss_bf16_seeds"] == 2 and mixed["loss_gap_pct"] == pytest.approx(row["loss_gap_pct"])  # not seeds
    one = analysis.headline_table(pd.DataFrame(rows[:1] + rows[2:])).iloc[0]  # one BF16 seed: the pair's gap
    assert one["loss_gap_pct"] == pytest.approx(100 * (2.9 / 3.0 - 1)) and one["loss_bf16_seeds"] == 1
    assert pd.isna(one["loss_bf16_spread_pct"])


def test_the_headline_loss_gap_is_of_the_mean_of_the_fp8_seeds_of_its_set_up():
    """Session 14: where the FP8 set-up of the headline's loss has several seeds too, the gap is of their mean, not of
    whichever run ranked first (the newest); another recipe's run is not one of its seeds."""
    from fp8lab.views import report

    base = dict(model="m", gpu_name="NVIDIA H200", instances=1, world_size=1, study="s", micro_batch_size=8,
                grad_accum=1, seq_len=2048, tokens=2e7, loss_comparable=True, smoothed_loss=3.0, final_loss=3.0)
    base = {**{c: None for c in analysis.load.META_COLUMNS}, "mfu": None, "nonfinite_losses": 0, **base}
    bf16 = dict(variant="bf16", precision="bf16", backend="te", tokens_per_sec_per_gpu=10)
    fp8 = dict(variant="fp8", precision="fp8", backend="te", recipe="delayed", tokens_per_sec_per_gpu=14)
    rows = [{**base, **bf16, "run_id": "b1", "seed": 1, "val_loss": 3.0},
            {**base, **bf16, "run_id": "b2", "seed": 2, "val_loss": 3.2},
            {**base, **fp8, "run_id": "f1", "seed": 1, "val_loss": 2.9, "date": "2026-01-01T00:00:00Z"},
            {**base, **fp8, "run_id": "f2", "seed": 2, "val_loss": 3.3, "date": "2026-02-01T00:00:00Z"},
            {**base, **fp8, "run_id": "c1", "recipe": "current", "seed": 1, "val_loss": 1.0, "date": "2025-01-01T00:00:00Z"}]
    row = analysis.headline_table(pd.DataFrame(rows)).iloc[0]
    assert row["loss_fp8_seeds"] == 2 and row["loss_fp8_runs"] == "f1, f2"  # c1 (current scaling) is not a seed
    assert row["loss_gap_pct"] == pytest.approx(100 * (3.1 / 3.1 - 1))  # the mean of 2.9 and 3.3 against 3.1
    md = report.headline_markdown(pd.DataFrame([{**row.to_dict(), "cost_fp8": np.nan}]))
    assert "(the mean of 2 seeds) against the mean of 2 BF16 seeds" in md
    summary = pd.DataFrame(rows)
    text = analysis.Answer.of(summary, analysis.compare_precisions(summary), None, tokens=24e9,
                              price_per_instance_hour=100.0).verdict()
    assert "(fp8 (the mean of 2 seeds) against the mean of 2 BF16 seeds" in text, text
    assert "runs f1, f2 and the BF16 seeds b1, b2" in text
    alone = analysis.headline_table(pd.DataFrame(rows[:3] + rows[4:])).iloc[0]  # one FP8 seed: that run, as before
    assert alone["loss_fp8_seeds"] == 1 and alone["loss_gap_pct"] == pytest.approx(100 * (2.9 / 3.1 - 1))


def test_the_headline_leaves_out_a_model_with_fp8_runs_and_no_bf16_run():
    """FP8 against BF16 per model: a model that only ran in FP8 (a loss check's shape) has nothing to head."""
    base = dict(gpu_name="NVIDIA H200", instances=1, world_size=1, study="s", micro_batch_size=8, grad_accum=1,
                seq_len=2048, tokens=2e7, loss_comparable=False, smoothed_loss=3.0, final_loss=3.0, val_loss=None)
    base = {**{c: None for c in analysis.load.META_COLUMNS}, "mfu": None, "nonfinite_losses": 0, **base}
    rows = [{**base, "model": "m", "run_id": "b", "variant": "bf16", "precision": "bf16", "backend": "te", "tokens_per_sec_per_gpu": 10},
            {**base, "model": "m", "run_id": "f", "variant": "fp8", "precision": "fp8", "backend": "te", "recipe": "delayed",
             "tokens_per_sec_per_gpu": 14},
            {**base, "model": "only-fp8", "run_id": "o", "variant": "fp8", "precision": "fp8", "backend": "te",
             "recipe": "delayed", "tokens_per_sec_per_gpu": 20}]
    head = analysis.headline_table(pd.DataFrame(rows))
    assert list(head["model"]) == ["m"] and head["speedup"].iloc[0] == pytest.approx(1.4)
    assert "only-fp8" in set(analysis.best_runs(pd.DataFrame(rows))["model"])  # still a measured run, not a headline row


def test_a_model_measured_on_two_gpus_heads_a_row_and_a_panel_per_gpu():
    """Session 26: llama-3.2-1b ran on an H100 and on an H200. The table names each row's GPU and the figure draws a
    panel per model and GPU, each with its own GPU's runs (the figure grouped by model alone: its title named the
    first GPU while its bars showed the other's)."""
    pytest.importorskip("matplotlib")
    from fp8lab.views import plots, report

    base = dict(instances=1, world_size=1, study="s", micro_batch_size=8, grad_accum=1, seq_len=2048, tokens=2e7,
                loss_comparable=False, smoothed_loss=3.0, final_loss=3.0, val_loss=None)
    base = {**{c: None for c in analysis.load.META_COLUMNS}, "mfu": 0.5, "nonfinite_losses": 0, **base, "model": "m"}
    rows = [{**base, "gpu_name": gpu, "run_id": f"{p}-{tag}", "variant": p, "precision": p, "backend": "te",
             "recipe": "delayed" if p == "fp8" else None, "tokens_per_sec_per_gpu": tps}
            for gpu, tag, bf16, fp8 in (("NVIDIA H100 80GB HBM3", "h100", 10, 12), ("NVIDIA H200", "h200", 20, 30))
            for p, tps in (("bf16", bf16), ("fp8", fp8))]
    head = analysis.headline_table(pd.DataFrame(rows))
    assert sorted(zip(head["gpu_name"], head["speedup"])) == [("NVIDIA H100 80GB HBM3", pytest.approx(1.2)),
                                                              ("NVIDIA H200", pytest.approx(1.5))]
    table = report.headline_markdown(head.assign(cost_fp8=np.nan)).split("\n\n")[0]
    assert "| m on H100 80GB HBM3 | - | 10 | 12 | **1.20x** |" in table and "| m on H200 | - | 20 | 30 | **1.50x** |" in table
    fig = plots.headline_figure(analysis.best_runs(pd.DataFrame(rows)))
    panels = {ax.get_title(): sorted(t.get_text().split("\n")[0] for t in ax.texts if "x\n" in t.get_text())
              for ax in fig.axes if ax.get_visible() and ax.get_title()}  # each bar's label: its ratio first
    assert panels == {"m (NVIDIA H100 80GB HBM3)": ["1.00x", "1.20x"], "m (NVIDIA H200)": ["1.00x", "1.50x"]}
    one = analysis.headline_table(pd.DataFrame(rows[2:]))  # one GPU: the rows name none, as before
    assert "| m | - | 20 | 30 |" in report.headline_markdown(one.assign(cost_fp8=np.nan))


def test_the_committed_parity_study_is_the_llama_1b_loss_gap_with_its_noise_band():
    """The README's llama-1b loss cell comes from data/results/loss-parity-20m: 20.02M tokens, FP8 delayed (the mean
    of its seeds) against the mean of the BF16 seeds, their spread beside it (the figures parity.json holds, written by
    the study)."""
    parity = json.loads((RESULTS_DIR / "loss-parity-20m" / "parity.json").read_text())
    head = analysis.headline_table(analysis.summarize_runs(analysis.load_runs()))
    rows = head[head["model"] == "llama-1b"]  # (one row per GPU it ran on; the loss study is the model's)
    assert len(rows) >= 1 and rows["loss_study"].nunique() == 1
    row = rows.iloc[0]
    assert row["loss_study"] == "loss-parity-20m" and row["loss_tokens"] == 20_021_248
    delayed = parity["fp8_by_recipe"]["te-fp8-delayed"]  # FP8 delayed: the mean of its seeds, as the headline's
    assert row["loss_fp8_seeds"] == delayed["seeds"] == 3
    assert row["loss_gap_pct"] == pytest.approx(delayed["gap_pct"])
    assert row["loss_bf16_spread_pct"] == pytest.approx(parity["bf16_spread_pct"])


def test_the_headline_loss_gap_comes_from_the_longest_loss_study(tmp_path):
    """README and notebook 05 quote the loss study with the most tokens: the committed loss-1b until the one-epoch
    parity study's files exist (issue 31), then that one, with its token count. The longer study here is the
    loss-1b pair re-labelled (test data: its numbers mean nothing)."""
    import shutil

    src = RESULTS_DIR / "loss-1b"
    names = ["llama-1b-te-bf16-w30.jsonl", "llama-1b-te-fp8-delayed-w30.jsonl"]
    (tmp_path / "loss-1b").mkdir()
    for n in names:
        shutil.copy(src / n, tmp_path / "loss-1b" / n)
    before = analysis.headline_table(analysis.summarize_runs(analysis.load_runs(tmp_path)))
    row = before.set_index("model").loc["llama-1b"]
    assert row["loss_study"] == "loss-1b" and row["loss_tokens"] == 4_915_200
    (tmp_path / "loss-parity-20m").mkdir()
    for n in names:
        lines = [json.loads(x) for x in (src / n).read_text().splitlines()]
        for r in lines:
            r["study"] = "loss-parity-20m" if r["record"] == "run" else r.get("study")
            if r["record"] == "run":
                r["run_id"] = r["run_id"].replace("-w30", "-20m-s1234")
            if "tokens" in r and r["record"] != "run":
                r["tokens"] = r["tokens"] * 4  # 19.66M tokens: the longer study
        (tmp_path / "loss-parity-20m" / n.replace("-w30", "-20m-s1234")).write_text("".join(json.dumps(r) + "\n" for r in lines))
    after = analysis.headline_table(analysis.summarize_runs(analysis.load_runs(tmp_path)))
    row = after.set_index("model").loc["llama-1b"]
    assert row["loss_study"] == "loss-parity-20m" and row["loss_tokens"] == 4 * 4_915_200


def test_the_headline_compares_best_bf16_and_best_fp8_at_one_sequence_length():
    """The long-context study's headline row pairs BF16 and FP8 at one sequence length, the shortest where both
    ran. Session 10 ran BF16 at 8K and 16K only (the fastest FP8 at 2048 against BF16 at 8192 read 1.59x); session
    13 added BF16 at 2K and 4K, so the pair is now at 2048. Without those two BF16 runs it is at 8192 again."""
    from fp8lab import analysis

    runs = analysis.load_runs()
    head = analysis.headline_table(analysis.summarize_runs(runs))
    row = head[(head["model"] == "llama-3b-shape") & (head["gpu_name"] == "NVIDIA H200")].iloc[0]  # the H200's runs
    assert row["bf16_run"].endswith("-s2048") and row["fp8_run"].endswith("-s2048"), (row["bf16_run"], row["fp8_run"])
    assert row["speedup"] == pytest.approx(35353.57 / 26174.86, rel=1e-3)
    no_short_bf16 = runs[~runs["run_id"].isin(["llama-1b-default-bf16-3b-s2048", "llama-1b-default-bf16-3b-s4096"])]
    head = analysis.headline_table(analysis.summarize_runs(no_short_bf16))
    row = head[(head["model"] == "llama-3b-shape") & (head["gpu_name"] == "NVIDIA H200")].iloc[0]
    assert row["bf16_run"].endswith("-s8192") and row["fp8_run"].endswith("-s8192"), (row["bf16_run"], row["fp8_run"])
    assert row["speedup"] == pytest.approx(29047.97 / 21911.80, rel=1e-3)


def test_the_headline_pairs_best_bf16_and_best_fp8_in_one_memory_mode():
    """llama-7b on one H100 ran in two memory modes: the fastest BF16 in bf16-moments, the fastest FP8 in offload.
    The headline pairs the runs of the first mode in --memory's order where both precisions ran (offload); without
    the offload BF16 run it pairs bf16-moments' runs."""
    from fp8lab import analysis

    runs = analysis.load_runs()
    h100 = "NVIDIA H100 80GB HBM3"

    def row(r):
        head = analysis.headline_table(analysis.summarize_runs(r))
        return head[(head["model"] == "llama-7b") & (head["gpu_name"] == h100)].iloc[0]

    both = row(runs)
    assert (both["bf16_run"], both["fp8_run"]) == ("llama-7b-default-bf16-h100-offload",
                                                   "llama-7b-default-fp8-h100-offload")
    assert both["speedup"] == pytest.approx(15260.82 / 11267.0, rel=1e-3)
    fused = row(runs[runs["run_id"] != "llama-7b-default-bf16-h100-offload"])
    assert (fused["bf16_run"], fused["fp8_run"]) == ("llama-7b-default-bf16-h100", "llama-7b-default-fp8-ckpt-h100")
    best = analysis.best_runs(analysis.summarize_runs(runs))
    seven = best[(best["model"] == "llama-7b") & (best["gpu_name"] == h100)]
    assert set(seven["memory"]) == {"offload"}  # the headline figure names the mode on these bars
    assert set(best[best["model"] == "llama-1b"]["memory"]) == {"plain"}


def test_parity_curves_read_each_step_against_the_bf16_seeds_mean_and_band():
    """Issue 31's band per validation step: max(0.5%, the BF16 seeds' spread), each run's gap to their mean; a study
    with one BF16 seed has no band and gives no rows."""
    def run(run_id, precision, seed, losses, study="s"):
        return [{"record": "step", "run_id": run_id, "model": "m", "study": study, "precision": precision,
                 "recipe": "delayed" if precision == "fp8" else None, "variant": precision, "seed": seed,
                 "loss_comparable": True, "step": st, "tokens": 1000 * st, "val_loss": v}
                for st, v in zip((10, 20), losses)]
    runs = pd.DataFrame(run("b1", "bf16", 1, [4.0, 3.0]) + run("b2", "bf16", 2, [4.1, 3.1]) + run("f1", "fp8", 1, [4.0, 2.9])
                        + run("lone", "bf16", 1, [4.0, 3.0], study="t") + run("lf", "fp8", 1, [4.0, 3.0], study="t"))
    c = analysis.parity_curves(runs)
    assert set(c["study"]) == {"s"} and len(c) == 6  # study t has one BF16 seed
    end = c[c["step"] == 20].set_index("run_id")
    assert end.loc["f1", "gap_pct"] == pytest.approx(100 * (2.9 / 3.05 - 1))
    assert end.loc["f1", "band_pct"] == pytest.approx(100 * 0.1 / 3.05) and end.loc["f1", "bf16_seeds"] == 2
    tight = runs.assign(val_loss=[v if r != "b2" else v - 0.099 for r, v in zip(runs["run_id"], runs["val_loss"])])
    assert analysis.parity_curves(tight)["band_pct"].min() == pytest.approx(0.5)  # never narrower than 0.5%
    assert analysis.parity_curves(runs[runs["study"] == "t"]).empty
    assert analysis.parity_curves(runs.assign(val_loss=np.nan)).empty  # no validation loss (a user's short runs)


def test_a_headline_bar_of_a_run_with_the_lm_head_in_fp8_says_so():
    """The fastest FP8 run of a model may have run the LM head in FP8 (`--fp8-lm-head True`) while the other bars'
    runs kept it in BF16: its bar names the FP8 head, and no other bar does."""
    pytest.importorskip("matplotlib")
    from fp8lab.views import plots

    base = dict(gpu_name="NVIDIA H100 80GB HBM3", instances=1, world_size=1, study="s", micro_batch_size=8,
                grad_accum=1, seq_len=2048, tokens=2e7, loss_comparable=False, smoothed_loss=3.0, final_loss=3.0,
                val_loss=None)
    base = {**{c: None for c in analysis.load.META_COLUMNS}, "mfu": 0.5, "nonfinite_losses": 0, **base, "model": "m"}
    rows = [{**base, "run_id": "b", "variant": "bf16 te", "precision": "bf16", "backend": "te",
             "tokens_per_sec_per_gpu": 10},
            {**base, "run_id": "h", "precision": "fp8", "backend": "te", "recipe": "delayed", "fuse": True,
             "fp8_lm_head": True, "tokens_per_sec_per_gpu": 14}]
    rows[1]["variant"] = analysis.labels.variant_label(rows[1])  # the summary's label of what ran
    fig = plots.headline_figure(analysis.best_runs(pd.DataFrame(rows)))
    labels = {t.get_text().split("\n")[0]: t.get_text() for ax in fig.axes for t in ax.texts if "x\n" in t.get_text()}
    assert set(labels) == {"1.00x", "1.40x"}
    assert labels["1.40x"].endswith("\nFP8 head") and "FP8 head" not in labels["1.00x"]
