"""FP8 numerics in plain PyTorch: formats, rounding, and the scaling recipes of Transformer Engine.

Why this module exists: to *see* what FP8 does to a tensor on any machine (CPU included) before
training with real FP8 kernels. Everything here is fake quantization: a tensor goes in, the values it
would have after a round trip through FP8 come out, in the input's dtype.

Two rounding paths, on purpose:

* ``method="torch"`` (default, fast) casts through ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``.
  That is the reference: ``(x*scale).clamp(-max, max).to(fmt.torch_dtype).to(x.dtype) / scale``.
* ``method="arith"`` rounds with frexp/round/ldexp arithmetic, for *any* (exponent_bits,
  mantissa_bits) format, including hypothetical ones built with :func:`make_format`. The tests check
  that both paths agree bit for bit on every code, every midpoint (ties), subnormals and overflow,
  which is what makes the arithmetic a trustworthy explanation of the hardware cast.

Conventions (the same as Transformer Engine): a *scale* multiplies the high-precision tensor before
the cast (``x_fp8 = cast(x * scale)``) and dequantization divides by it. ``scale = fmt.max / amax``
maps a tensor's absolute maximum onto the largest representable value.

Special values: NaN stays NaN. +-inf saturate to +-max/scale, exactly as the clamp of the reference
does (E4M3 has no infinity; for E5M2 saturating matches TE's clamp-then-cast too).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "FP8Format", "E4M3", "E5M2", "BF16", "FP16", "FORMATS", "get_format", "make_format",
    "Bits", "all_values", "decode", "encode",
    "quantize", "round_to_format", "compute_scale", "DelayedScaling", "current_scale", "quantize_current",
    "quantize_blockwise", "quantize_mxfp8", "expand_block_scales", "ErrorStats", "error_stats",
]

_FLOAT32_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class FP8Format:
    """A small binary floating-point format: 1 sign bit, ``exponent_bits``, ``mantissa_bits``.

    ``special`` says how the all-ones exponent is used, the one real difference between formats:
    ``"ieee"`` reserves it for inf/NaN (E5M2, FP16, BF16); ``"fn"`` ("finite, NaN") keeps it for
    numbers except the single all-ones code, which is NaN (E4M3 as used by Hopper/TE: max 448).
    The numeric fields are derived by :func:`make_format` and stored so readers can print them.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    min_normal: float
    min_subnormal: float
    has_inf: bool
    torch_dtype: torch.dtype | None  # None: a teaching-only format, quantized with method="arith"
    special: str = "ieee"

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def min_exponent(self) -> int:
        """Unbiased exponent of the smallest normal number (subnormals share its spacing)."""
        return 1 - self.bias

    @property
    def max_exponent(self) -> int:
        """Unbiased exponent of the largest finite number."""
        return math.floor(math.log2(self.max))

    def __str__(self) -> str:
        return self.name


def make_format(
    exponent_bits: int,
    mantissa_bits: int,
    special: str = "ieee",
    name: str | None = None,
    torch_dtype: torch.dtype | None = None,
) -> FP8Format:
    """Build the description of a 1+E+M bit format, deriving bias, max and the smallest numbers.

    Works for hypothetical formats too (say E3M4), so the notebook can show the range/precision
    trade-off beyond the two formats the hardware has.
    """
    if not isinstance(exponent_bits, int) or not 2 <= exponent_bits <= 8:
        raise ValueError(f"exponent_bits must be an int in 2..8, got {exponent_bits!r}")
    if not isinstance(mantissa_bits, int) or not 0 <= mantissa_bits <= 23:
        raise ValueError(f"mantissa_bits must be an int in 0..23, got {mantissa_bits!r}")
    if special not in ("ieee", "fn"):
        raise ValueError(f"special must be 'ieee' or 'fn', got {special!r}")
    if special == "fn" and mantissa_bits == 0:
        raise ValueError("special='fn' needs mantissa_bits >= 1 (the all-ones code is NaN)")
    bias = 2 ** (exponent_bits - 1) - 1
    top = 2**exponent_bits - 1  # all-ones exponent field
    if special == "ieee":
        max_val = (2.0 - 2.0**-mantissa_bits) * 2.0 ** (top - 1 - bias)
    else:  # the all-ones exponent holds numbers; only mantissa all-ones is NaN
        max_val = (2.0 - 2.0 ** (1 - mantissa_bits)) * 2.0 ** (top - bias)
    return FP8Format(
        name=name or f"E{exponent_bits}M{mantissa_bits}",
        exponent_bits=exponent_bits,
        mantissa_bits=mantissa_bits,
        bias=bias,
        max=max_val,
        min_normal=2.0 ** (1 - bias),
        min_subnormal=2.0 ** (1 - bias - mantissa_bits),
        has_inf=special == "ieee",
        torch_dtype=torch_dtype,
        special=special,
    )


