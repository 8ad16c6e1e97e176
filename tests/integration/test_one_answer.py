"""One answer everywhere (issue 29): the README's results block, docs/results.md (headline and verdict),
the HTML report and `fp8lab launch plan` quote the numbers of one ``analysis.Answer``, computed once
from the committed runs. Each rendering is parsed back and compared with it; notebooks 04 and 05 are
checked in their own tests (test_launch_notebook.py, test_notebook_05.py) against the same object."""
from __future__ import annotations

import html
import re

import pandas as pd
import pytest

from fp8lab.model.models import MODEL_CONFIGS

from fp8lab import analysis
from fp8lab.views import report
from fp8lab import launch as L
from fp8lab.core.paths import REPO_ROOT
from committed_answer import committed_answer

_answer = committed_answer  # read once per test process (tests/helpers/committed_answer.py)


def _num(text: str) -> float:
    return float(text.replace(",", "").replace("$", "").rstrip("x%h ").strip())


def _answer_rows() -> pd.DataFrame:
    """The answer's rows by (model, GPU): a model measured on two GPUs heads a row for each (session 26)."""
    rows = _answer().rows
    return rows.set_index([rows["model"], rows["gpu_name"].str.removeprefix("NVIDIA ")])


def _headline_rows(markdown: str) -> dict[tuple[str, str], list[str]]:
    """(model, GPU) -> cells of the headline table (README block or docs/results.md); a row names its GPU ("m on
    H200") where the answer spans several, else the answer's one GPU is the row's."""
    lines = markdown.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| model | plain transformers BF16 |"))
    main = analysis.answer.main_gpu(_answer().rows).removeprefix("NVIDIA ")  # the GPU of a table whose rows name none
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        model, _, gpu = re.sub(r" \(\d+ GPUs\)", "", cells[0]).partition(" on ")
        rows[model, gpu or main] = cells
    return rows


def _check_headline(markdown: str, where: str) -> None:
    a = _answer_rows()
    rows = _headline_rows(markdown)
    main = analysis.answer.main_gpu(_answer().rows).removeprefix("NVIDIA ")
    named = any(" on " in cells[0] for cells in rows.values())
    # docs/results.md: every row of the answer, each naming its GPU; README: the rows of one GPU (others counted)
    assert sorted(rows) == sorted(k for k in a.index if named or k[1] == main), where
    cost = re.compile(r"([\d.,]+) h \$([\d,]+) -> ([\d.,]+) h \$([\d,]+)")
    for (model, gpu), cells in rows.items():
        r = a.loc[model, gpu]
        assert cells[2] == f"{r['tps_bf16']:,.0f}" and cells[3] == f"{r['tps_fp8']:,.0f}", (where, model)
        assert _num(cells[4].strip("*")) == pytest.approx(round(r["speedup"], 2)), (where, model)
        assert _num(cells[5]) == pytest.approx(round(100 * r["mfu_bf16"], 1)), (where, model)
        assert _num(cells[6]) == pytest.approx(round(100 * r["mfu_fp8"], 1)), (where, model)
        if cells[7] != "-":
            assert _num(cells[7]) == pytest.approx(round(r["loss_gap_pct"], 2)), (where, model)
        if pd.isna(r["cost_fp8"]):  # a model folder's shape (e.g. the families study): the plan prices named shapes only
            assert cells[8] == "-" and _unpriced_for_a_reason(r, model), (where, model, cells[8])
            continue
        # a model's row on another GPU than P5's quotes the cost of its row on P5's H100, and says so
        priced = _priced_on_p5(a, model, gpu)
        assert cells[8].endswith(" (priced from its runs on the H100 80GB)") == priced, (where, model, cells[8])
        m = cost.fullmatch(cells[8].removesuffix(" (priced from its runs on the H100 80GB)"))
        assert m, (where, model, cells[8])
        got = [_num(g) for g in m.groups()]
        want = [round(r["hours_bf16"], 1), round(r["cost_bf16"]), round(r["hours_fp8"], 1), round(r["cost_fp8"])]
        assert got == pytest.approx(want), (where, model)


def _unpriced_for_a_reason(r: pd.Series, model: str) -> bool:
    """No plan prices this row: a model folder's shape (plans price named shapes), or runs in a memory mode (one GPU's
    way to fit; a P5 job shards the states and is priced from plain-mode runs)."""
    return model not in MODEL_CONFIGS or "--memory" in str(r["cost_note"])


def _priced_on_p5(a: pd.DataFrame, model: str, gpu: str) -> bool:
    """Whether ``model`` has a priced row measured on P5's H100 and ``gpu`` is another GPU."""
    p5 = [g for m, g in a.index if m == model and g.startswith("H100 80GB") and pd.notna(a.loc[m, g]["cost_fp8"])]
    if p5 and not gpu.startswith("H100 80GB"):  # then this row quotes that row's time and cost
        assert a.loc[model, gpu]["cost_fp8"] == a.loc[model, p5[0]]["cost_fp8"], (model, gpu)
        return True
    return False


