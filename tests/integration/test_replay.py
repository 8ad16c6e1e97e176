"""``fp8lab train --config <run>/config.json``: a finished CPU run replayed plans the same RunPlan, trains the same
steps, says in its config.json that it was replayed; flags given win; a record that cannot be replayed says why."""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from fp8lab.core.hardware import Machine
from fp8lab.plan.runplan import plan_run
from fp8lab.records import metrics as fmetrics
from fp8lab.train import entry as ftrain
from fp8lab.train import replay

CPU = Machine("cpu", "cpu", 24.0)
ARGV = ["--model", "llama-tiny", "--precision", "fp8", "--backend", "emulated", "--recipe", "current", "--steps", "4",
        "--seq-len", "32", "--micro-batch-size", "2", "--grad-accum", "2", "--lr", "3e-3", "--seed", "7",
        "--compute-dtype", "fp32", "--data", "tokens", "--plot", "False", "--save-model", "False",
        "--progress", "off", "--print-metrics", "False", "--checkpoint-every", "-1", "--fp8-stats-every", "2"]


@pytest.fixture
def finished_run(prepared, tmp_path, monkeypatch):
    """A finished CPU run (FP8 emulated, non-default options), its data given relative to the working folder."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(prepared, tmp_path / "tokens")
    assert ftrain.main([*ARGV, "--output-dir", "first"]) == 0
    return tmp_path / "first"


def test_a_run_replayed_from_its_config_json_plans_and_trains_the_same(finished_run, tmp_path):
    record = finished_run / "config.json"
    original = ftrain.parse_args([*ARGV, "--output-dir", "first"])
    replayed, source = ftrain.parse_command(["--config", str(record), "--output-dir", "again"])
    assert source == str(record)
    # the same RunPlan: every option as the run asked it ("auto" included); only where it writes is its own
    assert replayed.output_dir == "again" and dataclasses.replace(replayed, output_dir="first") == original
    assert plan_run(dataclasses.replace(replayed, output_dir="first"), CPU) == plan_run(original, CPU)
    assert replay.config_of(record, output_dir="first") == original  # the Python API's equivalent

    assert ftrain.main(["--config", str(record), "--output-dir", "again"]) == 0
    first, again = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("first", "again"))
    assert again["plan"] == first["plan"] and again["requested"] == {**first["requested"], "output_dir": "again"}
    assert "replayed_from" not in first
    rf = again["replayed_from"]
    assert rf["config"] == "../first/config.json"  # beside the new run: no folder of this machine
    assert rf["sha256"] == __import__("hashlib").sha256(record.read_bytes()).hexdigest()
    assert rf["command"] == first["command"]
    losses = [[r["loss"] for r in fmetrics.read_metrics(tmp_path / d / "metrics.jsonl")] for d in ("first", "again")]
    assert len(losses[0]) == 4 and losses[1] == pytest.approx(losses[0], abs=1e-6)  # same seed, data, steps


def test_flags_given_win_over_the_record_and_bad_records_say_why(finished_run, tmp_path, capsys):
    record = finished_run / "config.json"
    c, _ = ftrain.parse_command(["--config", str(finished_run), "--steps", "6", "--recipe", "delayed"])
    assert (c.steps, c.recipe, c.seed, c.grad_accum, c.fp8_stats_every) == (6, "delayed", 7, 2, 2)  # the folder works too
    assert c.output_dir is None  # where the record wrote is the record's: this run writes to its own default
    assert ftrain.main(["--config", str(tmp_path / "nowhere.json")]) == ftrain.EXIT_BAD_OPTIONS
    assert "--config" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="--config .*junk.json: not a run's config.json"):
        ftrain.parse_command(["--config", str(tmp_path / "junk.json")])
    # a path the record could not keep (outside its run folder) must be given again
    moved = json.loads(record.read_text())
    moved["requested"]["data"] = "<abs>/tokens"
    (tmp_path / "moved.json").write_text(json.dumps(moved))
    with pytest.raises(ValueError, match=r"keeps data only as '<abs>/tokens'.*pass --data as well"):
        ftrain.parse_command(["--config", str(tmp_path / "moved.json")])
    assert ftrain.parse_command(["--config", str(tmp_path / "moved.json"), "--data", "tokens"])[0].data == "tokens"
