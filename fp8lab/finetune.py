"""Fine-tune a model folder on instruction data in BF16 and in FP8, in full and with LoRA, and put the losses on the
held-out answers side by side; and what such a fine-tune would cost on SageMaker P5, as the launch planner estimates
it. Notebook 06 is a thin page over it::

    ft = run_fine_tunes("my-llama/", steps=300)    # four runs: full and LoRA, each BF16 and FP8
    ft.table                                         # the held-out answer loss of each, its gap to the baseline
    fine_tune_figure(ft)                             # one bar per run
    p5_cost("llama-1b", tokens=100_000_000)          # the same fine-tunes as SageMaker jobs: hours and dollars

Each method is a pair of :func:`fp8lab.trainpair.run_pair` (same seed, weights and batches for BF16 and FP8) with
``--task sft`` (answer-only loss, packed rows, a held-out split: fp8lab.data.sft); LoRA adds ``--lora-rank``
(fp8lab's adapters on the fused blocks, what ``--fuse auto`` builds). On a CPU the FP8 runs are emulated: their
loss is meaningful, their speed is not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from fp8lab.core.hardware import PLACEHOLDER_BUCKET, PLACEHOLDER_ROLE
from fp8lab.core.validate import AUTO, is_num
from fp8lab.data import model_tokenizer, sft
from fp8lab.launch.plan import plan_sweep
from fp8lab.model.models import get_config
from fp8lab.plan.config import LORA_DEFAULTS
from fp8lab.plan.options import PRECISIONS
from fp8lab.records.data_format import SFT, text_files
from fp8lab.trainpair import PairResult, auto_lr, run_pair

METHODS = ("full", "lora")
# lora_lr="auto": this many times the full fine-tune's learning rate (the adapters start at zero and are few; LoRA is
# commonly run at several times a full fine-tune's rate)
LORA_LR_FACTOR = 5


@dataclass
class FineTuneResult:
    """The pair of each method and the runs in one table."""

    pairs: dict[str, PairResult]  # "full" | "lora" -> its BF16/FP8 pair
    table: Any  # pandas DataFrame: one row per run (method and label)
    device: str
    note: str

    @property
    def trained(self) -> bool:
        return all(p.trained for p in self.pairs.values())

    def glued(self) -> dict[str, Any]:
        """The runs' numbers by "<method> <run>" (a notebook glues them; tests read them back)."""
        t = self.table
        key = [f"{m} {r}" for m, r in t.index]
        return {"device": self.device, "runs": key,
                **{col: dict(zip(key, (None if v != v else float(v) for v in t[col])))
                   for col in ("first_loss", "heldout_answer_loss", "gap_pct")},
                "steps": dict(zip(key, (int(v) for v in t["steps"]))),
                "trained_params": dict(zip(key, (None if v is None or v != v else int(v)
                                                 for v in t["trained_params"])))}


def run_fine_tunes(model: str, steps: int, backends: Sequence[str] = ("auto",), recipe: str = "auto",
                   lora_rank: int = 8, lr: float | str = "auto", lora_lr: float | str = "auto",
                   output_dir: str | Path = "runs", data: str | None = None, dry_run: bool = False,
                   **options: Any) -> FineTuneResult:
    """A full fine-tune and a LoRA fine-tune of ``model`` (a folder with its tokenizer, or a named shape), each in BF16
    and in FP8 per backend, on ``data`` (instruction JSONL; None: the shipped set). ``lr``: the full fine-tune's
    ("auto": fp8lab.trainpair.auto_lr); ``lora_lr``: LoRA's ("auto": :data:`LORA_LR_FACTOR` times the full one's).
    ``options`` go to every run (TrainConfig's names; the LoRA ones, e.g. ``lora_alpha``, to the LoRA runs only); the
    runs go to ``output_dir``/full and ``output_dir``/lora."""
    import pandas as pd  # pandas loads only when runs are made

    for own in ("task", "lora_rank", "data"):
        if own in options:
            raise ValueError(f"run_fine_tunes sets {own!r} itself; pass lora_rank and data as arguments")
    if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 1:
        raise ValueError(f"lora_rank={lora_rank!r} is invalid; allowed: a positive integer, e.g. 8")
    for name, value in (("lr", lr), ("lora_lr", lora_lr)):
        if value != AUTO and (not is_num(value) or not 0 < value < 1):
            raise ValueError(f"{name}={value!r} is invalid; allowed: \"auto\" or a number in (0, 1)")
    if lora_lr == AUTO:
        lora_lr = LORA_LR_FACTOR * (auto_lr(get_config(model)) if lr == AUTO else lr)
    out = Path(output_dir)
    lora_only = {k: v for k, v in options.items() if k in LORA_DEFAULTS}  # a full fine-tune refuses them
    common = {"task": SFT, **({"data": data} if data is not None else {}),
              **{k: v for k, v in options.items() if k not in lora_only}}
    per_method = {"full": {"lr": lr}, "lora": {"lora_rank": lora_rank, "lr": lora_lr, **lora_only}}
    pairs = {m: run_pair(model, steps, backends, recipe, output_dir=out / m, dry_run=dry_run,
                         **{**common, **per_method[m]}) for m in METHODS}
    rows = []
    for method, pair in pairs.items():
        if not pair.trained:
            continue
        for label, row in pair.table.iterrows():
            built = _built(pair.runs[label])
            trained = built.get("lora_adapter_params") if method == "lora" else built.get("params")
            rows.append({"method": method, "run": label, "precision": row["precision"], "backend": row["backend"],
                         "steps": row["steps"], "trained_params": trained,
                         "first_loss": row["first_loss"], "heldout_answer_loss": row["final_val_loss"],
                         "gap_pct": row["val_loss_gap_pct"]})
    table = pd.DataFrame(rows).set_index(["method", "run"]) if rows else pd.DataFrame()
    first = pairs["full"]
    return FineTuneResult(pairs, table, first.device, first.note)


