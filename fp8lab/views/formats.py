"""Figures and experiments for the FP8 formats notebook (01), built on :mod:`fp8lab.fp8.formats`.

Why a module: the notebook stays thin (prose plus calls), and every figure and number it shows is
produced by code the tests reach. Numerics live in ``formats``; this module only gathers tensors,
runs the recipes on them and draws. Each ``plot_*`` function returns a matplotlib Figure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from fp8lab.fp8 import formats as F
from fp8lab.fp8.formats import BF16, E4M3, E5M2, FP16, FP8Format
from fp8lab.model.models import build_model

__all__ = [
    "format_table", "plot_bit_layouts", "plot_value_grid", "plot_relative_error",
    "tiny_llama", "capture_tensors", "Captured", "tensor_table", "plot_tensor_histograms",
    "add_outlier_channels", "scaling_comparison", "plot_scaling_comparison",
    "simulate_spike", "plot_spike", "explorer_figure", "explorer_summary", "explorer_widget",
]

_COLORS = {"sign": "#d95f02", "exponent": "#1b9e77", "mantissa": "#7570b3"}
_FMT_COLORS = {"E4M3": "#1f77b4", "E5M2": "#d62728", "FP16": "#2ca02c", "BF16": "#9467bd"}


def _plt():
    import matplotlib.pyplot as plt

    return plt


# ------------------------------------------------------------------------------- the formats


def format_table(formats: Sequence[FP8Format] = (E4M3, E5M2, FP16, BF16)):
    """One row per format: bits, bias, range, precision and how many finite values it has."""
    import pandas as pd

    rows = []
    for f in formats:
        rows.append({
            "format": f.name, "bits": f.bits, "exponent_bits": f.exponent_bits,
            "mantissa_bits": f.mantissa_bits, "bias": f.bias, "max": f.max, "min_normal": f.min_normal,
            "min_subnormal": f.min_subnormal, "has_inf": f.has_inf,
            # binades between the smallest subnormal and max: the dynamic range in powers of two
            "dynamic_range_binades": round(math.log2(f.max / f.min_subnormal), 2),
            # worst relative rounding error of a normal number: half a spacing
            "max_rel_rounding_error": 2.0 ** -(f.mantissa_bits + 1),
            "finite_values": len(F.all_values(f)) if f.bits <= 16 else None,
        })
    return pd.DataFrame(rows).set_index("format")


def plot_bit_layouts(formats: Sequence[FP8Format] = (FP16, BF16, E4M3, E5M2), example: float = 0.3):
    """Sign / exponent / mantissa boxes per format, filled with the bits of ``example``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 0.9 * len(formats) + 1.0))
    for row, f in enumerate(formats):
        y = len(formats) - 1 - row
        enc = F.encode(example, f)
        bits = format(enc.code, f"0{f.bits}b")
        fields = ["sign"] + ["exponent"] * f.exponent_bits + ["mantissa"] * f.mantissa_bits
        for i, (b, kind) in enumerate(zip(bits, fields)):
            ax.add_patch(plt.Rectangle((i, y), 0.95, 0.8, color=_COLORS[kind], alpha=0.85))
            ax.text(i + 0.475, y + 0.4, b, ha="center", va="center", color="white", fontsize=10, weight="bold")
        ax.text(-0.4, y + 0.4, f.name, ha="right", va="center", fontsize=11, weight="bold")
        special = "inf + NaN" if f.has_inf else "no inf, NaN = S.1111.111"
        ax.text(16.4, y + 0.4, f"max {f.max:.4g}, min subnormal 2^{int(math.log2(f.min_subnormal))}\n"
                f"{example} -> {enc.value:.6g}; {special}", va="center", fontsize=9)
    for k, c in _COLORS.items():
        ax.add_patch(plt.Rectangle((0, 0), 0, 0, color=c, label=k))
    ax.legend(loc="upper center", bbox_to_anchor=(0.4, 0.0), ncol=3, frameon=False)
    ax.set_xlim(-3, 26)
    ax.set_ylim(-0.2, len(formats))
    ax.axis("off")
    ax.set_title(f"Bit layouts (bits of {example} after rounding to each format)")
    fig.tight_layout()
    return fig


