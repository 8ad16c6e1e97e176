"""The verdict (``verdict``): one paragraph, written from the comparison table (never by hand); its
time and cost are an Answer's (``fp8lab.analysis.answer``), never computed here.

Named ``conclusion`` so that ``fp8lab.analysis.verdict`` stays the function, not this module."""
from __future__ import annotations

import numpy as np
import pandas as pd

from fp8lab.analysis.labels import model_size_b
from fp8lab.analysis.load import reference_for
from fp8lab.analysis.parity import MIN_BAND_PCT, seeds_label
from fp8lab.core.hardware import INSTANCES, gpu_label


def fmt_tokens(n: float) -> str:
    """A token count the way the verdict says it: 24e9 -> "24B", 4.9e6 -> "4.9M"."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= div:
            return f"{n / div:.4g}{unit}"
    return f"{n:,.0f}"


def _where(r: pd.Series) -> str:
    """Where a comparison row ran: "8 GPUs of H100" or "a CPU (2 processes)"."""
    gpu = r["gpu_name"] if isinstance(r["gpu_name"], str) else "an unnamed GPU"
    n = int(r["world_size"]) if pd.notna(r["world_size"]) else None
    scale = f"{n} GPU{'s' if n != 1 else ''}" if n else "an unknown number of GPUs"
    return f"a CPU ({n} process{'es' if n and n > 1 else ''})" if gpu.lower() == "cpu" else f"{scale} of {gpu}"


def _speed_sentence(model: str, r: pd.Series) -> str:
    """The speedup clause for one model's chosen row (time and cost: only with an Answer, the plan's estimate)."""
    lay = f" at {r['layout']}" if isinstance(r.get("layout"), str) and r["layout"] != "-" else ""
    s = (f"For {model} on {_where(r)}, {r['fp8_variant']}{lay} (run {r['fp8_run']}) ran at {r['speedup']:.2f}x "
         f"the tokens/s/GPU of {r['baseline_variant']} (run {r['baseline_run']}) "
         f"({r['tps_fp8']:,.0f} vs {r['tps_baseline']:,.0f})")
    if not r["hardware_fp8"]:
        s += (", but its FP8 was emulated in PyTorch or ran on a CPU: a numerics study, not a measurement "
              "of FP8 speed or cost")
    return s


def _loss_gap(valid: pd.DataFrame) -> tuple[str | None, float]:
    """The loss gap of the first valid pair: (kind, percent), preferring validation loss; (None, nan) if none."""
    gap_kind, gap = None, np.nan
    if len(valid):
        v = valid.iloc[0]
        if pd.notna(v["val_loss_gap_pct"]):
            gap_kind, gap = "validation loss", v["val_loss_gap_pct"]
        elif pd.notna(v["loss_gap_pct"]):
            gap_kind, gap = "smoothed training loss", v["loss_gap_pct"]
    return gap_kind, gap


def _bf16_label(a) -> str:
    """What a headline's loss gap is relative to: BF16, or the mean of several BF16 seeds and how far apart they
    were."""
    n = a.get("loss_bf16_seeds")
    return seeds_label(n, a["loss_bf16_spread_pct"]) if pd.notna(n) and n > 1 else "BF16"


def _loss_clause(r: pd.Series, valid: pd.DataFrame, gap_kind: str | None, gap: float) -> str:
    """The loss clause: the gap (from this run or a longer one), or why no gap is given. Against several BF16 seeds
    it names them and says whether the gap is inside the band of their spread."""
    if gap_kind:
        v = valid.iloc[0]
        n = v.get("bf16_seeds", 1)
        several = pd.notna(n) and n > 1
        vs = v["baseline_variant"] if several else "BF16"
        band = ""
        if several and pd.notna(v.get("in_band")):
            where = "inside" if v["in_band"] else ("outside (below)" if gap < 0 else "outside (above)")
            band = f", {where} the band of max({MIN_BAND_PCT:g}%, the seeds' spread)"
    if gap_kind and valid.iloc[0]["fp8_run"] == r["fp8_run"]:
        return (f"; after the same {fmt_tokens(valid.iloc[0]['tokens_fp8'])} tokens its {gap_kind} was "
                f"{gap:+.2f}% relative to {vs}{band}")
    if gap_kind:  # speed from a throughput run, loss from a longer run of the same model
        runs = f"the BF16 seeds {v['baseline_run']}" if several else v["baseline_run"]
        return (f"; in a longer run of the same model ({v['fp8_variant']} against "
                f"{vs if several else v['baseline_variant']}, runs {v['fp8_run']} and {runs}, "
                f"{fmt_tokens(v['tokens_fp8'])} tokens each, study {v['study']}) the FP8 {gap_kind} was "
                f"{gap:+.2f}% relative to {'that mean' if several else 'BF16'}{band}")
    if "non-finite loss" in str(r.get("note", "")):
        return "; its loss was non-finite (NaN/Inf, flagged in the runs table), so no loss gap is given"
    if len(valid):
        return "; no loss was recorded, so the loss gap is unknown"
    if "throughput run" in str(r.get("note", "")):
        return "; these are short throughput runs, so their loss is not compared here"
    return "; the BF16 and FP8 runs did not see the same tokens, so their loss is not compared"


def _scale_and_reference_clause(comp: pd.DataFrame, model: str, r: pd.Series,
                                reference: pd.DataFrame | None) -> str:
    """The speedup range across scales (if several) and the source's figure for this size (if any)."""
    s = ""
    scales = comp[(comp["model"] == model) & (comp["fp8_variant"] == r["fp8_variant"])]
    if scales["world_size"].nunique() > 1:
        s += (f"; across {scales['world_size'].min():g} to {scales['world_size'].max():g} GPUs its speedup "
              f"ranged from {scales['speedup'].min():.2f}x to {scales['speedup'].max():.2f}x")
    same = reference_for(reference, model)
    if len(same):
        s += f" (the source reported {same['speedup'].iloc[0]:.2f}x at {same['model_size'].iloc[0]})"
    return s


