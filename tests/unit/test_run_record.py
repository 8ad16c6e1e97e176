"""config.json made once from the plan (fp8lab.train.run_record.config_record), and old run folders' config.json read
in today's form (fp8lab.analysis.run_config.normalize_config) with the same table."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fp8lab.analysis.load import load_runs
from fp8lab.analysis.run_config import normalize_config, read_config
from fp8lab.core.hardware import Machine
from fp8lab.core.paths import REPO_ROOT
from fp8lab.model.models import count_parameters, get_config
from fp8lab.plan.runplan import plan_run
from fp8lab.train.entry import TrainConfig
from fp8lab.train.run_record import config_record

CPU = Machine("cpu", "cpu", 24.0)
OLD = REPO_ROOT / "benchmarks" / "logs" / "families-session10" / "E-graphs-on-config.json"  # written before "built"
BUILT = {"fp8_weight_cache": False, "fuse_wgrad_accumulation": False, "fsdp_keep_weights": False, "adamw_impl": "for-loop",
         "cuda_graphs_captured": None}


def _record(c: TrainConfig, tmp_path: Path) -> dict:
    plan = plan_run(c, CPU)
    return config_record(plan, built=BUILT, sources={"model_source": {"source": "named"}}, argv=None,
                         output_dir=tmp_path, resumed_from=None, flops_per_token=1.0, environ={})


def test_the_plan_carries_the_model_config_the_options_made():
    c = TrainConfig(model="llama-tiny", seq_len=512, precision="fp8", backend="emulated")
    plan = plan_run(c, CPU)
    assert plan.model_config is c.model_config  # made once, on validation
    assert plan.model_config == get_config("llama-tiny", max_seq_len=512)  # the effective shape: max_seq_len raised
    assert plan.layout.seq_len == 512


def test_config_json_holds_each_decision_once(tmp_path):
    c = TrainConfig(model="llama-tiny", precision="fp8", backend="auto", fp8_attention="auto", fused_loss="auto")
    rec = _record(c, tmp_path)
    plan = plan_run(c, CPU)
    assert not [k for k in rec if k.endswith(("_resolved", "_active"))]
    assert not {"requested_layout", "layout", "cuda_graphs_reason", "cuda_graphs_captured", "total_steps"} & set(rec)
    assert rec["plan"] == plan.record() and rec["built"] == BUILT
    assert rec["requested"]["backend"] == "auto" and rec["plan"]["backend"] == "emulated"
    # the flat keys: what was asked, each decided option at the value that ran (readers of config.json expect them)
    for k, v in plan.options().items():
        assert rec[k] == v, k
    assert rec["fp8_attention"] == "off" and rec["fused_loss"] == "off" and rec["seq_len"] == plan.seq_len
    assert rec["backend"] == "emulated" and rec["recipe"] == "delayed" and rec["compute_dtype"] == "fp32"
    assert rec["cuda_graphs"] == "off" and rec["device"] == "cpu" and rec["lr"] == c.lr
    assert rec["params"] == count_parameters(plan.model_config).total
    assert normalize_config(rec) is rec  # today's form needs no shim


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_a_cpu_run_s_flat_keys_say_what_ran_never_auto(tmp_path, precision):
    """Every option at its default ("auto" wherever it has one): the flat keys are the values that ran, and a
    reader (analysis.labels.math_dtype) reads what ran from them instead of deciding again."""
    from fp8lab.analysis.labels import math_dtype, variant_label

    rec = _record(TrainConfig(precision=precision), tmp_path)
    flat = {k: v for k, v in rec.items() if not isinstance(v, (dict, list))}
    assert [k for k, v in flat.items() if v == "auto"] == []
    assert rec["requested"]["compute_dtype"] == "auto" and flat["compute_dtype"] == "fp32"  # the CPU rule, applied once
    assert math_dtype(flat) == ("fp32" if precision == "bf16" else "fp8")
    assert variant_label(flat) == ("fp32" if precision == "bf16" else "fp8 emulated delayed fused")


def test_an_old_config_json_reads_in_todays_form():
    old = json.loads(OLD.read_text())
    new = normalize_config(old)
    assert not [k for k in new if k.endswith(("_resolved", "_active"))]
    assert not {"requested_layout", "layout", "cuda_graphs_reason", "cuda_graphs_captured", "total_steps"} & set(new)
    assert new["plan"]["backend"] == old["backend_resolved"] == "te" and new["plan"]["cuda_graphs"] is True
    assert new["plan"]["recipe"] == old["plan"]["recipe"] and new["plan"]["warmup_steps"] == 5
    assert new["plan"]["reasons"]["cuda_graphs"] == old["plan"]["reasons"]["cuda_graphs"]
    assert new["built"]["fp8_weight_cache"] is True and new["built"]["fuse_wgrad_accumulation"] is True
    assert new["built"]["cuda_graphs_captured"] == old["cuda_graphs_captured"]
    assert new["requested"]["micro_batch_size"] == old["requested_layout"]["micro_batch_size"]
    moved = {"total_steps", "tokens_per_step", "adamw_impl", "cuda_graphs_reason"}
    ran = {k: new["plan"][k] for k in ("backend", "compute_dtype") if old[k] == "auto"}  # its "auto" keys: what ran
    assert ran == {"backend": "te", "compute_dtype": "bf16"} and new["recipe"] == old["plan"]["recipe"].split()[0]
    assert new["cuda_graphs"] == ("on" if old["cuda_graphs_active"] else "off")
    assert {k: v for k, v in new.items() if not isinstance(v, dict)} == {  # the other flat keys stay as they were
        **{k: v for k, v in old.items() if not isinstance(v, dict) and not k.endswith(("_resolved", "_active"))
           and k not in moved}, **ran, "recipe": new["recipe"], "cuda_graphs": new["cuda_graphs"]}
    assert normalize_config(new) == new


def test_an_old_run_folder_loads_the_same_table_as_in_todays_form(tmp_path):
    steps = [{"step": s, "tokens": 1024 * s, "loss": 6.0 - 0.1 * s, "lr": 3e-4, "grad_norm": 1.0, "step_time_s": 0.5,
              "tokens_per_sec": 2048.0, "tokens_per_sec_per_gpu": 2048.0, "mfu": None, "precision": "fp8",
              "backend": "te", "recipe": "delayed", "model": "llama-1b", "gpu_name": "NVIDIA H200", "world_size": 1}
             for s in (1, 2, 3)]
    old, new = tmp_path / "runs" / "a", tmp_path / "runs2" / "a"
    for folder in (old, new):
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    shutil.copy(OLD, old / "config.json")
    (new / "config.json").write_text(json.dumps(read_config(old)))  # the old folder's config.json in today's form
    assert "backend_resolved" not in json.loads((new / "config.json").read_text())
    a, b = load_runs(old), load_runs(new)
    pd.testing.assert_frame_equal(a.drop(columns=["source", "study"]), b.drop(columns=["source", "study"]))
    cfg = json.loads(OLD.read_text())
    assert (a["cuda_graphs"].iloc[0], a["micro_batch_size"].iloc[0]) == (cfg["cuda_graphs"], cfg["micro_batch_size"])