def plot_value_grid(formats: Sequence[FP8Format] = (E4M3, E5M2)):
    """Every positive representable value on a log axis, and the gap to its upper neighbour."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, gridspec_kw={"height_ratios": [1, 2]})
    for i, f in enumerate(formats):
        v = F.all_values(f)
        v = v[v > 0]
        c = _FMT_COLORS.get(f.name)
        ax1.vlines(v.numpy(), i - 0.35, i + 0.35, color=c, lw=0.8)
        sub = v < f.min_normal
        ax1.vlines(v[sub].numpy(), i - 0.35, i + 0.35, color="0.6", lw=0.8)
        gaps = v[1:] - v[:-1]
        ax2.step(v[:-1].numpy(), gaps.numpy(), where="post", color=c, label=f"{f.name}: {len(v)} positive values")
        ax2.axvline(f.min_normal, color=c, ls=":", lw=1)
    ax1.set_yticks(range(len(formats)), [f.name for f in formats])
    ax1.set_title("Positive values (grey: subnormals). Each binade holds the same count of values.")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log", base=2)
    ax2.set_xlabel("value")
    ax2.set_ylabel("gap to next value")
    ax2.legend()
    ax2.set_title("Spacing doubles every binade (dotted: smallest normal; below it the spacing is constant)")
    fig.tight_layout()
    return fig


_FMT_STYLES = {"E4M3": "-", "E5M2": "--", "FP16": "-.", "BF16": ":"}


def plot_relative_error(formats: Sequence[FP8Format] = (E4M3, E5M2, FP16, BF16), lo: float = 2.0**-30,
                        hi: float = 2.0**20, n: int = 40000, bins_per_binade: int = 1):
    """The worst |round(x) - x| / |x| in each binade across 50 binades, one line per format: flat at
    2^-(m+1) inside the range, 100% below it, growing above max. (The error itself is a sawtooth under
    this line; its envelope is what tells the formats apart.)"""
    plt = _plt()
    x = torch.logspace(math.log10(lo), math.log10(hi), n, dtype=torch.float32)
    bins = torch.floor(torch.log2(x) * bins_per_binade)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for f in formats:
        q = F.quantize(x, f)
        rel = ((q - x).abs() / x).clamp(min=2.0**-30)
        worst = torch.zeros_like(rel).scatter_reduce(0, (bins - bins.min()).long(), rel, "amax", include_self=False)
        edges = torch.unique(bins)[:-1]  # the last bin holds a part of a binade only
        env = worst[: len(edges)]
        color = _FMT_COLORS.get(f.name)
        ax.step((2.0 ** (edges / bins_per_binade)).numpy(), env.numpy(), where="post", lw=1.8, color=color,
                ls=_FMT_STYLES.get(f.name, "-"), label=f"{f.name} (in range: 2^-{f.mantissa_bits + 1})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_ylim(2.0**-13, 2.0**2)
    ax.set_xlabel("|x| (no scaling)")
    ax.set_ylabel("worst relative rounding error\n(per binade)")
    ax.set_title("Relative error: 2^-(m+1) at worst inside the range, 100% on underflow, growing past max")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------- real tensors


def tiny_llama(hidden: int = 256, layers: int = 2, seq_len: int = 128, seed: int = 0):
    """A ``LlamaForCausalLM`` with random weights (``fp8lab.model.models``'s llama-tiny, resized)."""
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 64 or hidden % 64:
        raise ValueError(f"model_hidden must be a multiple of 64 (>= 64), got {hidden!r}")
    # SwiGLU width ~ 8/3 hidden, rounded to a multiple of 16 as FP8 GEMMs need; heads of 64
    inter = int(math.ceil(hidden * 8 / 3 / 16)) * 16
    heads = hidden // 64
    return build_model("llama-tiny", seed=seed, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                       num_heads=heads, num_kv_heads=heads, max_seq_len=max(seq_len, 256))


@dataclass
class Captured:
    """Tensors an FP8 recipe would quantize in one training step, by Linear-layer name.

    activations: each Linear's input (the forward GEMM's left operand); weights: its weight;
    gradients: the gradient of the loss w.r.t. its output (what the backward GEMMs consume).
    """

    weights: dict[str, torch.Tensor]
    activations: dict[str, torch.Tensor]
    gradients: dict[str, torch.Tensor]
    loss: float

    def kinds(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"weights": self.weights, "activations": self.activations, "gradients": self.gradients}

    def flat(self, kind: str, max_elements: int | None = None, seed: int = 0) -> torch.Tensor:
        """All tensors of one kind, flattened into one vector (a seeded random subset if larger
        than ``max_elements``: histograms and fractions need a few hundred thousand values, not all)."""
        if kind not in ("weights", "activations", "gradients"):
            raise ValueError(f"kind must be one of weights, activations, gradients; got {kind!r}")
        x = torch.cat([t.reshape(-1).float() for t in self.kinds()[kind].values()])
        if max_elements is not None and x.numel() > max_elements:
            idx = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(seed))[:max_elements]
            x = x[idx]
        return x