def _bucket(model: str, r: pd.Series, gap_kind: str | None, gap: float,
            loss_tolerance_pct: float) -> tuple[str, str]:
    """Which conclusion a model falls under, and how it is named there."""
    if not r["hardware_fp8"]:
        return "emulated", model + (f" (its loss is within {loss_tolerance_pct:g}% of BF16's)" if gap_kind and
                                    abs(gap) <= loss_tolerance_pct else "")
    if r["speedup"] <= 1.0:
        return "slower", model
    if gap_kind and gap > loss_tolerance_pct:
        return "faster_worse", model
    if gap_kind:
        return "pays", model
    return "pays_unknown_loss", model


def _instance_gpus(instance_type: str) -> str:
    """E.g. '8 H100s' for ml.p5.48xlarge."""
    info = INSTANCES[instance_type]
    return f"{info.gpus} {info.gpu.split()[0]}s"


def _in_short(buckets: dict[str, list[str]], loss_tolerance_pct: float) -> str:
    """The closing "In short: ..." sentence from the models in each conclusion (a model measured on two GPUs once)."""
    buckets = {k: list(dict.fromkeys(v)) for k, v in buckets.items()}
    pays, pays_unknown_loss, faster_worse = buckets["pays"], buckets["pays_unknown_loss"], buckets["faster_worse"]
    slower, emulated = buckets["slower"], buckets["emulated"]
    concl = []
    if pays:
        concl.append(f"FP8 pays off for {', '.join(pays)} (faster, loss at most {loss_tolerance_pct:g}% above BF16's)")
    if pays_unknown_loss:
        concl.append(f"FP8 is faster for {', '.join(pays_unknown_loss)}, but these runs do not show its loss")
    if faster_worse:
        concl.append(f"for {', '.join(faster_worse)} FP8 is faster but its loss is more than "
                     f"{loss_tolerance_pct:g}% above BF16's")
    if slower:
        concl.append(f"for {', '.join(slower)} FP8 is not faster than BF16")
    if emulated:
        concl.append(f"for {', '.join(emulated)} these runs cannot say whether FP8 is faster (no FP8 hardware)")
    return "In short: " + "; ".join(concl) + "."


