"""Notebook 04 executed for real (papermill): defaults and a non-default sweep, values read back."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from figure_outputs import longest_cell_output
from fp8lab.views.cell_text import MAX_CELL_LINES

pytest.importorskip("sagemaker.train")
from fp8lab import launch as L  # noqa: E402
from fp8lab.launch.redaction import _public_registry_accounts  # noqa: E402
from fp8lab.notebooks import NOTEBOOK_DIR, default_kernel, read_glued, run  # noqa: E402
from prose import assert_notebook_prose_short

import moto_env as menv  # noqa: E402  (tests/sagemaker/, on sys.path through tests/conftest.py)

TS = re.compile(r"-\d{14}$")
# The placeholder role's account is AWS's documentation example, shown on purpose in the parameters cell.
ALLOWED = _public_registry_accounts() | {"111122223333"}


def _outputs(executed: Path) -> str:
    """Everything the executed notebook shows below its cells (text, tables, errors)."""
    import json

    nb = json.loads(executed.read_text())
    return json.dumps([c.get("outputs", []) for c in nb["cells"]])


def _check(vals, plan, executed: Path):
    assert vals["dry_run"] is True
    assert vals["n_jobs"] == len(plan.jobs)
    assert vals["total_cost_usd"] == pytest.approx(plan.total_cost_usd, abs=0.01)
    assert vals["total_gpu_hours"] == pytest.approx(plan.total_gpu_hours, abs=1e-3)
    assert vals["plan_names"] == plan.names
    assert [TS.sub("", n) for n in vals["job_names"]] == plan.names
    requests = (executed.with_suffix("") / "requests.txt").read_text()  # the requests: a file, a line in the cell
    assert requests.count("CreateTrainingJob request for") == 1  # show_requests=1; the rest as differences
    assert requests.count("as the first request except") == len(plan.jobs) - 1
    text = executed.read_text()
    assert f"{len(plan.jobs)} CreateTrainingJob requests (dry run: not sent): requests.txt" in text
    assert "CreateTrainingJob request for" not in text and longest_cell_output(executed) <= MAX_CELL_LINES
    menv.assert_clean(ALLOWED, text)
    menv.assert_clean(ALLOWED, requests)
    text += requests
    # printed requests carry no account id, not even the placeholder's
    assert "arn:aws:iam::<account-id>:role/fp8lab-sagemaker-execution-role" in text
    # the plan rests on measurements where they exist, and says which; the chart agrees with the plan
    assert vals["basis"] == list(plan.table()["basis"].dropna())
    curve = {(r["model"], r["precision"], r["instances"]): r for r in vals["curve"]}
    for j in plan.jobs:
        c = curve[j.spec.model, j.spec.precision, j.spec.instance_count]
        assert c["hours"] == pytest.approx(j.est_hours) and c["cost_usd"] == pytest.approx(j.cost_usd)
        assert c["measured"] == plan.estimate.basis(j.spec).startswith("measured ")


@pytest.mark.slow
def test_notebook_04_defaults_plan_the_blog_sweep_without_aws(tmp_path):
    res = run(["04"], {}, output_dir=tmp_path, progress=False)
    assert_notebook_prose_short(res[0].output)
    vals = read_glued(res[0].output)
    plan = L.plan_sweep(["llama-1b", "llama-7b"], ["bf16", "fp8"], [1, 2, 4], tokens=24_000_000_000,
                        role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET)
    _check(vals, plan, res[0].output)
    assert vals["n_jobs"] == 12 and vals["price_per_hour"] == 113.07 and vals["n_metric_rows"] == 0
    assert sorted({r["instances"] for r in vals["curve"]}) == list(range(1, 9))  # chart_instances = 8
    # one answer: the chart's one-instance points are the time and cost the results quote (README, notebook 05)
    from fp8lab import analysis

    answer = analysis.Answer.of(analysis.summarize_runs(analysis.load_runs()))
    curve = {(r["model"], r["precision"], r["instances"]): r for r in vals["curve"]}
    for model in ("llama-1b", "llama-7b"):
        row = answer.row(model, priced=True)  # the row the quoted cost rests on (a model may have a row per GPU)
        for prec in ("bf16", "fp8"):
            c = curve[model, prec, 1]
            assert c["hours"] == pytest.approx(row[f"hours_{prec}"])
            assert c["cost_usd"] == pytest.approx(row[f"cost_{prec}"])
    assert all(r["measured"] for r in vals["curve"])  # llama-1b and llama-7b were measured in both precisions
    nb = json.loads(res[0].output.read_text())
    figs = [o["metadata"]["fp8lab"] for c in nb["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(figs) == 2 and figs[0]["legend_entries"] == 4 and figs[0]["width_px"] <= 1600
    assert "\n" not in figs[0]["title"]  # one line; the basis is the cost table's column
    basis = " ".join(vals["basis"])
    assert "measured " in basis and "two-GPU" in basis
    # issue 32: the source's chart, tokens/s/GPU against instances, from the scaling model; a handful of lines
    # projections labelled as such; FP8 with FP8 all-gather coincides with FP8 here, so it is drawn once (issue 49)
    assert figs[1]["title"].startswith("Past one node, projected") and figs[1]["legend_entries"] == 4
    from figure_outputs import assert_figures_readable_and_saved

    assert assert_figures_readable_and_saved(res[0].output, res[0].output.with_suffix("")) == ["plan.png", "past_one_node.png"]
    at = {(r["model"], r["instances"], r["mode"]): r for r in vals["at_scale"]}
    assert {n for _, n, _ in at} == {1, 2, 4} and {m for *_, m in at} == {"bf16", "fp8", "fp8 + fp8 all-gather"}
    for j in plan.jobs:  # the scaling table's BF16/FP8 rows are the plan's own hours
        assert at[j.spec.model, j.spec.instance_count, j.spec.precision]["hours"] == pytest.approx(j.est_hours)


@pytest.mark.slow
def test_notebook_04_under_plain_papermill_takes_a_list_as_a_string(tmp_path):
    """``papermill -p instance_counts "[1, 2, 4, 8]"`` hands the notebook a string: it is read as the list, and
    the plan, the chart's planned points and the scaling table follow it; an old parameter name is refused."""
    import papermill as pm

    out = tmp_path / "04.ipynb"
    pm.execute_notebook(str(NOTEBOOK_DIR / "04_launch_p5_sweep.ipynb"), str(out), cwd=str(tmp_path),
                        parameters={"instance_counts": "[1, 2, 4, 8]"}, kernel_name=default_kernel(), progress_bar=False)
    vals = read_glued(out)
    assert vals["n_jobs"] == 16 and {r["instances"] for r in vals["at_scale"]} == {1, 2, 4, 8}
    nb = json.loads(out.read_text())
    shown = "".join("".join(o["data"]["text/markdown"]) for c in nb["cells"] for o in c.get("outputs", [])
                    if "text/markdown" in o.get("data", {}))
    assert "16 jobs" in shown and "the start-up paid per instance" in shown
    with pytest.raises(pm.PapermillExecutionError, match="token_budget was renamed tokens"):
        pm.execute_notebook(str(NOTEBOOK_DIR / "04_launch_p5_sweep.ipynb"), str(tmp_path / "old.ipynb"), cwd=str(tmp_path),
                            parameters={"token_budget": 1e9}, kernel_name=default_kernel(), progress_bar=False)


