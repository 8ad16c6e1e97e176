"""Train the same model in BF16 and in FP8 on the same tokens, then put them side by side.

The experiment the project reproduces, in one call (notebook 03 is a thin page over it)::

    pair = run_pair("llama-tiny", steps=60)                # CPU: FP8 emulated
    pair = run_pair("llama-1b", steps=300, backends=["te"], seq_len=2048, micro_batch_size=8)  # H100/H200
    pair.table                                             # tokens/s/GPU, MFU, losses, speedup
    pair_figure(pair)                                      # loss curves | throughput, side by side

Both runs share the seed, so they start from the same weights and read the same batches in the
same order (``fp8lab.data.tokens.TokenLoader``); the BF16 baseline runs on the *same converted layers*
with FP8 switched off (TE BF16 vs TE FP8, as the source blog compares). On a CPU the FP8 run is
an emulation: its loss is meaningful, its speed is not.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from fp8lab.data import run_data
from fp8lab.fp8.convert import pick_backend
from fp8lab.model.models import count_parameters
from fp8lab.records import metrics as fmetrics
from fp8lab.records import ownership
from fp8lab.records.data_format import PRETRAIN
from fp8lab.train import distributed as fdist
from fp8lab.train import replay
from fp8lab.train.entry import TrainConfig, train
from fp8lab.train.trainer import plan_here

CPU_NOTE = ("CPU run: FP8 is emulated in PyTorch (fake quantisation), so only the loss comparison is "
            "meaningful; tokens/s and MFU here say nothing about FP8 speed (that needs an H100/H200 with TE).")


@dataclass
class PairResult:
    """Where the runs went and what they measured."""

    runs: dict[str, Path]  # label ('bf16', 'fp8 te', ...) -> trainer output folder
    summaries: dict[str, dict[str, Any]]  # label -> train() summary
    table: Any  # pandas DataFrame: one row per run
    device: str  # 'cpu' or the GPU name
    note: str  # what the numbers mean on this device
    losses: dict[str, list[float | None]] = field(default_factory=dict)  # label -> loss per step
    layouts: Any = None  # pandas DataFrame: the layout each run got (fp8lab.plan.layout), one row per run

    @property
    def trained(self) -> bool:
        """False for a dry run (layouts only)."""
        return bool(self.losses)


# options a replayed pair keeps its own (where the runs write and how they report, not what they train)
PAIR_OWN = ("progress", "print_metrics", "plot", "save_model", "resume")
TINY_LR = 2e-3  # lr="auto": tiny models (< 50M parameters) like it high; others get the trainer's default --lr


def run_pair(model: str = "llama-tiny", steps: int = 60, backends: Sequence[str] = ("auto",), recipe: str = "auto",
             output_dir: str | Path = "runs", dry_run: bool = False, config: str | Path | None = None,
             **options: Any) -> PairResult:
    """One BF16 run and one FP8 run per backend, same seed and data; ``options`` go to TrainConfig.

    ``config``: a run's config.json (or its folder) to replay (fp8lab.train.replay): its options (model, steps,
    recipe, layout, lr, seed, ...) replace ``model``, ``steps``, ``recipe`` and ``options``; each run's precision and
    backend stay the pair's, and each run's config.json says what it replayed.

    Layout options left out (or "auto") are chosen by ``fp8lab.plan.layout`` for this machine, the same
    for both runs, as ``fp8lab train`` does. ``dry_run``: resolve and return the layouts, train nothing.
    ``lr="auto"``: 2e-3 for models under 50M parameters, else the trainer's default ``--lr``."""
    import pandas as pd  # pandas loads only when a pair runs

    if config:
        recorded = replay.replayed_options(config)
        model, steps, recipe = recorded.pop("model"), recorded.pop("steps", None), recorded.pop("recipe", recipe)
        for own in ("precision", "backend", *PAIR_OWN):  # the pair's: which runs, and how they report
            recorded.pop(own, None)
        options = recorded
    if isinstance(backends, str) or not backends:
        raise ValueError(f"backends must be a non-empty list such as ['auto'] or ['te', 'torchao'], got {backends!r}")
    for forbidden in ("precision", "backend", "output_dir", "recipe", "steps", "model"):
        if forbidden in options:
            raise ValueError(f"run_pair sets {forbidden!r} itself; pass model/steps/backends/recipe/output_dir as "
                             "arguments")
    if not isinstance(dry_run, bool):
        raise ValueError(f"dry_run={dry_run!r} is invalid; allowed: True | False")
    names = [pick_backend(b) for b in backends]
    out = Path(output_dir)
    lr_auto = options.get("lr", "auto") == "auto"
    base = {"progress": "auto", "print_metrics": False, "plot": False, "save_model": False, "resume": False, **options,
            "lr": TrainConfig.lr if lr_auto else options["lr"]}
    runs = [("bf16", "bf16", names[0])] + [(f"fp8 {n}", "fp8", n) for n in names]
    bf16_only = {**({"fp8_attention": "off"} if base.get("fp8_attention") == "on" else {}),  # nothing in FP8 there
                 **({"fp8_lm_head": False} if base.get("fp8_lm_head") is True else {})}
    configs = {label: TrainConfig(model=model, steps=steps, precision=precision, backend=backend, recipe=recipe,
                                  output_dir=str(out / label.replace(" ", "-")),
                                  **{**base, **(bf16_only if precision == "bf16" else {})})
               for label, precision, backend in runs}  # every option checked before any data is prepared
    baseline = _plan(configs["bf16"])  # the BF16 run's plan here: its model, and what its math computes in
    mcfg = baseline.model_config
    if lr_auto:
        configs = {k: dataclasses.replace(c, lr=auto_lr(mcfg)) for k, c in configs.items()}
    once = _PrintOnce()
    train_ = functools.partial(train, replayed_from=str(config)) if config else train
    layouts = pd.DataFrame([{"run": label, **_layout_row(once(train_, dataclasses.replace(cfg, dry_run=True)))}
                            for label, cfg in configs.items()]).set_index("run")
    if baseline.compute_dtype == "fp32":
        # a CPU computes the "bf16" baseline in fp32: name it for what it is (label and run folder)
        configs = {("fp32" if k == "bf16" else k): (dataclasses.replace(c, output_dir=str(out / "fp32"))
                                                    if k == "bf16" else c)
                   for k, c in configs.items()}
        layouts = layouts.rename(index={"bf16": "fp32"})
    if dry_run:
        return PairResult({}, {}, layouts, str(layouts["gpu"].iloc[0]), "dry run: layouts only, nothing trained",
                          {}, layouts)
    if options.get("data") is None:  # tokenize the shipped data of the task once for all runs (the model's tokenizer)
        data = str(run_data.ensure_prepared(None, out / "data", mcfg.vocab_size, model=model,
                                            task=options.get("task", PRETRAIN)))
        configs = {k: dataclasses.replace(c, data=data) for k, c in configs.items()}
    runs, summaries, losses = {}, {}, {}
    for label, cfg in configs.items():
        _replace_earlier(Path(cfg.output_dir))
        summaries[label] = once(train_, cfg)  # the layout line both runs share is printed once
        runs[label] = Path(cfg.output_dir)
        losses[label] = [r.get("loss") for r in fmetrics.read_metrics(runs[label] / "metrics.jsonl")]
    baseline = next(iter(configs))  # "bf16", or "fp32" on a CPU
    device = summaries[baseline]["gpu_name"]
    table = pd.DataFrame([_row(label, s) for label, s in summaries.items()]).set_index("run")
    base_tps = table.loc[baseline, "tokens_per_sec_per_gpu"]
    table["speedup_vs_bf16"] = table["tokens_per_sec_per_gpu"] / base_tps
    base_loss = table.loc[baseline, "final_val_loss"]
    table["val_loss_gap_pct"] = 100 * (table["final_val_loss"] - base_loss) / base_loss
    note = CPU_NOTE if device == "cpu" else (
        f"{device}: tokens/s/GPU is the median after warm-up; MFU divides by the GPU's dense BF16 peak "
        "for both precisions (so FP8 is not flattered by a higher FP8 peak).")
    return PairResult(runs, summaries, table, device, note, losses, layouts)