E4M3 = make_format(4, 3, special="fn", name="E4M3", torch_dtype=torch.float8_e4m3fn)
E5M2 = make_format(5, 2, special="ieee", name="E5M2", torch_dtype=torch.float8_e5m2)
FP16 = make_format(5, 10, special="ieee", name="FP16", torch_dtype=torch.float16)
BF16 = make_format(8, 7, special="ieee", name="BF16", torch_dtype=torch.bfloat16)
FORMATS: dict[str, FP8Format] = {f.name: f for f in (E4M3, E5M2, FP16, BF16)}


def get_format(fmt: FP8Format | str) -> FP8Format:
    """Accept a format or its name ('E4M3', 'e5m2', 'bf16', ...)."""
    if isinstance(fmt, FP8Format):
        return fmt
    if isinstance(fmt, str) and fmt.upper() in FORMATS:
        return FORMATS[fmt.upper()]
    raise ValueError(f"fmt must be an FP8Format or one of {', '.join(FORMATS)}; got {fmt!r}")


# --------------------------------------------------------------------------------------------
# Codes <-> values
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bits:
    """The fields of one code (or, with tensor inputs, of many codes, as tensors).

    ``value`` is what the code means; ``kind`` is 'zero', 'subnormal', 'normal', 'inf' or 'nan'.
    """

    fmt: FP8Format
    code: Any
    sign: Any
    exponent: Any  # the stored (biased) exponent field
    mantissa: Any  # the stored mantissa field
    value: Any

    @property
    def kind(self) -> str:
        if isinstance(self.code, torch.Tensor) and self.code.numel() != 1:
            raise ValueError("kind is defined for a single code; index the tensor first")
        v, e = float(self.value), int(self.exponent)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf"
        if v == 0:
            return "zero"
        return "subnormal" if e == 0 else "normal"

    @property
    def bitstring(self) -> str:
        """'s eeee mmm' with spaces between the fields, e.g. '0 1111 110' for E4M3 448."""
        f = self.fmt
        s, e, m = int(self.sign), int(self.exponent), int(self.mantissa)
        man = format(m, f"0{f.mantissa_bits}b") if f.mantissa_bits else ""
        return f"{s} {format(e, f'0{f.exponent_bits}b')} {man}".rstrip()

    def explain(self) -> str:
        """One line that spells the value out of its fields, for the bit-layout explainer."""
        f, k = self.fmt, self.kind
        s, e, m = int(self.sign), int(self.exponent), int(self.mantissa)
        sign = "-" if s else "+"
        if k in ("nan", "inf"):
            return f"{self.bitstring} -> {k if k == 'nan' else sign + 'inf'}"
        if k == "normal":
            return (f"{self.bitstring} -> {sign}(1 + {m}/{2**f.mantissa_bits}) * 2^({e} - {f.bias})"
                    f" = {float(self.value):g}")
        return (f"{self.bitstring} -> {sign}({m}/{2**f.mantissa_bits}) * 2^({1 - f.bias})"
                f" = {float(self.value):g}")


def _check_code_range(codes: torch.Tensor, fmt: FP8Format) -> None:
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 2**fmt.bits):
        raise ValueError(f"code must be in 0..{2**fmt.bits - 1} for {fmt.name}")