def test_notebook_04_custom_sweep(tmp_path):
    params = {"models": ["llama-1b", "gptneo-1.3b"], "precisions": ["bf16", "fp8"], "instance_counts": [1, 2],
              "tokens": 2_000_000_000, "price_per_hour": 98.32, "region": "us-west-2"}
    res = run(["04"], params, output_dir=tmp_path, progress=False)
    vals = read_glued(res[0].output)
    plan = L.plan_sweep(params["models"], params["precisions"], params["instance_counts"], tokens=params["tokens"],
                        price_per_hour=98.32, region="us-west-2", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET)
    _check(vals, plan, res[0].output)
    assert vals["n_jobs"] == 8 and vals["price_per_hour"] == 98.32
    assert "us-west-2.amazonaws.com/pytorch:2.13-cu133-amzn2023-sagemaker" in (res[0].output.with_suffix("") / "requests.txt").read_text()


endpoint, aws = menv.endpoint, menv.aws  # fixtures: moto's server and a clean account


def test_notebook_04_real_launch_against_moto_and_idempotent_rerun(aws, tmp_path):
    """dry_run=False end to end against the local endpoint; a papermill rerun launches nothing new."""
    import io
    import json
    import tarfile

    sess, rec, boto = aws
    params = {"models": ["llama-1b"], "precisions": ["bf16", "fp8"], "instance_counts": [1], "tokens": 10**8,
              "role": menv.ROLE, "bucket": menv.BUCKET, "dry_run": False}
    res1 = run(["04"], params, output_dir=tmp_path / "a", progress=False)[0]
    menv.assert_clean(ALLOWED - {"111122223333"}, _outputs(res1.output), (tmp_path / "a" / "04_launch_p5_sweep" / "requests.txt").read_text())
    first = read_glued(res1.output)
    assert first["dry_run"] is False and len(first["job_names"]) == 2 and first["n_metric_rows"] == 0
    sm = boto.client("sagemaker")
    assert sorted(j["TrainingJobName"] for j in sm.list_training_jobs()["TrainingJobSummaries"]) == sorted(first["job_names"])
    # The jobs "finish": their metrics.jsonl lands where SageMaker puts /opt/ml/output/data.
    for name in first["job_names"]:
        buf = io.BytesIO()
        payload = "".join(json.dumps({"step": s, "loss": 5.0 - s / 10, "tokens_per_sec_per_gpu": 1000.0 + s})
                          + "\n" for s in (1, 2)).encode()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            info = tarfile.TarInfo("metrics.jsonl")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        boto.client("s3").put_object(Bucket=menv.BUCKET, Key=f"fp8lab/p5-sweep/output/{name}/output/output.tar.gz",
                                     Body=buf.getvalue())
    res = run(["04"], params, output_dir=tmp_path / "b", progress=False)[0]
    second = read_glued(res.output)
    assert second["job_names"] == first["job_names"]  # skipped, not relaunched
    assert len(sm.list_training_jobs()["TrainingJobSummaries"]) == 2
    assert second["n_metric_rows"] == 4
    text = res.output.read_text()
    assert text.count("skip fp8lab-llama-1b-") == 2
    # Papermill writes the parameters passed (the role ARN) into its injected cell; the outputs carry none.
    menv.assert_clean(ALLOWED - {"111122223333"}, _outputs(res.output))
    assert (tmp_path / "b" / "04_launch_p5_sweep" / "sweep_metrics.csv").is_file()