def capture_tensors(model: torch.nn.Module, batch: dict[str, torch.Tensor] | torch.Tensor,
                    include_lm_head: bool = False) -> Captured:
    """Run one forward/backward (next-token loss) and keep what each ``nn.Linear`` sees.

    ``batch`` is a dict of model inputs (``input_ids``, ...) or a tensor of token ids; labels
    default to the input ids. Hooks are removed afterwards and parameter .grad is left populated.
    """
    if isinstance(batch, torch.Tensor):
        batch = {"input_ids": batch}
    if not isinstance(batch, dict) or "input_ids" not in batch:
        raise ValueError("batch must be a tensor of token ids or a dict with 'input_ids'")
    acts: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    weights: dict[str, torch.Tensor] = {}
    handles = []

    def make_hook(name):
        def hook(module, inputs, output):
            acts[name] = inputs[0].detach().clone()
            if output.requires_grad:
                output.register_hook(lambda g: grads.__setitem__(name, g.detach().clone()))
        return hook

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and (include_lm_head or not name.endswith("lm_head")):
            weights[name] = mod.weight.detach().clone()
            handles.append(mod.register_forward_hook(make_hook(name)))
    if not handles:
        raise ValueError("model has no nn.Linear layers to capture")
    was_training = model.training
    model.train()
    try:
        inputs = dict(batch)
        inputs.setdefault("labels", batch["input_ids"])
        out = model(**inputs)
        out.loss.backward()
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return Captured(weights, acts, grads, float(out.loss.detach()))


def tensor_table(captured: Captured, formats: Sequence[FP8Format] = (E4M3, E5M2), max_elements: int = 2**18):
    """Per kind: magnitude range, and what casting *without* scaling, or with current scaling, loses.

    Statistics use a seeded random subset of ``max_elements`` values per kind (amax is of the subset).
    """
    import pandas as pd

    rows = []
    for kind in ("weights", "activations", "gradients"):
        x = captured.flat(kind, max_elements)
        nz = x[x != 0].abs()
        row: dict[str, Any] = {"kind": kind, "n_sampled": x.numel(), "amax": float(nz.max()),
                               "median_abs": float(nz.median()), "min_abs_nonzero": float(nz.min())}
        for f in formats:
            raw = F.error_stats(x, F.quantize(x, f), f)
            cur = F.error_stats(x, F.quantize_current(x, f))
            row[f"{f.name}_unscaled_underflow"] = raw.underflow_frac
            row[f"{f.name}_unscaled_snr_db"] = raw.snr_db
            row[f"{f.name}_current_snr_db"] = cur.snr_db
        rows.append(row)
    return pd.DataFrame(rows).set_index("kind")


def _log2_abs(x: torch.Tensor) -> torch.Tensor:
    a = x.detach().float().abs().reshape(-1)
    return torch.log2(a[a > 0])