def decode(code: int | torch.Tensor, fmt: FP8Format | str) -> Bits:
    """Split a code (int, or integer tensor of codes) into sign/exponent/mantissa and its value.

    Pure arithmetic on the fields (the tests check it against ``tensor.view(float8)``), so it also
    explains formats torch does not have.
    """
    fmt = get_format(fmt)
    scalar = not isinstance(code, torch.Tensor)
    if scalar and not isinstance(code, int):
        raise ValueError(f"code must be an int or an integer tensor, got {type(code).__name__}")
    c = torch.as_tensor(code, dtype=torch.int64)
    if c.is_floating_point():
        raise ValueError("code must be an integer tensor")
    _check_code_range(c, fmt)
    m_bits, e_bits = fmt.mantissa_bits, fmt.exponent_bits
    sign = (c >> (e_bits + m_bits)) & 1
    exp = (c >> m_bits) & (2**e_bits - 1)
    man = c & (2**m_bits - 1)
    m = man.to(torch.float64)
    normal = (1.0 + m / 2**m_bits) * torch.pow(2.0, (exp - fmt.bias).to(torch.float64))
    sub = m * 2.0 ** (1 - fmt.bias - m_bits)
    mag = torch.where(exp == 0, sub, normal)
    top = exp == 2**e_bits - 1
    if fmt.special == "ieee":
        mag = torch.where(top & (man == 0), torch.inf, mag)
        mag = torch.where(top & (man != 0), torch.nan, mag)
    else:
        mag = torch.where(top & (man == 2**m_bits - 1), torch.nan, mag)
    value = torch.where(sign == 1, -mag, mag)
    if scalar:
        return Bits(fmt, int(c), int(sign), int(exp), int(man), float(value))
    return Bits(fmt, c, sign, exp, man, value)


def encode(x: float | torch.Tensor, fmt: FP8Format | str) -> Bits:
    """Round x to the format (nearest-even) and give its code and fields.

    Finite values beyond max saturate like :func:`quantize`; +-inf keeps its own code in formats
    that have one (E5M2) and saturates in E4M3.

    Accepts a Python number (fields come back as ints) or a tensor (fields as tensors). NaN gives
    the all-ones code with x's sign, the same bytes torch produces.
    """
    fmt = get_format(fmt)
    scalar = not isinstance(x, torch.Tensor)
    t = torch.as_tensor(x, dtype=torch.float64) if scalar else x
    if not t.is_floating_point():
        t = t.to(torch.float64)
    v = round_to_format(t, fmt, saturate=True)  # float64, exact
    if fmt.has_inf:  # infinity is a value of IEEE-style formats: keep it rather than saturate
        v = torch.where(torch.isinf(t), t.to(torch.float64), v)
    neg = torch.signbit(v).to(torch.int64)
    a = v.abs()
    m_bits, e_bits = fmt.mantissa_bits, fmt.exponent_bits
    _, e2 = torch.frexp(torch.where(a > 0, a, torch.ones_like(a)))
    unb = (e2 - 1).to(torch.int64)
    is_normal = a >= fmt.min_normal
    exp = torch.where(is_normal, unb + fmt.bias, torch.zeros_like(unb))
    frac_normal = a / torch.pow(2.0, unb.to(torch.float64)) - 1.0
    man = torch.where(is_normal, frac_normal * 2**m_bits, a / fmt.min_subnormal)
    man = torch.nan_to_num(man, nan=0.0, posinf=0.0).round().to(torch.int64)
    nan = torch.isnan(v)
    exp = torch.where(nan, torch.full_like(exp, 2**e_bits - 1), exp)
    man = torch.where(nan, torch.full_like(man, 2**m_bits - 1), man)
    if fmt.has_inf:
        inf = torch.isinf(v)
        exp = torch.where(inf, torch.full_like(exp, 2**e_bits - 1), exp)
        man = torch.where(inf, torch.zeros_like(man), man)
    code = (neg << (e_bits + m_bits)) | (exp << m_bits) | man
    if scalar:
        return Bits(fmt, int(code), int(neg), int(exp), int(man), float(v))
    return Bits(fmt, code, neg, exp, man, v)


def all_values(fmt: FP8Format | str) -> torch.Tensor:
    """Every finite representable value, sorted ascending, zero once (float64).

    For FP8 that is 253 (E4M3) or 247 (E5M2) numbers. Works for 16-bit formats too (about 63k
    values, cheap); formats wider than 16 bits raise ValueError.
    """
    fmt = get_format(fmt)
    if fmt.bits > 16:
        raise ValueError(f"all_values enumerates formats of at most 16 bits; {fmt.name} has {fmt.bits}")
    vals = decode(torch.arange(2**fmt.bits), fmt).value
    vals = vals[torch.isfinite(vals)]
    return torch.unique(vals)  # sorted; -0.0 and +0.0 collapse into one zero


# --------------------------------------------------------------------------------------------
# Rounding and fake quantization
# --------------------------------------------------------------------------------------------