def _reference_sentence(reference: pd.DataFrame) -> str:
    """The source blog's reported figures, labelled as not measured here."""
    refs = ", ".join(f"{r['speedup']:.2f}x and ~{r['loss_gap_pct']:g}% higher loss at {r['model_size']}"
                     for _, r in reference.iterrows())
    return (f"For comparison, the source blog reported (not measured here) {refs} on "
            f"{reference['hardware'].iloc[0]}.")


def _answer_parts(answer, comp: pd.DataFrame, loss_tolerance_pct: float) -> tuple[list[str], dict[str, list[str]]]:
    """The per-model sentences and conclusions from an :class:`fp8lab.analysis.Answer`: its runs, its
    speedup, its loss gap and its time and cost (the plan's estimate), nothing recomputed."""
    parts, buckets = [], {k: [] for k in ("pays", "pays_unknown_loss", "faster_worse", "slower", "emulated")}
    for _, a in answer.rows[answer.rows["speedup"].notna()].iterrows():
        model = a["model"]
        pair = comp[(comp["model"] == model) & (comp["fp8_run"] == a["fp8_run"])
                    & (comp["baseline_run"] == a["bf16_run"])]
        r = pd.Series({"gpu_name": a["gpu_name"], "world_size": a["world_size"], "fp8_variant": a["fp8_variant"],
                       "fp8_run": a["fp8_run"], "hardware_fp8": bool(a["hardware_fp8"]), "speedup": a["speedup"],
                       "note": pair["note"].iloc[0] if len(pair) else ""})
        s = (f"For {model} on {_where(r)}, {a['fp8_variant']} at {a['fp8_layout']} (run {a['fp8_run']}) ran at "
             f"{a['speedup']:.2f}x the tokens/s/GPU of {a['bf16_variant']} at {a['bf16_layout']} (run {a['bf16_run']}) "
             f"({a['tps_fp8']:,.0f} vs {a['tps_bf16']:,.0f})")
        if not r["hardware_fp8"]:
            s += (", but its FP8 was emulated in PyTorch or ran on a CPU: a numerics study, not a measurement "
                  "of FP8 speed or cost")
        elif pd.notna(a["cost_fp8"]):
            note = f", {a['cost_note']}" if a["cost_note"] else ""  # a priced row's note: which row's runs priced it
            s += (f"; planned on one {answer.instance_type} at {answer.price_note} "
                  f"(the estimate of fp8lab launch plan{note}), {fmt_tokens(answer.tokens)} tokens would take "
                  f"{a['hours_fp8']:,.1f} h and cost ${a['cost_fp8']:,.0f} instead of {a['hours_bf16']:,.1f} h and "
                  f"${a['cost_bf16']:,.0f} ({a['saved_pct']:.0f}% saved)")
        else:
            s += f"; {a['cost_note']}"
        gap_kind, gap = (a["loss_gap_kind"], a["loss_gap_pct"]) if isinstance(a["loss_study"], str) else (None, np.nan)
        several = pd.notna(a.get("loss_bf16_seeds")) and a.get("loss_bf16_seeds") > 1
        fp8_seeds = a.get("loss_fp8_seeds")
        fp8_several = several and pd.notna(fp8_seeds) and fp8_seeds > 1  # the mean of this FP8 set-up's seeds
        valid = pd.DataFrame([{"fp8_run": a["loss_fp8_runs"] if fp8_several else a["loss_fp8_run"],
                               "baseline_run": a["loss_bf16_runs"] if several else a["loss_baseline_run"],
                               "fp8_variant": a["loss_fp8_variant"] + (f" (the mean of {int(fp8_seeds)} seeds)"
                                                                       if fp8_several else ""),
                               "baseline_variant": _bf16_label(a),
                               "bf16_seeds": a.get("loss_bf16_seeds"), "in_band": a.get("loss_in_band"),
                               "tokens_fp8": a["loss_tokens"], "study": a["loss_study"]}]) if gap_kind else \
            pair[pair["valid"]] if len(pair) else pair
        s += _loss_clause(r, valid, gap_kind, gap) + _scale_and_reference_clause(comp, model, r, answer.reference)
        parts.append(s + ".")
        key, name = _bucket(model, r, gap_kind, gap, loss_tolerance_pct)
        buckets[key].append(name)
    return parts, buckets