def _shade_format(ax, fmt: FP8Format):
    """Shade, in log2 units, where fmt has subnormals (grey) and normals (colour)."""
    lo, mid, hi = math.log2(fmt.min_subnormal), math.log2(fmt.min_normal), math.log2(fmt.max)
    ax.axvspan(lo, mid, color="0.85", zorder=0)
    ax.axvspan(mid, hi, color=_FMT_COLORS.get(fmt.name, "C0"), alpha=0.12, zorder=0)
    ax.axvline(lo - 1, color="k", ls=":", lw=0.8)  # below min_subnormal / 2: rounds to zero
    ax.axvline(hi, color="k", ls="--", lw=0.8)


def plot_tensor_histograms(captured: Captured, fmt: FP8Format | str = E4M3, max_elements: int = 2**18):
    """log2|x| of weights, activations and gradients against the window ``fmt`` covers unscaled."""
    plt = _plt()
    fmt = F.get_format(fmt)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.4), sharey=False)
    for ax, kind in zip(axes, ("weights", "activations", "gradients")):
        x = captured.flat(kind, max_elements)
        la = _log2_abs(x)
        _shade_format(ax, fmt)
        ax.hist(la.numpy(), bins=120, color="k", alpha=0.75)
        st = F.error_stats(x, F.quantize(x, fmt), fmt)
        ax.set_title(f"{kind}: {100 * st.underflow_frac:.1f}% -> 0, {100 * st.clipped_frac:.2f}% clipped")
        ax.set_xlabel("log2 |x|")
    axes[0].set_ylabel("count")
    fig.suptitle(f"Real tensors of one training step vs. the {fmt.name} window with scale 1 "
                 f"(shaded: normals; grey: subnormals; dotted: rounds to 0; dashed: max)")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------- scaling recipes


def add_outlier_channels(x: torch.Tensor, n_channels: int = 4, factor: float = 1000.0, seed: int = 0):
    """A float copy of x with ``n_channels`` hidden channels (last dim) multiplied by ``factor``.

    Trained LLMs show such outlier channels in their activations; a random-init model does not,
    so the notebook injects them into a real activation to see what each recipe makes of them.
    Returns ``(tensor, channels)``.
    """
    if isinstance(n_channels, bool) or not isinstance(n_channels, int) or not 0 <= n_channels <= x.shape[-1]:
        raise ValueError(f"n_channels must be an int in 0..{x.shape[-1]}, got {n_channels!r}")
    g = torch.Generator().manual_seed(seed)
    ch = torch.randperm(x.shape[-1], generator=g)[:n_channels].sort().values
    y = x.detach().clone().float()
    y[..., ch] *= factor
    return y, ch.tolist()