def round_to_format(y: torch.Tensor, fmt: FP8Format | str, saturate: bool = True) -> torch.Tensor:
    """Round every element of y to the nearest value of ``fmt`` (ties to even), in float64.

    The independent, arithmetic description of the cast: find each value's binade with frexp,
    the spacing there is 2^(exponent - mantissa_bits) (the same for all subnormals), and round
    y/spacing to an integer with round-half-to-even. Above max: saturate to +-max, or (saturate=False)
    give inf (IEEE formats) / NaN ('fn' formats). float64 input is first rounded to float32,
    because that is what torch's cast does (it converts through float).
    """
    fmt = get_format(fmt)
    if y.dtype == torch.float64:
        y = y.to(torch.float32)
    y = y.to(torch.float64)
    a = y.abs()
    _, e2 = torch.frexp(a)  # a = f * 2**e2, f in [0.5, 1)
    exponent = torch.clamp(e2.to(torch.float64) - 1, min=fmt.min_exponent)
    spacing = torch.pow(2.0, exponent - fmt.mantissa_bits)
    r = torch.round(a / spacing) * spacing  # torch.round rounds half to even
    over = r > fmt.max
    if saturate:
        r = torch.where(over, torch.full_like(r, fmt.max), r)
    else:
        r = torch.where(over, torch.full_like(r, torch.inf if fmt.has_inf else torch.nan), r)
    r = torch.where(torch.isinf(a), torch.full_like(r, fmt.max if saturate else torch.inf), r)
    if not saturate and not fmt.has_inf:
        r = torch.where(torch.isinf(a), torch.full_like(r, torch.nan), r)
    return torch.copysign(r, y)  # keeps -0.0 and NaN


_METHODS = ("torch", "arith")


def quantize(x: torch.Tensor, fmt: FP8Format | str, scale: float | torch.Tensor = 1.0,
             method: str = "torch") -> torch.Tensor:
    """Fake-quantize: scale, round to nearest even in ``fmt``, saturate to +-max, unscale.

    Returns a tensor of x's dtype and shape equal, bit for bit, to
    ``(x*scale).clamp(-fmt.max, fmt.max).to(fmt.torch_dtype).to(x.dtype) / scale``.
    ``scale`` is a number or a tensor broadcastable to x. NaN stays NaN; +-inf become +-max/scale.
    ``method='arith'`` computes the rounding without torch's float8 dtypes (needed for formats that
    have no torch dtype). Runs under no_grad: use it inside a custom autograd Function.
    Note: as in the reference expression, ``x * scale`` is formed in x's dtype (with a scalar or
    0-d scale); TE's kernels form it in float32, so for bf16/fp16 inputs a value lying within a
    bf16 rounding of an FP8 midpoint can land one FP8 step apart. Pass float32 x to avoid that.
    """
    fmt = get_format(fmt)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError("x must be a floating-point torch.Tensor")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {', '.join(_METHODS)}; got {method!r}")
    if method == "torch" and fmt.torch_dtype is None:
        raise ValueError(f"{fmt.name} has no torch dtype; use method='arith'")
    with torch.no_grad():
        y = (x * scale).clamp(-fmt.max, fmt.max)
        if method == "torch":
            q = y.to(fmt.torch_dtype).to(y.dtype)
        else:
            q = round_to_format(y, fmt).to(y.dtype)
        return (q / scale).to(x.dtype)


# --------------------------------------------------------------------------------------------
# Scaling recipes (per tensor: delayed and current; per block: 1x128/128x128 and MXFP8)
# --------------------------------------------------------------------------------------------


def _check_margin(margin) -> None:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
        raise ValueError(f"margin must be a finite number >= 0 (a power-of-two back-off), got {margin!r}")