def _built(run_dir: Path) -> dict[str, Any]:
    """What the run's config.json says it built, with its parameter count."""
    rec = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    params = rec.get("params")
    return {**rec.get("built", {}), "params": params.get("total") if isinstance(params, dict) else params}


def example(model: str, data: str | None = None, index: int = 0) -> str:
    """Record ``index`` of ``data`` (None: the shipped set) as the model sees it: its chat template's text, with the
    tokens that carry the loss (the answers and their end-of-turn markers) between « and »."""
    tok = model_tokenizer.load(model)
    files = text_files(sft.shipped() if data is None else data)
    for number, messages in sft.records(files):
        if number == index + 1:
            break
    else:
        raise ValueError(f"index={index!r} is invalid; allowed: 0..{number - 1} (the records of the data)")
    ids, mask = sft.render(tok, messages, f"record {number}")
    out, inside = [], False
    for token, loss in zip(ids, mask):
        if loss != inside:
            out.append("«" if loss else "»")
            inside = bool(loss)
        out.append(tok.decode([token]))
    return "".join(out) + ("»" if inside else "")


def fine_tune_figure(ft: FineTuneResult):
    """One bar per run: its loss on the held-out answers after the fine-tune, grouped by method (the baseline first,
    each FP8 run beside it), the value inside each bar's top; a dashed line at the loss of the first training step."""
    import numpy as np
    from matplotlib.figure import Figure

    t = ft.table
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    methods = list(dict.fromkeys(t.index.get_level_values("method")))
    labels = list(dict.fromkeys(t.index.get_level_values("run")))
    width = 0.8 / max(1, len(labels))
    hatches = ["", "//", "..", "xx"]
    for i, label in enumerate(labels):
        vals = [float(t.loc[(m, label), "heldout_answer_loss"]) if (m, label) in t.index else np.nan for m in methods]
        x = np.arange(len(methods)) + (i - (len(labels) - 1) / 2) * width
        bars = ax.bar(x, np.nan_to_num(vals), width * 0.95, color=f"C{i}", hatch=hatches[i % len(hatches)],
                      edgecolor="white", label=label)
        for bar, v in zip(bars, vals):  # inside the bar's top: the step-1 line runs just above the bars
            inside = v == v
            ax.annotate(f"{v:.3f}" if inside else "-", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, -4 if inside else 2), textcoords="offset points", ha="center",
                        va="top" if inside else "bottom", fontsize=9, color="white" if inside else "black",
                        fontweight="bold", bbox={"boxstyle": "round,pad=0.15", "fc": f"C{i}", "ec": "none"})
    start = float(t["first_loss"].max())
    ax.axhline(start, color="0.3", lw=1, ls="--")
    ax.annotate(f"step 1: {start:.2f}", (len(methods) - 0.55, start), ha="right", va="bottom", fontsize=8, color="0.3")
    ax.set_xticks(range(len(methods)), [{"full": "full fine-tune", "lora": "LoRA"}.get(m, m) for m in methods])
    ax.set_ylim(0, 1.15 * start)
    ax.set(ylabel="loss on held-out answers (lower is better)")
    ax.set_title(f"Fine-tune on {ft.device}: held-out answer loss after training", fontsize=10)
    ax.legend(loc="lower right")
    return fig