def scaling_comparison(x: torch.Tensor, fmt: FP8Format | str = E4M3, margin: float = 0, history_len: int = 16,
                       stale_factor: float = 0.5, outlier_channels: Sequence[int] | None = None):
    """Error of each recipe on one tensor, as a DataFrame (rows: recipes).

    The delayed recipe holds a history of ``history_len`` earlier steps whose amax was
    ``stale_factor`` times today's (say, outliers that have since grown), so it clips the top.
    Block recipes use TE's shapes: 1x128 (activations), 128x128 (weights); MXFP8 blocks of 32.
    SNR over the whole tensor is dominated by the few outliers; with ``outlier_channels`` the
    columns ``bulk_mean_rel_error`` / ``bulk_underflow_frac`` measure the other channels, the bulk
    of the values, which is where per-tensor scaling hurts (small values sink into subnormals).
    """
    import pandas as pd

    fmt = F.get_format(fmt)
    if not stale_factor > 0:
        raise ValueError(f"stale_factor must be > 0, got {stale_factor!r}")
    x2 = x.detach().float().reshape(-1, x.shape[-1])
    amax = float(x2.abs().max())
    bulk = torch.ones(x2.shape[-1], dtype=torch.bool)
    if outlier_channels is not None:
        bulk[list(outlier_channels)] = False
    results: dict[str, tuple[torch.Tensor, Any]] = {}
    results["no scaling"] = (F.quantize(x2, fmt), 1.0)
    ds = F.DelayedScaling(amax_history_len=history_len, amax_compute_algo="max", margin=margin, fmt=fmt)
    for _ in range(history_len):
        ds.record(amax * stale_factor)
    s = ds.scale
    results["delayed (stale history)"] = (ds.step(x2), s)
    results["current per-tensor"] = F.quantize_current(x2, fmt, margin=margin, return_scale=True)
    for block in ((1, 128), (128, 128)):
        xq, sc = F.quantize_blockwise(x2, fmt, block=block, margin=margin, return_scales=True)
        results[f"block {block[0]}x{block[1]}"] = (xq, F.expand_block_scales(sc, block, x2.shape))
    xq, sc = F.quantize_mxfp8(x2, fmt, return_scales=True)
    results["MXFP8 (1x32, E8M0)"] = (xq, F.expand_block_scales(sc, (1, 32), x2.shape))
    rows = {}
    for name, (xq, scale) in results.items():
        row = F.error_stats(x2, xq, fmt, scale).as_dict()
        row.pop("n")
        if outlier_channels is not None:
            xb, qb = x2[:, bulk], xq[:, bulk]
            nz = xb != 0
            # mean (not energy-weighted) relative error: every value counts, an underflow as 100%
            row["bulk_mean_rel_error"] = float(((xb - qb).abs()[nz] / xb.abs()[nz]).mean())
            row["bulk_underflow_frac"] = F.error_stats(xb, qb).underflow_frac
        rows[name] = row
    df = pd.DataFrame(rows).T
    df.index.name = "recipe"
    return df.astype(float)


def plot_scaling_comparison(df, title: str = ""):
    """Per recipe: SNR, the bulk's mean relative error (if measured) and the share of values lost."""
    plt = _plt()
    bulk = "bulk_mean_rel_error" in df
    fig, axes = plt.subplots(1, 3 if bulk else 2, figsize=(13 if bulk else 11, 4.6), sharey=True)
    names = list(df.index)
    y = list(range(len(names)))
    axes[0].barh(y, df["snr_db"].clip(upper=60), color="C0")
    axes[0].set_xlabel("SNR, whole tensor (dB, higher is better)")
    if bulk:
        axes[1].barh(y, 100 * df["bulk_mean_rel_error"], color="C2")
        axes[1].set_xlabel("mean relative error of non-outlier values (%)")
    w = 0.4
    axes[-1].barh([i - w / 2 for i in y], 100 * df["underflow_frac"], height=w, color="0.5", label="underflow to 0")
    axes[-1].barh([i + w / 2 for i in y], 100 * df["clipped_frac"], height=w, color="C3", label="clipped at max")
    for i, (u, c) in enumerate(zip(100 * df["underflow_frac"], 100 * df["clipped_frac"])):
        # the share as text too: a clipped 0.01% has no visible bar, and it is the point of the panel
        for dy, v in ((-w / 2, u), (w / 2, c)):
            if v > 0:
                axes[-1].annotate(f"{v:.3g}%", (v, i + dy), xytext=(3, 0), textcoords="offset points", va="center",
                                  fontsize=8)
    axes[-1].set_xlabel("% of values")
    axes[-1].legend()
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    fig.suptitle(title or "Scaling recipes on one tensor with outliers")
    fig.tight_layout()
    return fig