def auto_lr(model_config) -> float:
    """A pair's ``lr="auto"`` for a model (its ModelConfig): TINY_LR under 50M parameters, else the trainer's --lr."""
    return TINY_LR if count_parameters(model_config).total < 50e6 else TrainConfig.lr


def _replace_earlier(folder: Path) -> None:
    """A pair trains afresh in its own run folders: a run it completed there before (which the trainer never starts
    over silently) gives way, with a line saying so; only the files fp8lab wrote there go (fp8lab.records.ownership)."""
    summary = folder / "summary.json"
    try:  # a regular file only (a FIFO would wait for a writer)
        done = summary.is_file() and json.loads(summary.read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return
    if done and ownership.marker_kind(folder) == "run" and not ownership.foreign(folder, "run"):
        print(f"fp8lab: the pair trains afresh: replacing the earlier run in {folder.name!r}", flush=True)
        ownership.remove_own(folder, "run")


def _plan(c: TrainConfig):
    """The plan run ``c`` gets here, in one process (the trainer's own: fp8lab.train.trainer.plan_here)."""
    return plan_here(c, fdist.DistEnv(0, 0, 1, fdist.resolve_device(c.device), False))


class _PrintOnce:
    """Call a function with its printed lines captured, then print each line not printed before:
    the BF16 and FP8 runs (and their dry runs) report the same layout, and a reader needs it once."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, fn, *args: Any) -> Any:
        import contextlib
        import io

        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                return fn(*args)
        finally:
            for line in buf.getvalue().splitlines():
                if line not in self.seen:
                    self.seen.add(line)
                    print(line)


def _layout_row(s: dict[str, Any]) -> dict[str, Any]:
    """One row of the layout table from a dry-run summary."""
    return {"gpu": s["gpu_name"], "backend": s["backend"], "param_dtype": s["param_dtype"], "seq_len": s["seq_len"],
            "micro_batch_size": s["micro_batch_size"], "grad_accum": s["grad_accum"],
            "memory_estimate_gib": s["memory_estimate_gib"], "memory_gib": s["memory_gib"],
            "why": "; ".join(s["reasons"].values()) or "-"}


def _row(label: str, s: dict[str, Any]) -> dict[str, Any]:
    return {"run": label, "precision": s["precision"], "backend": s["backend"], "recipe": s["recipe"] or "-",
            "steps": s["steps"], "tokens": s["tokens"], "tokens_per_sec_per_gpu": s["tokens_per_sec_per_gpu_median"],
            "mfu": s["mfu_median"], "first_loss": s["first_loss"], "final_loss": s["final_loss"],
            "final_val_loss": s["val_loss"], "nonfinite_steps": s["nonfinite_steps"]}


def pair_figure(pair: PairResult, smoothing_span: int = 10):
    """Loss against step (raw faint, smoothed bold) and below it each FP8 run's smoothed loss against the
    baseline's in percent, beside tokens/s/GPU bars; one colour and line style per run. The gap panel is the
    answer: the curves above nearly coincide, which is the point, and the gap shows by how much they differ.
    One seed per run, so no seed-noise band is known here (notebook 05's loss study has one)."""
    import numpy as np
    from matplotlib.figure import Figure

    from fp8lab.analysis import smooth  # pandas: loads with the figure, as matplotlib does

    fig = Figure(figsize=(11, 5.2), layout="constrained")
    grid = fig.add_gridspec(2, 2, width_ratios=[3, 2], height_ratios=[3, 2])
    ax_loss = fig.add_subplot(grid[0, 0])
    ax_gap = fig.add_subplot(grid[1, 0], sharex=ax_loss)
    ax_tps = fig.add_subplot(grid[:, 1])
    colors = {label: f"C{i}" for i, label in enumerate(pair.runs)}
    styles = [("--", "o"), ("-", "s"), (":", "^"), ("-.", "D")]  # the baseline dashed, each FP8 run its own
    smoothed = {}
    for i, (label, losses) in reversed(list(enumerate(pair.losses.items()))):
        steps = [k + 1 for k, v in enumerate(losses) if v is not None]
        vals = [v for v in losses if v is not None]
        ls, marker = styles[i % len(styles)]
        sm = np.asarray(smooth(vals, "ema", smoothing_span), dtype=float)
        smoothed[label] = (np.asarray(steps, dtype=float), sm)
        ax_loss.plot(steps, vals, color=colors[label], alpha=0.25, lw=0.8)
        ax_loss.plot(steps, sm, color=colors[label], lw=2.2 if i == 0 else 1.6, ls=ls, marker=marker,
                     markevery=max(len(steps) // 8, 1), ms=5, mfc="none" if i else colors[label],
                     label=label, zorder=3 + len(pair.losses) - i)
    ax_loss.set(ylabel="training loss", title=f"Loss (EMA span {smoothing_span}; same weights at step 0, same batches)")
    ax_loss.tick_params(labelbottom=False)
    handles, names = ax_loss.get_legend_handles_labels()
    ax_loss.legend(handles[::-1], names[::-1], loc="upper right")
    base = next(iter(pair.losses), None)
    for i, label in enumerate(pair.losses):
        if label == base:
            continue
        (x, y), (bx, by) = smoothed[label], smoothed[base]
        ref = np.interp(x, bx, by)
        ls, marker = styles[i % len(styles)]
        ax_gap.plot(x, 100 * (y - ref) / ref, color=colors[label], ls=ls, marker=marker, mfc="none",
                    markevery=max(len(x) // 8, 1), ms=5, label=f"{label} vs {base}")
    ax_gap.axhline(0, color="0.3", lw=0.8, ls="--")
    ax_gap.set(xlabel="step", ylabel=f"gap to {base}\n(% of its smoothed loss)")
    ax_gap.set_title("one seed each: no seed-noise band known here (notebook 05's loss study has one)", fontsize=8,
                     color="0.35")
    t = pair.table
    emulated = pair.device == "cpu" or (t["backend"] == "emulated").any()
    if emulated:
        # emulated FP8 is fake quantisation, slower than the baseline by construction: a tokens/s bar would be
        # timing noise drawn as a speed-up, so the panel shows what an emulated run does measure, its loss
        vals = t["final_val_loss"].astype(float)
        bars = ax_tps.bar(range(len(t)), vals.fillna(0), color=[colors[r] for r in t.index])
        for bar, v in zip(bars, vals):
            ax_tps.annotate("-" if v != v else f"{v:.3f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=9)
        ax_tps.set_ylim(0, 1.12 * float(vals.max()) if vals.notna().any() else 1)  # from 0: alike bars look alike
        ax_tps.set_xticks(range(len(t)), list(t.index))
        ax_tps.set(ylabel="final validation loss (lower is better)")
        ax_tps.set_title("Emulated FP8: no speed measured\n(loss only; speed needs TE on an H100/H200)", fontsize=10)
        return fig
    bars = ax_tps.bar(range(len(t)), t["tokens_per_sec_per_gpu"].fillna(0), color=[colors[r] for r in t.index])
    for bar, (label, row) in zip(bars, t.iterrows()):
        ax_tps.annotate(f"{row['speedup_vs_bf16']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=9)
    ax_tps.set_xticks(range(len(t)), list(t.index))
    ax_tps.set(ylabel="tokens/s/GPU (median after warm-up)")
    ax_tps.set_title(f"Throughput on {pair.device}", fontsize=10)
    return fig
