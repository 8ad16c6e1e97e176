"""One backend-neutral FP8 scaling recipe, mapped onto TE, torchao and the CPU emulator.

The defaults are Transformer Engine's own (``DelayedScaling`` with the HYBRID format: E4M3 for
weights and activations, E5M2 for gradients; amax history 1024, algorithm ``max``, margin 0), so a
``Recipe()`` means the same thing on every backend. Each backend either maps a recipe faithfully
or refuses it with a ValueError that names what it can do instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("delayed", "current", "block", "mxfp8")
FORMATS = ("hybrid", "e4m3")
AMAX_ALGOS = ("max", "most_recent")
SETTINGS = ("format", "amax_history_len", "amax_compute_algo", "margin")  # what "kind:key=value,..." may set


@dataclass(frozen=True)
class Recipe:
    """How FP8 scaling factors are chosen.

    kind: ``delayed`` (per tensor, scale from an amax history of earlier steps; TE's default),
    ``current`` (per tensor, scale from this tensor's own amax), ``block`` (1x128 activation and
    gradient blocks, 128x128 weight blocks), ``mxfp8`` (32-element blocks, power-of-two scales;
    needs Blackwell in TE).
    """

    kind: str = "delayed"
    format: str = "hybrid"  # hybrid: E4M3 forward, E5M2 gradients (wider range); e4m3: E4M3 everywhere
    amax_history_len: int = 1024  # delayed only: steps of amax remembered (TE default)
    amax_compute_algo: str = "max"  # delayed only: 'max' over the history or 'most_recent'
    margin: int = 0  # scale = fp8_max / amax / 2**margin: headroom against growth between steps
    fp8_attention: bool = False  # TE only: dot-product attention in FP8 too (fp8_dpa); set by the plan (fp8lab.plan.fp8attn)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Recipe.kind must be one of {KINDS}, got {self.kind!r}")
        if self.format not in FORMATS:
            raise ValueError(
                f"Recipe.format must be one of {FORMATS}, got {self.format!r} (pure E5M2 training is not supported)"
            )
        h = self.amax_history_len
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise ValueError(f"Recipe.amax_history_len must be a positive integer, got {h!r}")
        if self.amax_compute_algo not in AMAX_ALGOS:
            raise ValueError(f"Recipe.amax_compute_algo must be one of {AMAX_ALGOS}, got {self.amax_compute_algo!r}")
        m = self.margin
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"Recipe.margin must be a non-negative integer, got {m!r}")
        if not isinstance(self.fp8_attention, bool):
            raise ValueError(f"Recipe.fp8_attention must be True or False, got {self.fp8_attention!r}")
        if self.kind in ("block", "mxfp8") and self.format != "e4m3":
            # TE's Float8BlockScaling and MXFP8BlockScaling quantise gradients in E4M3 as well
            raise ValueError(f"Recipe(kind={self.kind!r}) uses E4M3 for every tensor: pass format='e4m3'")

    @classmethod
    def parse(cls, spec: "str | Recipe | None") -> "Recipe":
        """``None`` -> default; ``"delayed"``/``"current"``/``"block"``/``"mxfp8"`` -> that kind with TE's defaults.

        A kind may carry settings after a colon, so one command-line string names a whole recipe:
        ``"delayed:amax_history_len=16,amax_compute_algo=most_recent,margin=1"``, ``"current:format=e4m3"``.
        """
        if spec is None:
            return cls()
        if isinstance(spec, Recipe):
            return spec
        if isinstance(spec, str):
            kind, _, rest = spec.partition(":")
            if kind not in KINDS:
                raise ValueError(f"recipe must be a Recipe or one of {KINDS} (optionally 'kind:key=value,...'), got {spec!r}")
            kw: dict[str, Any] = {"format": "e4m3" if kind in ("block", "mxfp8") else "hybrid"}
            for item in filter(None, (x.strip() for x in rest.split(","))):
                key, eq, value = item.partition("=")
                key = key.strip()
                if not eq or key not in SETTINGS:
                    raise ValueError(f"recipe {spec!r}: {item!r} is not key=value with a key among {SETTINGS}")
                value = value.strip()
                if key in ("amax_history_len", "margin"):
                    try:
                        kw[key] = int(value)
                    except ValueError:
                        raise ValueError(f"recipe {spec!r}: {key} must be an integer, got {value!r}") from None
                else:
                    kw[key] = value
            if kind != "delayed" and ({"amax_history_len", "amax_compute_algo"} & set(kw)):
                raise ValueError(f"recipe {spec!r}: amax_history_len and amax_compute_algo apply to 'delayed' only")
            return cls(kind=kind, **kw)
        raise ValueError(f"recipe must be a Recipe, one of {KINDS}, or None; got {type(spec).__name__}")

    def spec(self) -> str:
        """The string :meth:`parse` turns back into this recipe (settings that differ from the kind's defaults)."""
        default = Recipe.parse(self.kind)
        diff = [f"{k}={getattr(self, k)}" for k in SETTINGS if getattr(self, k) != getattr(default, k)]
        return self.kind + (":" + ",".join(diff) if diff else "")

    @property
    def grad_format_name(self) -> str:
        """The FP8 format of gradients: E5M2 under HYBRID, else E4M3."""
        return "E5M2" if self.format == "hybrid" else "E4M3"

    def describe(self) -> str:
        extra = (
            f", amax_history_len={self.amax_history_len}, amax_compute_algo={self.amax_compute_algo}"
            if self.kind == "delayed" else ""
        )
        attn = ", FP8 attention" if self.fp8_attention else ""
        return f"{self.kind} scaling, {self.format.upper()} (grads {self.grad_format_name}), margin={self.margin}{extra}{attn}"

    def to_te(self) -> Any:
        """The Transformer Engine recipe object (imports TE: call only where it is installed)."""
        from transformer_engine.common import recipe as te_recipe

        fmt = te_recipe.Format.HYBRID if self.format == "hybrid" else te_recipe.Format.E4M3
        attn = {"fp8_dpa": True} if self.fp8_attention else {}  # TE's FP8 dot-product attention (fp8lab.plan.fp8attn)
        if self.kind == "delayed":
            return te_recipe.DelayedScaling(
                margin=self.margin, fp8_format=fmt, amax_history_len=self.amax_history_len,
                amax_compute_algo=self.amax_compute_algo, **attn,
            )
        if self.margin:
            raise ValueError(f"TE's {self.kind} recipe has no margin; use margin=0 (margin is a delayed-scaling knob)")
        if self.kind == "block":
            if attn:
                raise ValueError("TE has no FP8 attention for block scaling (Float8BlockScaling); use kind='delayed'")
            return te_recipe.Float8BlockScaling(fp8_format=fmt)
        cls = te_recipe.Float8CurrentScaling if self.kind == "current" else te_recipe.MXFP8BlockScaling
        return cls(fp8_format=fmt, **attn)

    def to_torchao(self) -> Any:
        """The torchao ``Float8LinearConfig``: torchao implements dynamic (current) scaling only.

        ``current`` + ``hybrid`` -> the default ``tensorwise`` recipe (E5M2 gradients); ``current``
        + ``e4m3`` -> ``tensorwise`` with E4M3 gradients. Other kinds raise with the alternatives.
        """
        if self.kind != "current":
            raise ValueError(
                f"torchao float8 training supports dynamic per-tensor scaling only (Recipe(kind='current')); "
                f"{self.kind!r} scaling is available on the 'te' backend (and 'emulated' for study)"
            )
        if self.margin:
            raise ValueError("torchao float8 has no margin setting; use margin=0")
        import torch
        from torchao.float8.config import CastConfig, Float8LinearConfig

        if self.format == "hybrid":  # torchao's default: E4M3 input/weight, E5M2 grad_output
            return Float8LinearConfig()
        e4m3 = CastConfig(target_dtype=torch.float8_e4m3fn)
        return Float8LinearConfig(cast_config_grad_output=e4m3, cast_config_grad_output_for_grad_weight=e4m3)