def simulate_spike(x: torch.Tensor, fmt: FP8Format | str = E4M3, margin: float = 0, history_len: int = 16,
                   steps: int = 48, spike_step: int = 16, spike_factor: float = 1e4,
                   algos: Sequence[str] = ("max", "most_recent"), seed: int = 0):
    """Delayed scaling over a sequence of steps where one step is ``spike_factor`` times larger.

    Every step is the real tensor x times a small random drift (+-10%); step ``spike_step`` is
    multiplied by ``spike_factor``. Returns a long DataFrame: step, algo, scale (the one used),
    amax, snr_db, underflow_frac, clipped_frac, plus the same for current scaling ('current').
    """
    import pandas as pd

    fmt = F.get_format(fmt)
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int >= 2, got {steps!r}")
    if not isinstance(spike_step, int) or not 0 <= spike_step < steps:
        raise ValueError(f"spike_step must be an int in 0..{steps - 1}, got {spike_step!r}")
    if isinstance(spike_factor, bool) or not isinstance(spike_factor, (int, float)) or not 0 < spike_factor < math.inf:
        raise ValueError(f"spike_factor must be a finite number > 0, got {spike_factor!r}")
    g = torch.Generator().manual_seed(seed)
    drift = 1 + 0.1 * (2 * torch.rand(steps, generator=g) - 1)
    x = x.detach().float()
    seq = [x * float(d) * (spike_factor if t == spike_step else 1.0) for t, d in enumerate(drift)]
    rows = []
    for algo in algos:
        ds = F.DelayedScaling(amax_history_len=history_len, amax_compute_algo=algo, margin=margin, fmt=fmt)
        for t, xt in enumerate(seq):
            s = ds.scale
            st = F.error_stats(xt, ds.step(xt), fmt, s)
            rows.append({"step": t, "algo": algo, "scale": s, "amax": float(xt.abs().max()), **st.as_dict()})
    for t, xt in enumerate(seq):
        xq, s = F.quantize_current(xt, fmt, margin=margin, return_scale=True)
        st = F.error_stats(xt, xq, fmt, s)
        rows.append({"step": t, "algo": "current", "scale": float(s), "amax": float(xt.abs().max()), **st.as_dict()})
    return pd.DataFrame(rows).drop(columns="n")


def plot_spike(df, spike_step: int | None = None, title: str = ""):
    """Scale, clipped share and SNR per step, one line per amax algorithm."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.4), sharex=True)
    for (algo, d), c in zip(df.groupby("algo", sort=False), ("C0", "C1", "C2", "C3")):
        axes[0].plot(d["step"], d["scale"], color=c, label=algo, drawstyle="steps-post")
        axes[1].plot(d["step"], 100 * d["clipped_frac"], color=c, marker=".", label=algo)
        axes[2].plot(d["step"], d["snr_db"], color=c, label=algo)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("scale used")
    axes[1].set_ylabel("% clipped")
    axes[2].set_ylabel("SNR (dB)")
    for ax in axes:
        ax.set_xlabel("step")
        if spike_step is not None:
            ax.axvline(spike_step, color="k", ls=":", lw=0.8)
    axes[0].legend()
    fig.suptitle(title or "Delayed scaling after an amax spike (dotted line: the spike)")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------- interactive


def explorer_figure(x: torch.Tensor, fmt: FP8Format | str = E4M3, margin: float = 0, history_len: int = 16,
                    spike_factor: float = 1e4, steps: int = 48, spike_step: int = 16):
    """Histogram of the step after a spike under delayed scaling, plus SNR per step.

    Returns ``(figure, stats)``: stats holds the numbers the titles show, so a notebook can glue
    them and a test can check them. The widget redraws this for each setting.
    """
    plt = _plt()
    fmt = F.get_format(fmt)
    df = simulate_spike(x, fmt, margin, history_len, steps, spike_step, spike_factor, algos=("max",))
    d = df[df["algo"] == "max"].set_index("step")
    after = spike_step + 1 if spike_step + 1 < steps else spike_step
    scale = float(d.loc[after, "scale"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4))
    la = _log2_abs(x.float() * scale)
    _shade_format(a, fmt)
    a.hist(la.numpy(), bins=100, color="k", alpha=0.75)
    a.set_xlabel("log2 |x * scale|")
    a.set_title(f"{fmt.name}, margin {margin}: step after the spike, scale {scale:.3g}\n"
                f"underflow {100 * d.loc[after, 'underflow_frac']:.1f}%, SNR {d.loc[after, 'snr_db']:.1f} dB")
    b.plot(d.index, d["snr_db"], color=_FMT_COLORS.get(fmt.name, "C0"))
    b.axvline(spike_step, color="k", ls=":", lw=0.8)
    b.set_xlabel("step")
    b.set_ylabel("SNR (dB)")
    b.set_title(f"delayed scaling, history {history_len}: spike clips {100 * d.loc[spike_step, 'clipped_frac']:.0f}%")
    fig.tight_layout()
    # step 0 runs with TE's initial scale 1, so the baseline is the median of steps 1..spike-1
    base = d.loc[1:spike_step - 1, "snr_db"].median() if spike_step > 1 else d["snr_db"].median()
    recovered = d[(d.index > spike_step) & (d["snr_db"] >= base - 1.0)]
    stats = {
        "fmt": fmt.name, "margin": margin, "history_len": history_len,
        "scale_before_spike": float(d.loc[spike_step, "scale"]), "scale_after_spike": scale,
        "clipped_at_spike": float(d.loc[spike_step, "clipped_frac"]),
        "underflow_after_spike": float(d.loc[after, "underflow_frac"]),
        "snr_after_spike_db": float(d.loc[after, "snr_db"]),
        "snr_before_spike_db": float(base),
        "steps_to_recover": int(recovered.index.min() - spike_step) if len(recovered) else None,
    }
    return fig, stats


def explorer_summary(stats: dict[str, Any]) -> str:
    """One line with the numbers of :func:`explorer_figure`'s ``stats``; the widget shows it."""
    rec = stats["steps_to_recover"]
    back = (f"SNR back within 1 dB in {rec} step{'s' if rec != 1 else ''}" if rec is not None
            else "SNR not back within 1 dB")
    return (f"{stats['fmt']}, margin {stats['margin']}, history {stats['history_len']}: "
            f"scale {stats['scale_before_spike']:.6g} before the spike, {stats['scale_after_spike']:.6g} after; "
            f"then underflow {100 * stats['underflow_after_spike']:.2f}%, "
            f"SNR {stats['snr_after_spike_db']:.2f} dB (before {stats['snr_before_spike_db']:.2f} dB); {back}")