_SENTENCE = re.compile(r"For (?P<model>[\w.-]+) on \d+ GPUs? of (?:NVIDIA )?(?P<gpu>[^,]+), .*? \(run (?P<fp8>[^)]+)\) "
                       r"ran at (?P<speedup>[\d.]+)x the tokens/s/GPU of .*? \(run (?P<bf16>[^)]+)\) \((?P<tps_fp8>[\d,]+) vs (?P<tps_bf16>[\d,]+)\); planned on one "
                       r"\S+ at \$[\d.,]+(?: per instance-hour|/instance-hour, as of [\d-]+(?: \([^)]*\))?) "
                       r"\(the estimate of fp8lab launch plan(?P<priced>, priced from its "
                       r"runs on the H100 80GB)?\), [\w.]+ tokens would take "
                       r"(?P<h_fp8>[\d.,]+) h and cost \$(?P<c_fp8>[\d,]+) instead of (?P<h_bf16>[\d.,]+) h and "
                       r"\$(?P<c_bf16>[\d,]+)")


_FOLDER_SENTENCE = re.compile(r"For (?P<model>[\w.-]+) on \d+ GPUs? of (?:NVIDIA )?(?P<gpu>[^,]+), .*? \(run (?P<fp8>[^)]+)\) "
                              r"ran at (?P<speedup>[\d.]+)x the "
                              r"tokens/s/GPU of .*? \(run (?P<bf16>[^)]+)\) \((?P<tps_fp8>[\d,]+) vs (?P<tps_bf16>[\d,]+)\); "
                              r"no time or cost: (?:(?P=model) is a model folder's shape|its runs trained with --memory)")


def _check_verdict(text: str, where: str) -> None:
    a = _answer_rows()
    # one sentence per model, each starting "For <model> on": matched one at a time, so none runs into the next
    sentences = [t for t in re.split(r"(?=For [\w.-]+ on )", text) if t.startswith("For ")]
    found = {}
    for t in sentences:
        m = _SENTENCE.match(t) or _FOLDER_SENTENCE.match(t)
        assert m, (where, t[:120])
        found[m["model"], m["gpu"]] = m
    hardware = a[a["hardware_fp8"] == True]  # noqa: E712
    assert sorted(found) == sorted(hardware.index), (where, sorted(found))
    for (model, gpu), m in found.items():
        r = a.loc[model, gpu]
        assert (m["fp8"], m["bf16"]) == (r["fp8_run"], r["bf16_run"]), (where, model)
        assert float(m["speedup"]) == pytest.approx(round(r["speedup"], 2)), (where, model)
        assert _num(m["tps_fp8"]) == round(r["tps_fp8"]) and _num(m["tps_bf16"]) == round(r["tps_bf16"]), (where, model)
        if "h_fp8" not in m.groupdict():  # a model folder's shape: no plan prices it, and the answer has no cost
            assert pd.isna(r["cost_fp8"]) and _unpriced_for_a_reason(r, model), (where, model)
            continue
        assert bool(m["priced"]) == _priced_on_p5(a, model, gpu), (where, model, gpu)
        assert [_num(m[k]) for k in ("h_fp8", "c_fp8", "h_bf16", "c_bf16")] == pytest.approx(
            [round(r["hours_fp8"], 1), round(r["cost_fp8"]), round(r["hours_bf16"], 1), round(r["cost_bf16"])]), (where, model)


_BULLET = re.compile(r"- \*\*(?P<model>[\w.-]+)\*\*: FP8 \*\*(?P<speedup>[\d.]+)x\*\* BF16's tokens/s/GPU "
                     r"\((?:NVIDIA )?(?P<gpu>[^)]+)\)(?P<rest>.*)")
_BULLET_COST = re.compile(r"tokens on one \S+: (?P<h_fp8>[\d.,]+) h \$(?P<c_fp8>[\d,]+) instead of "
                          r"(?P<h_bf16>[\d.,]+) h \$(?P<c_bf16>[\d,]+)")


def _check_bullets(text: str, where: str) -> None:
    """The verdict's bullets (docs/results.md, the HTML report, notebook 05): a bullet per row of the answer, each with
    its speed-up and, where priced, the answer's time and cost."""
    a = _answer_rows()
    found = {}
    for line in text.splitlines():
        m = _BULLET.match(line.strip())
        if m:
            found[m["model"], m["gpu"]] = m
    assert sorted(found) == sorted(a[a["speedup"].notna()].index), (where, sorted(found))
    for (model, gpu), m in found.items():
        r = a.loc[model, gpu]
        assert float(m["speedup"]) == pytest.approx(round(r["speedup"], 2)), (where, model, gpu)
        cost = _BULLET_COST.search(m["rest"])
        assert bool(cost) == pd.notna(r["cost_fp8"]), (where, model, gpu)
        if cost:
            assert [_num(cost[k]) for k in ("h_fp8", "c_fp8", "h_bf16", "c_bf16")] == pytest.approx(
                [round(r["hours_fp8"], 1), round(r["cost_fp8"]), round(r["hours_bf16"], 1), round(r["cost_bf16"])]), (where, model)


