"""The loss-parity study's script (benchmarks/study_loss_parity.sh, issue 31) on a CPU: the same script
path as on the H200, with a tiny model on the emulated backend and a few steps of the shipped corpus."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fp8lab import analysis
from fp8lab.data import tokens as fdata

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import study_loss_parity  # noqa: E402

SMOKE = ["--cpu-smoke", "--model", "llama-tiny", "--tokens", "512", "--warmup-steps", "2", "--val-every", "4",
         "--val-batches", "1", "--min-left-s", "0", "--common-args",
         "--seq-len 32 --micro-batch-size 2 --grad-accum 1 --compute-dtype fp32 --fp8-stats-every 2"]


def _study(prepared, out: Path):
    env = {**os.environ, "DATA": str(prepared), "OUT": str(out), "PYTHON": sys.executable, "RESULTS": str(out / "results"),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(["bash", "benchmarks/study_loss_parity.sh", *SMOKE, "--work", str(out / "work")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_study_script_runs_four_runs_and_writes_their_results(prepared, tmp_path):
    p = _study(prepared, tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = tmp_path / "loss-parity-20m"
    files = sorted(f.name for f in res.glob("*.jsonl"))
    assert files == ["llama-tiny-te-bf16-20m-s1234.jsonl", "llama-tiny-te-bf16-20m-s4321.jsonl",
                     "llama-tiny-te-fp8-current-20m-s1234.jsonl", "llama-tiny-te-fp8-delayed-20m-s1234.jsonl"]
    ident = fdata.identity(fdata.read_manifest(prepared))
    runs = {}
    for f in files:
        run = json.loads((res / f).read_text().splitlines()[0])
        runs[f] = run
        assert run["record"] == "run" and run["study"] == "loss-parity-20m" and run["loss_comparable"] is True
        assert run["corpus"]["identity"] == ident and run["corpus"]["val_tokens"] > 0
        assert "--data <data>" in run["command"] and str(prepared) not in json.dumps(run)  # no machine paths
    assert runs[files[1]]["seed"] == 4321 and {r["seed"] for k, r in runs.items() if k != files[1]} == {1234}
    df = analysis.load_runs(res)  # the data/results reader takes them
    steps = df[df.record == "step"]
    assert set(steps.groupby("run_id").tokens.max()) == {512} and steps.val_loss.notna().sum() >= 8
    for f in files:  # the FP8 runs' health records follow their summary (not rows of the run table)
        recs = [json.loads(line) for line in (res / f).read_text().splitlines()]
        stats = [r for r in recs if r["record"] == "fp8_stats"]
        assert [r["step"] for r in stats] == ([2, 4, 6, 8] if "fp8" in f else [])
        assert all(r["layers"] for r in stats)
    parity = json.loads((res / "parity.json").read_text())
    bf = [parity["val_loss"]["bf16-s1234"], parity["val_loss"]["bf16-s4321"]]
    assert parity["bf16_mean"] == pytest.approx(sum(bf) / 2) and parity["bf16_spread"] == pytest.approx(abs(bf[0] - bf[1]))
    assert set(parity["fp8"]) == {"fp8-delayed", "fp8-current"}
    assert not list((tmp_path / "work").glob("*/checkpoints/step_*"))  # finished runs' checkpoints are removed
    shutil.rmtree(res)  # the next command's $OUT is a fresh folder: the kept results say what is done
    again = _study(prepared, tmp_path)  # everything done: nothing starts again, the results are packed again
    assert again.returncode == 0 and "start" not in again.stdout
    assert not list(res.glob("*.jsonl")) and (res / "parity.json").is_file()  # loose: only what this command finished
    import tarfile

    with tarfile.open(tmp_path / "loss-parity-20m-all.tar.gz") as tar:  # one file for the device tool's 8-file limit
        packed = sorted(Path(n).name for n in tar.getnames() if n.endswith(".jsonl"))
    assert packed == files


def test_runs_still_going_at_the_budget_get_sigterm():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.time()
    left = study_loss_parity._wait({"r": (proc, [], t0)}, t0 + 0.5)
    assert left == {"r"} and proc.returncode == -15 and time.time() - t0 < 30


def test_each_run_trains_at_least_the_tokens_asked_for():
    args = study_loss_parity.parse(["--data", "d", "--out", "o"])
    a = study_loss_parity.run_args(args, "bf16-s4321")
    assert a.steps == 611 and a.steps * 2048 * 16 >= 20_000_000 > (a.steps - 1) * 2048 * 16
    assert a.seed == 4321 and study_loss_parity.run_args(args, "fp8-current").seed == 1234
    with pytest.raises(SystemExit):
        study_loss_parity.parse(["--data", "d", "--out", "o", "--runs", "fp8-block"])
    follow = study_loss_parity.parse(["--data", "d", "--out", "o", "--runs", "bf16-s2025,fp8-delayed-s4321"])
    assert study_loss_parity.run_args(follow, "fp8-delayed-s4321").seed == 4321  # the second same-seed pair
    assert study_loss_parity.run_id_of(follow, "fp8-delayed-s4321") == "llama-1b-te-fp8-delayed-20m-s4321"


def test_the_summary_takes_every_bf16_seed_and_pairs_each_fp8_run_with_its_own_seed(tmp_path):
    """parity.json over the study's four runs and a follow-up (benchmarks/studies/loss_parity_20m.md): the band
    from every BF16 seed (max - min), each FP8 run's gap to their mean and to the BF16 run of its seed."""
    args = study_loss_parity.parse(["--data", "d", "--out", str(tmp_path)])
    losses = {"bf16-s1234": 3.0, "bf16-s4321": 3.1, "bf16-s2025": 3.3, "fp8-delayed": 2.9, "fp8-current": 3.05,
              "fp8-delayed-s4321": 3.2}
    for name, v in losses.items():
        (tmp_path / f"{study_loss_parity.run_id_of(args, name)}.jsonl").write_text(
            json.dumps({"record": "run"}) + "\n" + json.dumps({"record": "summary", "val_loss": v}) + "\n")
    r = study_loss_parity.summarize(args, tmp_path)
    assert r["bf16_seeds"] == 3 and r["bf16_mean"] == pytest.approx(3.1 + 1 / 30) and r["band"] == pytest.approx(0.3)
    assert r["fp8"]["fp8-delayed-s4321"]["gap_to_same_seed_pct"] == pytest.approx(100 * (3.2 / 3.1 - 1))
    assert r["fp8"]["fp8-delayed"]["within"] and r["fp8"]["fp8-current"]["within"]
