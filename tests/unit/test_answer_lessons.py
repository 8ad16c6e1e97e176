"""fp8lab.analysis.time_to_loss and memory_lesson: time to the same loss and peak memory, from real result files."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fp8lab import analysis
from fp8lab.analysis.time_to_loss import sentence, time_to_loss, tokens_to_reach
from fake_runs import run_meta, step_records


def test_tokens_to_reach_interpolates_between_evaluations():
    curve = pd.Series([5.0, 4.0, 3.0, 2.5], index=[100.0, 200.0, 300.0, 400.0])
    assert tokens_to_reach(curve, 3.5) == pytest.approx(250.0)
    assert tokens_to_reach(curve, 5.5) == 100.0
    assert np.isnan(tokens_to_reach(curve, 2.0))


def test_time_to_loss_counts_tokens_and_speed_together(tmp_path):
    """FP8 1.25x faster, its validation loss 2% lower at every evaluation: it reaches BF16's last loss earlier, and
    its time to that loss is the token ratio over the speed-up."""
    for prec, tps, scale in (("bf16", 1000.0, 1.0), ("fp8", 1250.0, 0.98)):
        recs = step_records(40, tps, prec, loss_scale=scale)
        for r in recs:
            if r["step"] % 10 == 0:
                r["val_loss"] = scale * (8.0 - r["step"] / 10)
        analysis.write_result_file(tmp_path / f"{prec}.jsonl",
                                   run_meta("llama-1b", prec, run_id=prec, study="loss-x", variant=prec), recs)
    runs = analysis.load_runs(tmp_path)
    answer = analysis.Answer.of(analysis.summarize_runs(runs, warmup_steps=5))
    t = time_to_loss(answer, runs).set_index("model").loc["llama-1b"]
    assert t["target_val_loss"] == pytest.approx(4.0)  # BF16's last evaluation
    tokens = runs[runs["run_id"] == "bf16"].dropna(subset=["val_loss"]).drop_duplicates("step")["tokens"].tolist()
    fp8_curve = pd.Series([0.98 * (8.0 - s) for s in (1, 2, 3, 4)], index=tokens[:4])
    assert t["fp8_tokens"] == pytest.approx(tokens_to_reach(fp8_curve, 4.0))
    assert t["token_ratio"] == pytest.approx(t["fp8_tokens"] / tokens[3])
    assert t["speedup"] == pytest.approx(answer.rows.set_index("model").loc["llama-1b", "speedup"])
    assert t["time_ratio"] == pytest.approx(t["token_ratio"] / t["speedup"]) and t["time_ratio"] < 1
    assert "BF16's time at" in sentence(t) and "$" not in sentence(t)


def test_peak_memory_is_each_best_runs_own_and_the_cache_is_the_memory_models(tmp_path):
    """The memory lesson's table: the peak memory the best BF16 and FP8 run reported, and the FP8 weight cache as 2
    bytes per decoder-block weight (fp8lab.plan.layout's rule)."""
    from fp8lab.analysis.memory_lesson import peak_memory, weight_cache_gib
    from fp8lab.model.models import block_matmul_params, get_config

    for prec, tps, mem in (("bf16", 1000.0, 40.0), ("fp8", 1300.0, 44.5)):
        recs = [{**r, "max_mem_gib": mem} for r in step_records(20, tps, prec, model="llama-7b")]
        analysis.write_result_file(tmp_path / f"{prec}.jsonl", run_meta("llama-7b", prec, run_id=prec, variant=prec), recs)
    summary = analysis.summarize_runs(analysis.load_runs(tmp_path), warmup_steps=2)
    t = peak_memory(analysis.Answer.of(summary), summary).set_index("model").loc["llama-7b"]
    assert (t["bf16_gib"], t["fp8_gib"]) == (40.0, 44.5) and t["fp8_minus_bf16_gib"] == pytest.approx(4.5)
    mcfg = get_config("llama-7b")
    assert t["fp8_weight_cache_gib"] == weight_cache_gib("llama-7b") == pytest.approx(
        2 * mcfg.num_layers * block_matmul_params(mcfg) / 2**30)
    assert np.isnan(weight_cache_gib("no-such-model"))


@pytest.mark.slow  # reads every committed result file
def test_the_answer_states_the_time_to_the_same_loss():
    """Issue 49: the Answer itself carries FP8's time to BF16's final validation loss (what notebook 05 and the
    README show), the same table the module computes."""
    runs = analysis.load_runs()
    summary = analysis.summarize_runs(runs)
    answer = analysis.Answer.of(summary, reference=analysis.load_reference())
    loss_runs, _ = analysis.headline_runs(runs, summary, answer.rows)
    got = answer.time_to_loss(loss_runs)
    pd.testing.assert_frame_equal(got, time_to_loss(answer, loss_runs))
    row = got.set_index("model").loc["llama-1b"]
    assert 0 < row["time_ratio"] < 1  # FP8 reaches BF16's final loss sooner, counting tokens and speed together


def test_the_states_per_mode_say_what_stays_on_the_gpu_and_what_goes_to_the_host():
    from fp8lab.analysis.memory_lesson import states_by_mode

    t = states_by_mode("llama-7b")
    n = 6_738_415_616
    assert list(t.index) == ["plain", "offload", "fp32-moments", "bf16-moments", "fp8-exp-avg"]
    assert t.loc["plain", "gpu_bytes"] == 16 and t.loc["plain", "host_gib"] == 0
    assert t.loc["offload", "gpu_bytes"] + t.loc["offload", "host_bytes"] == 16
    assert t.loc["offload", "gpu_gib"] * 2**30 == 4 * n and t.loc["offload", "host_gib"] * 2**30 == 12 * n
    assert t.loc["bf16-moments", "gpu_gib"] * 2**30 == 10 * n