def test_the_answer_rests_on_the_headline_runs_and_the_plans_estimate():
    a = _answer()
    rows = a.rows.set_index("model")
    assert {"llama-1b", "llama-7b"} <= set(rows.index)
    for model in ("llama-1b", "llama-7b"):
        r = a.row(model, priced=True)  # (llama-1b ran on P5's H100 and an H200: the row its cost rests on)
        assert r["speedup"] == pytest.approx(r["tps_fp8"] / r["tps_bf16"])
        for prec in ("bf16", "fp8"):  # the plan's formula, by hand: tokens over 8 GPUs at the planned rate + start-up
            rate = a.estimate.rate(model, prec, run_id=r[f"{prec}_run"])
            hours = (24e9 / (rate["tokens_per_sec_per_gpu"] * 8) + a.estimate.startup_s) / 3600
            assert r[f"hours_{prec}"] == pytest.approx(hours) and r[f"cost_{prec}"] == pytest.approx(hours * 113.07)
        assert r["why_bf16"] and r["why_fp8"]


def test_readme_and_results_doc_quote_the_answer():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split(report.README_BEGIN)[1].split(report.README_END)[0]
    _check_headline(block, "README.md")
    results = (REPO_ROOT / report.RESULTS_MD).read_text(encoding="utf-8")
    _check_headline(results, report.RESULTS_MD)
    verdict = results.split("## Verdict")[1].split("## Why faster than the blog")[0]
    _check_bullets(verdict, report.RESULTS_MD + " verdict")
    assert "For comparison, the source blog reported" in verdict and "In short: " in verdict


def test_html_report_quotes_the_answer():
    page = report.render_html(analysis.load_runs())
    block = page.split('<div class="verdict">')[1].split("</div>")[0]
    items = [re.sub(r"</?b>", "**", html.unescape(t)) for t in re.findall(r"<li>(.*?)</li>", block)]  # a bullet each
    _check_bullets("\n".join(f"- {t}" for t in items), "HTML report")
    results = (REPO_ROOT / report.RESULTS_MD).read_text(encoding="utf-8")
    verdict = results.split("## Verdict")[1].split("## Why faster than the blog")[0]
    assert [f"- {t}" for t in items] == [line for line in verdict.splitlines() if line.startswith("- ")]  # one text
    table = html.unescape(page.split("The answer per model")[1].split("<h2>Figures</h2>")[0])  # P5 rows, then others
    for _, r in _answer().rows.iterrows():  # the answer table: each model's cost and time, as the answer has them
        # the model's row on this GPU (a model measured on two GPUs has a row each)
        row = next(part.split("</tr>")[0] for part in table.split(f"<td>{r['model']}</td>")[1:]
                   if f"<td>{r['gpu_name']}</td>" in part.split("</tr>")[0])
        for prec in ("bf16", "fp8"):
            if pd.isna(r[f"cost_{prec}"]):  # a model folder's shape: no plan prices it, the table says "-"
                assert "$" not in row and _unpriced_for_a_reason(r, r["model"]), (r["model"], prec)
                continue
            assert f"${r[f'cost_{prec}']:,.0f} ({r[f'hours_{prec}']:,.1f} h)" in row, (r["model"], prec)
        assert f"{r['speedup']:.2f}x" in table


def test_markdown_report_quotes_the_answer():
    """``fp8lab report --markdown`` writes the answer's verdict (its runs, speedups and planned costs)."""
    md = report.render_markdown(analysis.load_runs())
    verdict = next(p for p in md.split("\n\n") if p.startswith("For "))
    _check_verdict(verdict, "fp8lab report --markdown")
    assert _answer().verdict() in md


def test_launch_plan_prints_the_answers_time_and_cost(capsys):
    answer = _answer()
    assert L.main(["plan", "--models", "llama-1b", "llama-7b", "--instance-counts", "1"]) == 0  # default budget: 24e9
    out = capsys.readouterr().out
    for model in ("llama-1b", "llama-7b"):
        a = answer.row(model, priced=True).to_frame().T.set_index("model")  # the row the plan prices from (P5's GPU)
        for prec in ("bf16", "fp8"):
            row = next(l for l in out.splitlines() if re.search(rf"\b{model}\s+{prec}\s+1\s+8\s+24000000000\b", l))
            cells = row.split()
            assert float(cells[-1]) == pytest.approx(a.loc[model, f"cost_{prec}"], abs=0.01), (model, prec, row)
            assert float(cells[-3]) == pytest.approx(a.loc[model, f"hours_{prec}"], abs=0.01), (model, prec, row)
            basis = next(l for l in out.splitlines() if l.strip().startswith(f"{model} {prec} x1:"))
            assert f"measured {a.loc[model, f'{prec}_run']} " in basis  # the same run the answer rests on