def verdict(comparison: pd.DataFrame, reference: pd.DataFrame | None = None, loss_tolerance_pct: float = 1.0,
            answer=None) -> str:
    """A one-paragraph verdict written from the comparison table (never by hand): :func:`verdict_parts`, joined."""
    per_model, closing = verdict_parts(comparison, reference, loss_tolerance_pct, answer)
    return " ".join(per_model + closing)


def verdict_parts(comparison: pd.DataFrame, reference: pd.DataFrame | None = None, loss_tolerance_pct: float = 1.0,
                  answer=None) -> tuple[list[str], list[str]]:
    """The verdict's sentences: (one per model, the rest: the conclusion or why there is none, and the
    source's figures); a page may set each model apart, the paragraph joins them.

    With ``answer`` (an :class:`fp8lab.analysis.Answer`, what every view of the results renders; its
    ``verdict()`` passes itself) each model's sentence states the answer's runs, speedup, loss gap and
    planned time and cost: the only costs a verdict quotes (the plan's estimate, one formula). Without
    one, per model it takes the fastest FP8 variant at the smallest scale measured and states its
    speedup and loss gap (only from runs that saw the same tokens); then the source's reported
    figures, labelled as such. Missing pieces are said, not guessed.
    """
    if not (isinstance(loss_tolerance_pct, (int, float)) and loss_tolerance_pct >= 0):
        raise ValueError(f"loss_tolerance_pct={loss_tolerance_pct!r}; allowed: a number >= 0 (percent)")
    parts: list[str] = []
    comp = comparison[comparison["speedup"].notna()] if len(comparison) else comparison
    if answer is not None and answer.rows["speedup"].notna().any():
        parts, buckets = _answer_parts(answer, comp, loss_tolerance_pct)
        closing = [_in_short(buckets, loss_tolerance_pct)]
    elif not len(comp) or answer is not None:
        closing = ["There are no measured BF16/FP8 pairs yet (no runs of the same model and scale in both "
                   "precisions), so this report cannot say from its own numbers whether FP8 pays off."]
    else:
        buckets: dict[str, list[str]] = {k: [] for k in ("pays", "pays_unknown_loss", "faster_worse", "slower",
                                                          "emulated")}
        by_size = sorted(comp["model"].unique(), key=lambda m: (np.nan_to_num(model_size_b(m), nan=np.inf), str(m)))
        for model in by_size:
            g = comp[comp["model"] == model]
            g = g.sort_values(["world_size", "instances", "speedup"], ascending=[True, True, False])
            r = g.iloc[0]
            valid = g[g["valid"]]
            gap_kind, gap = _loss_gap(valid)
            s = (_speed_sentence(model, r)
                 + _loss_clause(r, valid, gap_kind, gap) + _scale_and_reference_clause(comp, model, r, reference))
            parts.append(s + ".")
            key, name = _bucket(model, r, gap_kind, gap, loss_tolerance_pct)
            buckets[key].append(name)
        closing = [_in_short(buckets, loss_tolerance_pct)]
    if reference is not None and len(reference):
        closing.append(_reference_sentence(reference))
    return parts, closing