def compute_scale(amax: float | torch.Tensor, fmt: FP8Format | str, margin: float = 0,
                  prev_scale: float | torch.Tensor = 1.0) -> float | torch.Tensor:
    """Scale that maps amax onto the format's max, backed off by 2**margin: max / amax / 2**margin.

    As in Transformer Engine: where amax is 0 or not finite the previous scale is kept (1.0 for a
    first step or for current scaling), and a scale that overflows float32 becomes float32 max.
    Returns a float for a float amax and a float32 tensor for a tensor amax (elementwise).
    """
    fmt = get_format(fmt)
    _check_margin(margin)
    if isinstance(amax, torch.Tensor):
        a = amax.detach().to(torch.float32)
        prev = torch.as_tensor(prev_scale, dtype=torch.float32, device=a.device)
        s = fmt.max / a / 2.0**margin
        s = torch.where(torch.isinf(s), torch.full_like(s, _FLOAT32_MAX), s)
        ok = torch.isfinite(a) & (a > 0)
        return torch.where(ok, s, prev.expand_as(s))
    a = float(amax)
    if not math.isfinite(a) or a <= 0:
        return float(prev_scale)
    s = float(torch.tensor(fmt.max / a / 2.0**margin, dtype=torch.float32))
    return _FLOAT32_MAX if math.isinf(s) else s


def _amax(x: torch.Tensor) -> torch.Tensor:
    """Absolute maximum, ignoring NaN (so one NaN does not poison a history)."""
    a = x.detach().abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return a.max().to(torch.float32) if a.numel() else torch.zeros((), dtype=torch.float32)


_AMAX_ALGOS = ("max", "most_recent")


class DelayedScaling:
    """Transformer Engine's delayed scaling for one tensor, step by step.

    Each :meth:`step` quantizes with the scale computed from the amax history of *earlier* steps,
    then records this step's amax and updates the scale for the next step. That is why a sudden
    spike is clipped on the step it arrives (the scale was computed before it was seen) and why,
    with ``amax_compute_algo='max'``, the spike then shrinks the scale (more underflow for normal
    values) until it leaves the ``amax_history_len`` window.
    """

    def __init__(self, amax_history_len: int = 1024, amax_compute_algo: str = "max",
                 margin: float = 0, fmt: FP8Format | str = E4M3):
        if isinstance(amax_history_len, bool) or not isinstance(amax_history_len, int) or amax_history_len < 1:
            raise ValueError(f"amax_history_len must be an int >= 1, got {amax_history_len!r}")
        if amax_compute_algo not in _AMAX_ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {', '.join(_AMAX_ALGOS)}; got {amax_compute_algo!r}")
        _check_margin(margin)
        self.fmt = get_format(fmt)
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo
        self.margin = margin
        self._history: deque[float] = deque(maxlen=amax_history_len)
        self.scale: float = 1.0  # TE starts from scale 1
        self.steps = 0

    @property
    def history(self) -> torch.Tensor:
        """Recorded amax values, oldest first (at most amax_history_len of them)."""
        return torch.tensor(list(self._history), dtype=torch.float32)

    @property
    def amax(self) -> float:
        """The amax the next scale is computed from (0.0 before the first step)."""
        if not self._history:
            return 0.0
        return max(self._history) if self.amax_compute_algo == "max" else self._history[-1]

    def step(self, x: torch.Tensor, method: str = "torch") -> torch.Tensor:
        """Quantize x with the current scale, then record amax(x) and update the scale."""
        xq = quantize(x, self.fmt, self.scale, method=method)
        self.record(float(_amax(x)))
        return xq

    def record(self, amax: float) -> None:
        """Append one amax to the history and recompute the scale (TE's amax-and-scale update)."""
        self._history.append(float(amax))
        self.steps += 1
        self.scale = compute_scale(self.amax, self.fmt, self.margin, prev_scale=self.scale)

    def reset(self) -> None:
        self._history.clear()
        self.scale = 1.0
        self.steps = 0

    def __repr__(self) -> str:
        return (f"DelayedScaling(amax_history_len={self.amax_history_len}, amax_compute_algo="
                f"{self.amax_compute_algo!r}, margin={self.margin}, fmt={self.fmt.name}, "
                f"steps={self.steps}, scale={self.scale:.6g})")


def current_scale(x: torch.Tensor, fmt: FP8Format | str = E4M3, margin: float = 0) -> torch.Tensor:
    """The scale current scaling gives ``x`` (its own amax, NaN ignored): what :func:`quantize_current` uses."""
    return compute_scale(_amax(x), fmt, margin)


def quantize_current(x: torch.Tensor, fmt: FP8Format | str = E4M3, margin: float = 0,
                     return_scale: bool = False, method: str = "torch"):
    """Current ("just-in-time") per-tensor scaling: scale from this tensor's own amax.

    Nothing clips (amax lands on max, or below it with a margin); the price is a second pass over
    the tensor. With ``return_scale`` returns ``(xq, scale)`` with scale a float32 0-d tensor.
    """
    fmt = get_format(fmt)
    _check_margin(margin)
    scale = current_scale(x, fmt, margin)
    xq = quantize(x, fmt, scale, method=method)
    return (xq, scale) if return_scale else xq