@dataclass
class P5Cost:
    """The launch planner's time and cost of the fine-tunes as SageMaker jobs, and what the numbers rest on."""

    table: Any  # pandas DataFrame: one row per job (method, precision), its hours, dollars and basis
    price: str  # the price per instance-hour and where it comes from
    estimate: str  # how the planner estimates a job's time (fp8lab.launch.plan: measured rates, start-up, scaling)

    def text(self) -> str:
        """The price, the estimate and each job's basis once, as lines."""
        bases = dict.fromkeys(f"{r.precision}: {r.basis}" for r in self.table.itertuples())
        return "\n".join([f"price: {self.price}", self.estimate, "what each estimate rests on:",
                          *(f"  {b}" for b in bases)])

    def glued(self) -> list[dict[str, Any]]:
        """The jobs' rows without their basis (a notebook glues them)."""
        return self.table.drop(columns="basis").to_dict(orient="records")


def p5_cost(model: str, tokens: int, lora_rank: int = 8, instance_count: int = 1,
            instance_type: str = "ml.p5.48xlarge", price_per_hour: Any = None, **fields: Any) -> P5Cost:
    """The fine-tunes of ``model`` (a named shape or a local folder) as SageMaker jobs of ``tokens`` training tokens,
    full and LoRA, BF16 and FP8: the launch planner's time and cost (fp8lab.launch.plan_sweep; placeholders for the
    account: nothing is sent), one row per job with what its estimate rests on (``basis``). The planner's rates are
    training throughput per model and precision: the LoRA rows use them as they are (see docs/own-model.md)."""
    import pandas as pd

    base = dict(instance_type=instance_type, tokens=tokens, price_per_hour=price_per_hour, role=PLACEHOLDER_ROLE,
                bucket=PLACEHOLDER_BUCKET, study="fine-tune", **fields)
    per_method = {"full": dict(options={"task": SFT}),
                  "lora": dict(options={"task": SFT, "lora_rank": lora_rank})}
    frames, plan = [], None
    for method, extra in per_method.items():
        plan = plan_sweep([model], list(PRECISIONS), [instance_count], **{**base, **extra})
        df = plan.table()
        frames.append(df[df["job"] != "TOTAL"].assign(method=method)[
            ["method", "model", "precision", "instances", "gpus", "tokens", "est_hours", "gpu_hours", "cost_usd",
             "basis"]])
    return P5Cost(pd.concat(frames, ignore_index=True), plan.price_source, plan.estimate.describe())


def what_it_showed(ft: FineTuneResult, cost: P5Cost) -> str:
    """The notebook's closing bullets, in Markdown, from the runs' table and the P5 plan: the held-out answer loss
    of both methods, the speed, the P5 estimate; a loose list (a blank line between bullets), each short."""
    t, c = ft.table, cost.table
    losses = []
    for method in dict.fromkeys(t.index.get_level_values("method")):
        rows = t.loc[method]
        base = rows.index[0]
        gaps = "; ".join(f"{r} {rows.loc[r, 'gap_pct']:+.2f}%" for r in rows.index[1:])
        name = "full fine-tune" if method == "full" else "LoRA"
        losses.append(f"{name} {rows.loc[base, 'first_loss']:.3f} at the first step, "
                      f"{rows.loc[base, 'heldout_answer_loss']:.3f} after {int(rows.loc[base, 'steps'])} steps "
                      f"({base}), FP8's gap to it: {gaps}")
    speed = ("tokens/s not compared: FP8 was emulated on a CPU" if ft.device == "cpu" else
             "; ".join(f"{m} {r} {ft.pairs[m].table.loc[r, 'speedup_vs_bf16']:.2f}x its baseline's tokens/s/GPU"
                       for m, r in t.index if r != t.loc[m].index[0]))
    first = c.iloc[0]
    jobs = "; ".join(f"{method}: " + ", ".join(f"{r.precision} {r.est_hours:.2f} h ${r.cost_usd:,.2f}"
                                                 for r in c[c["method"] == method].itertuples())
                     for method in dict.fromkeys(c["method"]))
    return "\n\n".join([
        "* **Held-out answer loss:** " + "; ".join(losses) + ".",
        f"* **Speed on {ft.device}:** {speed}.",
        f"* **P5 estimate:** {int(first['tokens']):,} tokens of {first['model']} on {int(first['gpus'])} GPUs, "
        f"{jobs}.",
    ])