def explorer_widget(x: torch.Tensor, fmt: str = "E4M3", margin: int = 0, history_len: int = 16,
                    spike_factor: float = 1e4):
    """ipywidgets controls (format, margin, history length) that redraw :func:`explorer_figure`.

    The widget draws only when a control changes: headless (papermill) nobody can move one, so
    notebooks draw the default figure statically just above it, and no work is wasted on a
    figure that would be hidden inside widget state. Below the controls a line of text shows the
    figure's numbers (:func:`explorer_summary`). Returns the box to ``display``.

    Stable CSS classes, for styling and for the browser tests: ``fp8lab-explorer`` (the box),
    ``fp8lab-explorer-fmt`` / ``-margin`` / ``-history`` (the controls), ``fp8lab-explorer-stats``
    (the numbers) and ``fp8lab-explorer-figure`` (the output holding the figure).
    """
    import html

    import ipywidgets as w

    plt = _plt()
    controls = {
        "fmt": w.Dropdown(options=["E4M3", "E5M2"], value=F.get_format(fmt).name, description="format"),
        "margin": w.IntSlider(value=int(margin), min=0, max=8, description="margin"),
        "history": w.IntSlider(value=int(history_len), min=1, max=1024, description="history"),  # the parameter's range
    }
    stats_line = w.HTML(value="Move a control to draw the figure for that setting.")
    out = w.Output()

    def redraw(_change=None):
        with out:
            out.clear_output(wait=True)
            _, stats = explorer_figure(x, controls["fmt"].value, controls["margin"].value,
                                       controls["history"].value, spike_factor)
            plt.show()
            stats_line.value = html.escape(explorer_summary(stats))

    for name, c in controls.items():
        c.add_class(f"fp8lab-explorer-{name}")
        c.observe(redraw, names="value")
    stats_line.add_class("fp8lab-explorer-stats")
    out.add_class("fp8lab-explorer-figure")
    box = w.VBox([w.HBox(list(controls.values())), stats_line, out])
    box.add_class("fp8lab-explorer")
    return box