def _check_block(block, ndim_name: str = "block") -> tuple[int, int]:
    ok = (isinstance(block, (tuple, list)) and len(block) == 2
          and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block))
    if not ok:
        raise ValueError(f"{ndim_name} must be a pair of positive ints such as (1, 128) or (128, 128); got {block!r}")
    return int(block[0]), int(block[1])


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension for block scaling")
    return x.reshape(1, -1) if x.ndim == 1 else x.reshape(-1, x.shape[-1])


def _block_amax(x2: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """Per-block amax of a 2-D tensor; partial edge blocks are zero-padded (zeros do not change amax)."""
    rows, cols = x2.shape
    pr, pc = (-rows) % br, (-cols) % bc
    a = x2.detach().abs().to(torch.float32)
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    a = torch.nn.functional.pad(a, (0, pc, 0, pr))
    R, C = a.shape[0] // br, a.shape[1] // bc
    return a.reshape(R, br, C, bc).amax(dim=(1, 3))


def expand_block_scales(scales: torch.Tensor, block: tuple[int, int], shape: torch.Size | tuple) -> torch.Tensor:
    """Per-block scales (blocks over the last dim and the flattened leading dims) -> one per element."""
    br, bc = _check_block(block)
    rows = 1 if len(shape) == 1 else int(math.prod(shape[:-1]))
    cols = shape[-1]
    full = scales.repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)[:rows, :cols]
    return full.reshape(shape)


def _pow2_floor(s: torch.Tensor) -> torch.Tensor:
    """Largest power of two <= s (what zeroing float32 mantissa bits does in TE)."""
    m, e = torch.frexp(s)
    return torch.ldexp(torch.ones_like(m), e - 1)


def quantize_blockwise(x: torch.Tensor, fmt: FP8Format | str = E4M3, block: tuple[int, int] = (1, 128),
                       margin: float = 0, power_of_2: bool = True, return_scales: bool = False,
                       method: str = "torch"):
    """Per-block scaling as in TE's Float8BlockScaling: one scale per (rows x cols) block.

    TE uses 1x128 blocks for activations and gradients and 128x128 for weights; scales are float32,
    powers of two by default (``power_of_2=True``, rounding the scale *down* so nothing clips), as in
    TE. Blocks tile the last dim and the flattened leading dims (a 1-D x is one row). Shapes that
    are not multiples of the block are allowed: edge blocks are partial (as if zero-padded).
    With ``return_scales`` returns ``(xq, scales)``, scales of shape (ceil(rows/br), ceil(cols/bc));
    :func:`expand_block_scales` turns them into one scale per element (for :func:`error_stats`).
    """
    fmt = get_format(fmt)
    br, bc = _check_block(block)
    _check_margin(margin)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError("x must be a floating-point torch.Tensor")
    with torch.no_grad():
        x2 = _as_2d(x)
        scales = compute_scale(_block_amax(x2, br, bc), fmt, margin)
        if power_of_2:
            scales = _pow2_floor(scales)
        full = expand_block_scales(scales, (br, bc), x2.shape)
        xq = quantize(x2, fmt, full, method=method).reshape(x.shape)
    return (xq, scales) if return_scales else xq


_MX_ROUNDING = ("floor", "ceil")
_E8M0_MIN, _E8M0_MAX = -127, 127