def clauses(sentence: str) -> list[str]:
    """A verdict sentence as its clauses, for a page that lists them: :func:`verdict_parts` joins a model's
    statements (what it ran at, its planned time and cost, its loss, ...) with "; " outside parentheses."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(sentence):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and sentence.startswith("; ", i):
            out.append(sentence[start:i])
            start = i + 2
    return out + [sentence[start:]]


# the verdict as a handful of bullets, one per model, each with its number ---------------------------------
def _seed_clause(a: pd.Series, curves: pd.DataFrame | None) -> str:
    """A loss gap that is a mean of seeds: how many, how far apart, and which seed lies outside the band."""
    fp8_runs = [r.strip() for r in str(a.get("loss_fp8_runs") or "").split(",") if r.strip()]
    if curves is None or not len(curves) or len(fp8_runs) < 2:
        return ""
    last = curves[curves["run_id"].isin(fp8_runs)].sort_values("step").groupby("run_id").last()
    if not len(last):
        return ""
    gaps = last["gap_pct"]
    out = last[gaps.abs() > last["band_pct"]]
    s = f"; its seeds {gaps.min():+.2f}% to {gaps.max():+.2f}%"
    for rid, r in out.iterrows():
        seed = f"seed {int(r['seed'])}" if "seed" in r and pd.notna(r["seed"]) else rid
        s += f", {seed} outside the ±{r['band_pct']:.2f}% band of BF16's seed noise"
    return s


def verdict_bullets(answer, curves: pd.DataFrame | None = None, loss_tolerance_pct: float = 1.0,
                    same_loss: pd.DataFrame | None = None) -> list[str]:
    """The verdict a person reads in seconds: one Markdown bullet per model with its numbers (speed-up, loss gap,
    time and cost of the token budget, and why that cost differs from the speed-up), then the conclusion.
    ``curves``: :func:`fp8lab.analysis.parity_curves` of the loss study, to give a seed mean its spread;
    ``same_loss``: :func:`fp8lab.analysis.time_to_loss.time_to_loss`, FP8's time to BF16's final validation loss."""
    same = same_loss.set_index("model") if same_loss is not None and len(same_loss) else None
    rows = answer.rows[answer.rows["speedup"].notna()]
    if not len(rows):
        return ["- There are no measured BF16/FP8 pairs yet, so these results cannot say whether FP8 pays off."]
    out, buckets = [], {k: [] for k in ("pays", "pays_unknown_loss", "faster_worse", "slower", "emulated")}
    for _, a in rows.iterrows():
        where = "a CPU, emulated: not a speed claim" if not a["hardware_fp8"] else f"{a['gpu_name']}"
        s = f"- **{a['model']}**: FP8 **{a['speedup']:.2f}x** BF16's tokens/s/GPU ({where})"
        gap = a["loss_gap_pct"] if isinstance(a["loss_study"], str) else np.nan
        if pd.notna(gap):
            seeds, fp8_n = a.get("loss_bf16_seeds"), a.get("loss_fp8_seeds")
            vs = f"the mean of {int(seeds)} BF16 seeds" if pd.notna(seeds) and seeds > 1 else "BF16"
            mean = f"the mean of {int(fp8_n)} FP8 seeds against " if pd.notna(fp8_n) and fp8_n > 1 else "against "
            s += f"; validation loss **{gap:+.2f}%** ({mean}{vs}{_seed_clause(a, curves)})"
        else:
            s += "; loss not compared in a loss study"
        if same is not None and a["model"] in same.index:
            t = same.loc[a["model"]]
            s += ("; FP8 did not reach BF16's final validation loss in the study" if pd.isna(t["fp8_tokens"]) else
                  f"; to BF16's final validation loss **{t['time_ratio']:.2f}x** BF16's time ({t['token_ratio']:.2f}x "
                  "the tokens)")
        if a["hardware_fp8"] and pd.notna(a["cost_fp8"]):
            ratio = a["hours_bf16"] / a["hours_fp8"]
            s += (f"; {fmt_tokens(answer.tokens)} tokens on one {answer.instance_type}: {a['hours_fp8']:,.1f} h "
                  f"${a['cost_fp8']:,.0f} instead of {a['hours_bf16']:,.1f} h ${a['cost_bf16']:,.0f} "
                  f"at {answer.price_note} "
                  f"({ratio:.2f}x sooner: projected to {_instance_gpus(answer.instance_type)}, not the one "
                  f"{gpu_label(a['gpu_name'])} measured" + (f"; {a['cost_note']})" if a["cost_note"] else ")"))
        out.append(s)
        r = pd.Series({"hardware_fp8": bool(a["hardware_fp8"]), "speedup": a["speedup"]})
        key, name = _bucket(a["model"], r, "loss" if pd.notna(gap) else None, gap, loss_tolerance_pct)
        buckets[key].append(name)
    out.append("- " + _in_short(buckets, loss_tolerance_pct))
    if answer.reference is not None and len(answer.reference):
        out.append("- " + _reference_sentence(answer.reference))
    return out
