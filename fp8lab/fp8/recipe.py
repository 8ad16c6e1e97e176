"""One backend-neutral FP8 scaling recipe, mapped onto TE, torchao and the CPU emulator.

The defaults are Transformer Engine's own (``DelayedScaling`` with the HYBRID format: E4M3 for
weights and activations, E5M2 for gradients; amax history 1024, algorithm ``max``, margin 0), so a
``Recipe()`` means the same thing on every backend. Each backend either maps a recipe faithfully
or refuses it with a ValueError that names what it can do instead.

What each recipe kind is and can do is one row of :data:`TABLE` (:class:`RecipeKind`): TE's recipe class and
availability check (by name, resolved only where TE is imported), torchao's name, the emulator's quantizer, the
formats it takes, the GPU generation it needs, where TE runs FP8 attention with it, and its colour in the figures.
Every place that acts on a kind reads its row (``fp8lab.fp8.backends``, ``fp8lab.plan.fp8attn``,
``fp8lab.launch.spec``, ``fp8lab.views.plots``); adding a kind is a row here (and a quantizer in the emulator if
its numerics are new). Torch-free: planning and the launcher read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FORMATS = ("hybrid", "e4m3")
ROW = 2**31 - 1  # a block as wide as any row: one scale per row (rowwise scaling)


@dataclass(frozen=True)
class RecipeKind:
    """One recipe kind: what it is on each backend and where it runs."""

    te_class: str | None  # transformer_engine.common.recipe.<te_class> (Recipe.to_te); None: TE has no such recipe
    te_check: str | None  # transformer_engine.pytorch.<te_check>(return_reason=True) before use (None: FP8 suffices)
    torchao: str | None  # torchao's float8 recipe it maps to (None: torchao cannot run it; Recipe.to_torchao)
    quantizer: str  # the emulator's quantizer: its name in fp8lab.fp8.formats (fp8lab.fp8.backends.emulated)
    blocks: tuple[Any, Any] | None  # the quantizer's blocks: (activations and gradients, weights); None: per tensor
    formats: tuple[str, ...]  # the formats it takes, its default first (Recipe.format)
    history: bool  # the scale comes from an amax history (amax_history_len, amax_compute_algo, TE's margin)
    needs: str  # the first GPU generation TE runs it on (fp8lab.core.hardware.GENERATIONS)
    # GPU generations where TE's FP8 dot-product attention runs with it (fp8lab.plan.fp8attn)
    fp8_attention: tuple[str, ...]
    style: tuple[str, str]  # (colour, bar hatch) in the figures (fp8lab.views.plots)
    wgrad_fp8: bool = True  # the weight-gradient GEMM runs in FP8 (False: in the compute dtype, torchao's _gw_hp)

    @property
    def per_tensor(self) -> bool:
        """One scale per tensor (delayed, current), not one per block."""
        return self.blocks is None

    def block(self, role: str) -> Any:
        """The block of a tensor role (x: input, w: weight, g: output gradient): (rows, cols), elements, or None."""
        return None if self.blocks is None else self.blocks[role == "w"]


TABLE: dict[str, RecipeKind] = {
    # per tensor, the scale from an amax history of earlier steps: TE's default
    "delayed": RecipeKind(te_class="DelayedScaling", te_check=None, torchao=None, quantizer="DelayedScaling",
                          blocks=None, formats=("hybrid", "e4m3"), history=True, needs="ada",
                          fp8_attention=("hopper", "blackwell"), style=("#d95f02", "")),
    # per tensor, the scale from this tensor's own amax: torchao's tensorwise recipe
    "current": RecipeKind(te_class="Float8CurrentScaling", te_check=None, torchao="tensorwise",
                          quantizer="quantize_current", blocks=None, formats=("hybrid", "e4m3"), history=False,
                          needs="ada", fp8_attention=("blackwell",), style=("#1b9e77", "//")),
    # TE's shapes: 1x128 activation and gradient blocks, 128x128 weight blocks; E4M3 gradients too
    "block": RecipeKind(te_class="Float8BlockScaling", te_check="is_fp8_block_scaling_available", torchao=None,
                        quantizer="quantize_blockwise", blocks=((1, 128), (128, 128)), formats=("e4m3",),
                        history=False, needs="hopper", fp8_attention=(), style=("#7570b3", "..")),
    # one power-of-two scale per row along each GEMM's reduction dimension, E4M3 everywhere: torchao's rowwise recipes
    # (TE has none: its nearest is 'block'). The emulator scales each tensor along its last dimension once for all
    # three GEMMs, where torchao re-scales along each GEMM's own reduction dimension
    "rowwise": RecipeKind(te_class=None, te_check=None, torchao="rowwise", quantizer="quantize_blockwise",
                          blocks=((1, ROW), (1, ROW)), formats=("e4m3",), history=False, needs="hopper",
                          fp8_attention=(), style=("#66a61e", "\\\\")),
    # as rowwise, with the weight-gradient GEMM in high precision (its gradient keeps full precision)
    "rowwise_with_gw_hp": RecipeKind(te_class=None, te_check=None, torchao="rowwise_with_gw_hp",
                                     quantizer="quantize_blockwise", blocks=((1, ROW), (1, ROW)), formats=("e4m3",),
                                     history=False, needs="hopper", fp8_attention=(), style=("#a6761d", "++"),
                                     wgrad_fp8=False),
    # 32-element blocks along the last dimension, power-of-two scales
    "mxfp8": RecipeKind(te_class="MXFP8BlockScaling", te_check="is_mxfp8_available", torchao=None,
                        quantizer="quantize_mxfp8", blocks=(32, 32), formats=("e4m3",), history=False,
                        needs="blackwell", fp8_attention=("blackwell",), style=("#e7298a", "xx")),
}
KINDS = tuple(TABLE)


def kinds_where(test) -> tuple[str, ...]:
    """The kinds whose row passes ``test`` (in table order), e.g. those TE runs FP8 attention with on Hopper."""
    return tuple(k for k, row in TABLE.items() if test(row))


def _names(kinds: tuple[str, ...], word: str = "or") -> str:
    return f" {word} ".join(repr(k) for k in kinds)


AMAX_ALGOS = ("max", "most_recent")
SETTINGS = ("format", "amax_history_len", "amax_compute_algo", "margin")  # what "kind:key=value,..." may set


@dataclass(frozen=True)
class Recipe:
    """How FP8 scaling factors are chosen.

    kind: ``delayed`` (per tensor, scale from an amax history of earlier steps; TE's default),
    ``current`` (per tensor, scale from this tensor's own amax), ``block`` (1x128 activation and
    gradient blocks, 128x128 weight blocks), ``rowwise`` / ``rowwise_with_gw_hp`` (one scale per row,
    torchao only; the second keeps the weight-gradient GEMM in high precision), ``mxfp8`` (32-element
    blocks, power-of-two scales; needs Blackwell in TE).
    """

    kind: str = "delayed"
    format: str = "hybrid"  # hybrid: E4M3 forward, E5M2 gradients (wider range); e4m3: E4M3 everywhere
    amax_history_len: int = 1024  # delayed only: steps of amax remembered (TE default)
    amax_compute_algo: str = "max"  # delayed only: 'max' over the history or 'most_recent'
    margin: int = 0  # scale = fp8_max / amax / 2**margin: headroom against growth between steps
    # TE only: dot-product attention in FP8 too (fp8_dpa); set by the plan (fp8lab.plan.fp8attn)
    fp8_attention: bool = False

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
        allowed = TABLE[self.kind].formats
        if self.format not in allowed:  # e.g. TE's block recipes quantise gradients in E4M3 as well
            raise ValueError(f"Recipe(kind={self.kind!r}) " + ("uses E4M3 for every tensor: pass format='e4m3'"
                             if allowed == ("e4m3",) else f"takes format {' | '.join(allowed)}"))

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
                raise ValueError(f"recipe must be a Recipe or one of {KINDS} (optionally 'kind:key=value,...'), got "
                                 f"{spec!r}")
            kw: dict[str, Any] = {"format": TABLE[kind].formats[0]}
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
            if not TABLE[kind].history and ({"amax_history_len", "amax_compute_algo"} & set(kw)):
                raise ValueError(f"recipe {spec!r}: amax_history_len and amax_compute_algo apply to "
                                 f"{_names(kinds_where(lambda r: r.history))} only")
            return cls(kind=kind, **kw)
        raise ValueError(f"recipe must be a Recipe, one of {KINDS}, or None; got {type(spec).__name__}")

    def spec(self) -> str:
        """The string :meth:`parse` turns back into this recipe (settings that differ from the kind's defaults)."""
        default = Recipe.parse(self.kind)
        diff = [f"{k}={getattr(self, k)}" for k in SETTINGS if getattr(self, k) != getattr(default, k)]
        return self.kind + (":" + ",".join(diff) if diff else "")

    @property
    def row(self) -> RecipeKind:
        """What this recipe's kind is on each backend (its row of :data:`TABLE`)."""
        return TABLE[self.kind]

    @property
    def grad_format_name(self) -> str:
        """The FP8 format of gradients: E5M2 under HYBRID, else E4M3."""
        return "E5M2" if self.format == "hybrid" else "E4M3"

    def describe(self) -> str:
        extra = (
            f", amax_history_len={self.amax_history_len}, amax_compute_algo={self.amax_compute_algo}"
            if self.row.history else ""
        )
        attn = ", FP8 attention" if self.fp8_attention else ""
        return (f"{self.kind} scaling, {self.format.upper()} (grads {self.grad_format_name}), "
                f"margin={self.margin}{extra}{attn}")

    def to_te(self) -> Any:
        """The Transformer Engine recipe object (imports TE: call only where it is installed)."""
        row = self.row
        if row.te_class is None:
            raise ValueError(f"Transformer Engine has no {self.kind!r} recipe (a torchao recipe: --backend torchao); "
                             f"on TE use {_names(kinds_where(lambda r: r.te_class is not None))}")
        from transformer_engine.common import recipe as te_recipe

        cls = getattr(te_recipe, row.te_class)
        fmt = te_recipe.Format.HYBRID if self.format == "hybrid" else te_recipe.Format.E4M3
        attn = {"fp8_dpa": True} if self.fp8_attention else {}  # TE's FP8 dot-product attention (fp8lab.plan.fp8attn)
        if row.history:
            return cls(margin=self.margin, fp8_format=fmt, amax_history_len=self.amax_history_len,
                       amax_compute_algo=self.amax_compute_algo, **attn)
        if self.margin:
            raise ValueError(f"TE's {self.kind} recipe has no margin; use margin=0 (margin is a delayed-scaling knob)")
        if attn and not row.fp8_attention:
            raise ValueError(f"TE has no FP8 attention for {self.kind} scaling ({row.te_class}); use "
                             f"kind={kinds_where(lambda r: bool(r.fp8_attention))[0]!r}")
        return cls(fp8_format=fmt, **attn)

    def to_torchao(self) -> Any:
        """The torchao ``Float8LinearConfig``: torchao implements dynamic scaling, per tensor (current) or per row
        (rowwise).

        ``current`` + ``hybrid`` -> the default ``tensorwise`` recipe (E5M2 gradients); ``current``
        + ``e4m3`` -> ``tensorwise`` with E4M3 gradients. ``rowwise`` and
        ``rowwise_with_gw_hp`` -> torchao's recipes of those names. Other kinds raise with the alternatives.
        """
        if self.row.torchao is None:
            raise ValueError(
                f"torchao float8 training scales dynamically, per tensor or per row "
                f"(Recipe(kind={_names(kinds_where(lambda r: r.torchao is not None))})); "
                f"{self.kind!r} scaling is available on the 'te' backend (and 'emulated' for study)"
            )
        if self.margin:
            raise ValueError("torchao float8 has no margin setting; use margin=0")
        import torch
        from torchao.float8.config import CastConfig, Float8LinearConfig

        if self.row.torchao != "tensorwise":  # torchao's named rowwise recipes (E4M3, power-of-two scales)
            return Float8LinearConfig.from_recipe_name(self.row.torchao)

        if self.format == "hybrid":  # torchao's default: E4M3 input/weight, E5M2 grad_output
            return Float8LinearConfig()
        e4m3 = CastConfig(target_dtype=torch.float8_e4m3fn)
        return Float8LinearConfig(cast_config_grad_output=e4m3, cast_config_grad_output_for_grad_weight=e4m3)