def quantize_mxfp8(x: torch.Tensor, fmt: FP8Format | str = E4M3, block: int = 32, rounding: str = "floor",
                   return_scales: bool = False, method: str = "torch"):
    """MXFP8 (OCP Microscaling): blocks of ``block`` consecutive values along the last dim share
    one power-of-two E8M0 scale.

    ``rounding='floor'`` is the OCP MX v1.0 rule: shared exponent = floor(log2(amax)) - emax of the
    element format, so the block's amax lands in the top binade and values above fmt.max saturate.
    ``rounding='ceil'`` rounds amax/max up to a power of two instead (what TE's MXFP8 kernels do),
    which never clips. Exponents are clamped to E8M0's range [-127, 127]; all-zero blocks get
    scale 1. A last dim that is not a multiple of ``block`` ends in a partial block.
    With ``return_scales`` returns ``(xq, scales)``, scales (multipliers, like the other functions)
    shaped (rows, ceil(cols/block)).
    """
    fmt = get_format(fmt)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int (32 in the MX spec), got {block!r}")
    if rounding not in _MX_ROUNDING:
        raise ValueError(f"rounding must be one of {', '.join(_MX_ROUNDING)}; got {rounding!r}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError("x must be a floating-point torch.Tensor")
    with torch.no_grad():
        x2 = _as_2d(x)
        amax = _block_amax(x2, 1, block).to(torch.float64)
        pos = amax > 0
        safe = torch.where(pos, amax, torch.ones_like(amax))
        if rounding == "floor":
            _, e = torch.frexp(safe)
            shared = (e - 1).to(torch.float64) - fmt.max_exponent
        else:
            shared = torch.ceil(torch.log2(safe / fmt.max))
            # log2 may be off by one ulp; make sure amax / 2**shared <= max
            shared = torch.where(safe / torch.pow(2.0, shared) > fmt.max, shared + 1, shared)
        shared = torch.where(pos, shared, torch.zeros_like(shared)).clamp(_E8M0_MIN, _E8M0_MAX)
        scales = torch.pow(2.0, -shared).to(torch.float32)
        full = expand_block_scales(scales, (1, block), x2.shape)
        xq = quantize(x2, fmt, full, method=method).reshape(x.shape)
    return (xq, scales) if return_scales else xq


# --------------------------------------------------------------------------------------------
# Error statistics
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorStats:
    """How much a quantization lost. Fractions are in [0, 1]; clipped_frac is None without fmt."""

    rel_error: float  # ||x - xq|| / ||x|| over finite elements
    snr_db: float  # 10 log10(sum x^2 / sum (x - xq)^2); inf when exact
    underflow_frac: float  # share of the nonzero elements of x that became exactly 0
    clipped_frac: float | None  # share of elements saturated: |x * scale| > max + half a spacing
    n: int = field(default=0)  # finite elements counted

    def as_dict(self) -> dict[str, Any]:
        return {"rel_error": self.rel_error, "snr_db": self.snr_db, "underflow_frac": self.underflow_frac,
                "clipped_frac": self.clipped_frac, "n": self.n}


def error_stats(x: torch.Tensor, xq: torch.Tensor, fmt: FP8Format | str | None = None,
                scale: float | torch.Tensor = 1.0) -> ErrorStats:
    """Compare a tensor with its quantized copy.

    Clipping cannot be read from xq alone (a saturated value looks like any other), so it needs the
    format and the scale that was used. An element counts as clipped when |x*scale| lies beyond
    max plus half the spacing at max (closer ones would round to max anyway). The scale is a
    number or a tensor broadcastable to x (for block recipes, :func:`expand_block_scales` of the
    returned scales). Without ``fmt`` clipped_frac is None.
    Non-finite elements of x are left out of every statistic.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(xq, torch.Tensor):
        raise ValueError("x and xq must be torch tensors")
    if x.shape != xq.shape:
        raise ValueError(f"x and xq must have the same shape, got {tuple(x.shape)} and {tuple(xq.shape)}")
    xd, qd = x.detach().to(torch.float64), xq.detach().to(torch.float64)
    finite = torch.isfinite(xd)
    xs, qs = xd[finite], qd[finite]
    err2 = float(((xs - qs) ** 2).sum())
    sig2 = float((xs**2).sum())
    rel = math.sqrt(err2 / sig2) if sig2 > 0 else (0.0 if err2 == 0 else math.inf)
    snr = math.inf if err2 == 0 else (10 * math.log10(sig2 / err2) if sig2 > 0 else -math.inf)
    nz = xs != 0
    n_nz = int(nz.sum())
    under = float(((qs == 0) & nz).sum()) / n_nz if n_nz else 0.0
    clipped = None
    if fmt is not None:
        f = get_format(fmt)
        s = torch.as_tensor(scale, dtype=torch.float64)
        s = s.expand_as(xd)[finite] if s.ndim else s
        # beyond max + half a spacing: values that even unbounded rounding would not bring to max
        limit = f.max + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
        clipped = float(((xs * s).abs() > limit).sum()) / max(xs.numel(), 1)
    return ErrorStats(rel, snr, under, clipped, int(xs.numel()))
