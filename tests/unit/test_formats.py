"""fp8lab.fp8.formats: bit-exact rounding against torch's float8 casts, codes, recipes and error stats."""
from __future__ import annotations

import math

import pytest
import torch

from fp8lab.fp8 import formats as F
from fp8lab.fp8.formats import E4M3, E5M2, BF16, FP16

FP8 = [E4M3, E5M2]
INT_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}


def reference(x, fmt, scale=1.0):
    """The contract from the issue, written out literally."""
    return (x * scale).clamp(-fmt.max, fmt.max).to(fmt.torch_dtype).to(x.dtype) / scale


def assert_bits_equal(a, b):
    """Same NaN positions, and identical bits (sign of zero included) everywhere else."""
    assert a.dtype == b.dtype and a.shape == b.shape
    na, nb = torch.isnan(a), torch.isnan(b)
    assert torch.equal(na, nb), "NaN positions differ"
    ia, ib = a[~na].view(INT_VIEW[a.dtype]), b[~nb].view(INT_VIEW[b.dtype])
    bad = (ia != ib).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} mismatches, first: {a[~na][bad[0]]} vs {b[~nb][bad[0]]}"


def code_values(fmt):
    """The values of all 256 codes (NaNs included), via torch's own float8 dtype."""
    return torch.arange(256, dtype=torch.uint8).view(fmt.torch_dtype).to(torch.float32)


def hard_inputs(fmt):
    """All codes, all midpoints between neighbours and just beside them, subnormals, overflow."""
    vals = F.all_values(fmt).to(torch.float32)
    mids = (vals[1:] + vals[:-1]) / 2
    beside = torch.cat([torch.nextafter(mids, torch.tensor(math.inf)), torch.nextafter(mids, torch.tensor(-math.inf))])
    sub = torch.linspace(-2 * fmt.min_normal, 2 * fmt.min_normal, 4097)
    tiny = torch.tensor([fmt.min_subnormal / 2, fmt.min_subnormal / 2 * (1 + 2**-20), fmt.min_subnormal / 4,
                         1e-30, -1e-30, 0.0, -0.0])
    over = torch.tensor([fmt.max, fmt.max * 1.01, fmt.max * 1.125, fmt.max * 1.2, fmt.max * 2, fmt.max * 1e6,
                         3e38, math.inf, -math.inf, math.nan, -math.nan])
    over = torch.cat([over, -over])
    logu = torch.exp(torch.empty(20000).uniform_(-30, 30, generator=torch.Generator().manual_seed(0)))
    logu = logu * torch.where(torch.rand(20000, generator=torch.Generator().manual_seed(1)) < 0.5, -1.0, 1.0)
    return torch.cat([code_values(fmt), mids, beside, sub, tiny, over, logu])


@pytest.mark.parametrize("fmt", FP8, ids=str)
def test_constants(fmt):
    finfo = torch.finfo(fmt.torch_dtype)
    assert fmt.max == finfo.max
    assert fmt.min_normal == finfo.smallest_normal
    assert fmt.min_subnormal == float(code_values(fmt)[1])
    assert (E4M3.max, E5M2.max, E4M3.bias, E5M2.bias) == (448.0, 57344.0, 7, 15)
    assert not E4M3.has_inf and E5M2.has_inf
    for wide in (FP16, BF16):
        fi = torch.finfo(wide.torch_dtype)
        assert (wide.max, wide.min_normal) == (fi.max, fi.smallest_normal)
        assert wide.min_subnormal == fi.smallest_normal * fi.eps


@pytest.mark.parametrize("fmt", FP8, ids=str)
def test_all_values_match_torch_codes(fmt):
    vals = F.all_values(fmt)
    ref = torch.unique(code_values(fmt)[torch.isfinite(code_values(fmt))]).to(torch.float64)
    assert torch.equal(vals, ref)
    assert len(vals) == {"E4M3": 253, "E5M2": 247}[fmt.name]
    assert torch.all(vals[1:] > vals[:-1])
    assert vals[-1] == fmt.max and vals[0] == -fmt.max


@pytest.mark.parametrize("fmt", FP8, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("method", ["torch", "arith"])
def test_quantize_bit_exact_against_reference(fmt, dtype, method):
    x = hard_inputs(fmt).to(dtype)
    assert_bits_equal(F.quantize(x, fmt, method=method), reference(x, fmt))


@pytest.mark.parametrize("fmt", FP8, ids=str)
def test_quantize_with_scales_bit_exact(fmt):
    x = hard_inputs(fmt)
    for scale in (3.0, 0.37, 2.0**-7, 1e4):
        assert_bits_equal(F.quantize(x, fmt, scale, method="arith"), reference(x, fmt, scale))
        assert_bits_equal(F.quantize(x, fmt, scale), reference(x, fmt, scale))
    st = torch.rand(x.shape, generator=torch.Generator().manual_seed(3)) * 10
    assert_bits_equal(F.quantize(x, fmt, st, method="arith"), reference(x, fmt, st))


@pytest.mark.parametrize("fmt", FP8, ids=str)
def test_ties_round_to_even_and_specials(fmt):
    vals = F.all_values(fmt).to(torch.float32)
    pos = vals[vals >= 0]
    mids = (pos[1:] + pos[:-1]) / 2
    q = F.quantize(mids, fmt, method="arith")
    codes = F.encode(q, fmt).code
    assert torch.all(codes % 2 == 0), "a tie did not go to the even mantissa"
    assert torch.all((q == pos[1:]) | (q == pos[:-1]))
    special = torch.tensor([math.nan, math.inf, -math.inf, 1e9, -1e9, -1e-30])
    out = F.quantize(special, fmt)
    assert math.isnan(out[0]) and out[1:5].tolist() == [fmt.max, -fmt.max, fmt.max, -fmt.max]
    assert out[5] == 0 and torch.signbit(out[5])  # negative underflow keeps its sign


def test_quantize_keeps_dtype_shape_and_grad_free():
    x = torch.randn(3, 5, dtype=torch.bfloat16, requires_grad=True)
    q = F.quantize(x, E4M3, 2.0)
    assert q.dtype == torch.bfloat16 and q.shape == x.shape and not q.requires_grad


def test_arith_rounding_on_a_hypothetical_format():
    """E3M4 has no torch dtype: check the arithmetic path against brute-force nearest-even."""
    fmt = F.make_format(3, 4, special="ieee")
    assert fmt.max == (2 - 2**-4) * 2**3 and fmt.torch_dtype is None
    grid = F.all_values(fmt)
    x = torch.cat([torch.linspace(-17, 17, 3001, dtype=torch.float64), (grid[1:] + grid[:-1]) / 2])
    q = F.round_to_format(x, fmt).clamp(-fmt.max, fmt.max)
    d = (x.clamp(-fmt.max, fmt.max)[:, None] - grid[None, :]).abs()
    best = d.min(dim=1, keepdim=True).values
    cand = d == best  # one or two nearest values
    codes = F.encode(grid, fmt).code
    even = cand & (codes[None, :] % 2 == 0)
    pick = torch.where(cand.sum(1, keepdim=True) == 2, even, cand).float().argmax(1)
    assert torch.equal(q, grid[pick].abs().copysign(x))
    with pytest.raises(ValueError, match="method='arith'"):
        F.quantize(torch.ones(2), fmt)


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=str)
def test_arith_path_also_matches_16_bit_casts(fmt):
    g = torch.Generator().manual_seed(0)
    x = torch.exp(torch.empty(50000).uniform_(-60, 60, generator=g)) * torch.randn(50000, generator=g).sign()
    x = torch.cat([x, (F.all_values(fmt)[1:2000:7]).float()])
    assert_bits_equal(F.quantize(x, fmt, method="arith"), reference(x, fmt))


@pytest.mark.parametrize("fmt", FP8, ids=str)
def test_decode_matches_torch_and_roundtrips(fmt):
    codes = torch.arange(256)
    bits = F.decode(codes, fmt)
    ref = torch.arange(256, dtype=torch.uint8).view(fmt.torch_dtype).to(torch.float64)
    assert_bits_equal(bits.value, ref)
    enc = F.encode(bits.value, fmt)
    nan = torch.isnan(bits.value)
    assert torch.equal(enc.code[~nan], codes[~nan])
    # NaN encodes to the bytes torch writes for NaN
    torch_nan = torch.tensor([math.nan, -math.nan]).to(fmt.torch_dtype).view(torch.uint8).to(torch.int64)
    assert F.encode(torch.tensor([math.nan, -math.nan]), fmt).code.tolist() == torch_nan.tolist()
    # encode of arbitrary numbers = torch's cast, byte for byte
    x = hard_inputs(fmt)
    x = x[~torch.isnan(x)].clamp(-fmt.max, fmt.max)
    ref_codes = x.to(fmt.torch_dtype).view(torch.uint8).to(torch.int64)
    assert torch.equal(F.encode(x, fmt).code, ref_codes)
    inf_code = F.encode(math.inf, fmt).code
    assert inf_code == (0x7C if fmt.has_inf else 0x7E)  # inf where the format has it, else saturate


def test_decode_scalar_fields_and_explainer():
    b = F.decode(0x7E, E4M3)
    assert (b.sign, b.exponent, b.mantissa, b.value, b.kind) == (0, 15, 6, 448.0, "normal")
    assert b.bitstring == "0 1111 110" and "448" in b.explain()
    assert F.decode(0x7F, E4M3).kind == "nan"
    assert F.decode(0x7C, E5M2).kind == "inf" and F.decode(0xFC, E5M2).value == -math.inf
    assert F.decode(0x01, E4M3).kind == "subnormal" and F.decode(0x01, E4M3).value == 2.0**-9
    e = F.encode(-0.3, E5M2)
    assert e.sign == 1 and e.value == F.quantize(torch.tensor([-0.3]), E5M2).item()
    with pytest.raises(ValueError, match="code must be in 0..255"):
        F.decode(256, E4M3)


# ---------------------------------------------------------------- scaling recipes


def test_compute_scale_like_te():
    assert F.compute_scale(2.0, E4M3) == pytest.approx(224.0)
    assert F.compute_scale(2.0, E4M3, margin=1) == pytest.approx(112.0)
    assert F.compute_scale(1.0, E5M2, margin=3) == 57344.0 / 8
    assert F.compute_scale(0.0, E4M3) == 1.0
    assert F.compute_scale(0.0, E4M3, prev_scale=5.0) == 5.0
    assert F.compute_scale(math.inf, E4M3, prev_scale=5.0) == 5.0
    assert F.compute_scale(math.nan, E4M3, prev_scale=5.0) == 5.0
    assert F.compute_scale(1e-45, E4M3) == torch.finfo(torch.float32).max
    t = F.compute_scale(torch.tensor([2.0, 0.0, math.inf]), E4M3, prev_scale=3.0)
    assert t.tolist() == [224.0, 3.0, 3.0]


def _steps(amaxes, n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for a in amaxes:
        x = torch.randn(n, generator=g)
        out.append(x / x.abs().max() * a)
    return out


def test_delayed_scaling_uses_history_before_the_step():
    ds = F.DelayedScaling(amax_history_len=3, amax_compute_algo="max", fmt=E4M3)
    assert ds.scale == 1.0 and ds.history.numel() == 0
    xs = _steps([1.0, 2.0, 4.0, 0.5, 0.25, 0.25])
    used = []
    for x in xs:
        used.append(ds.scale)
        xq = ds.step(x)
        assert_bits_equal(xq, reference(x, E4M3, used[-1]))
    assert used[0] == 1.0
    assert used[1:] == pytest.approx([448 / 1, 448 / 2, 448 / 4, 448 / 4, 448 / 4])
    assert ds.history.tolist() == pytest.approx([0.5, 0.25, 0.25])  # the window has rolled
    assert ds.scale == pytest.approx(448 / 0.5)
    recent = F.DelayedScaling(amax_history_len=3, amax_compute_algo="most_recent")
    for x in xs:
        recent.step(x)
    assert recent.scale == pytest.approx(448 / 0.25)


def test_delayed_scaling_spike_clips_then_recovers():
    L, spike_at = 4, 6
    amaxes = [1.0] * spike_at + [1e5] + [1.0] * 8
    xs = _steps(amaxes)
    res = {}
    for algo in ("max", "most_recent"):
        ds = F.DelayedScaling(amax_history_len=L, amax_compute_algo=algo)
        rows = []
        for x in xs:
            s = ds.scale
            rows.append(F.error_stats(x, ds.step(x), E4M3, s))
        res[algo] = rows
    for algo, rows in res.items():
        assert rows[spike_at - 1].clipped_frac == 0
        assert rows[spike_at].clipped_frac > 0.5  # the stale scale (448/1) clips most of the spike
    mx, mr = res["max"], res["most_recent"]
    # after the spike "max" keeps the tiny scale for L steps: normal tensors fall into subnormals
    for k in range(spike_at + 1, spike_at + L + 1):
        assert mx[k].snr_db < mx[spike_at - 1].snr_db - 10
        assert mx[k].underflow_frac > 0.2 and mx[spike_at - 1].underflow_frac == 0
    assert mx[spike_at + L + 1].snr_db == pytest.approx(mx[spike_at - 1].snr_db, abs=3)  # spike left the window
    assert mx[spike_at + L + 1].underflow_frac == 0
    # most_recent only suffers the one step after the spike
    assert mr[spike_at + 1].snr_db < mr[spike_at - 1].snr_db - 10
    assert mr[spike_at + 2].snr_db == pytest.approx(mr[spike_at - 1].snr_db, abs=3)


def test_delayed_scaling_margin_and_zero_steps():
    ds = F.DelayedScaling(amax_history_len=8, margin=2, fmt=E5M2)
    ds.step(torch.full((4,), 3.0))
    assert ds.scale == pytest.approx(57344 / 3 / 4)
    before = ds.scale
    ds = F.DelayedScaling(amax_history_len=1, margin=0)
    ds.step(torch.full((4,), 2.0))
    ds.step(torch.zeros(4))  # amax 0: keep the previous scale
    assert ds.scale == pytest.approx(224.0) and before != ds.scale


def test_quantize_current_never_clips_and_margin():
    x = _steps([1000.0])[0]
    xq, s = F.quantize_current(x, E4M3, return_scale=True)
    assert float(s) == pytest.approx(448 / 1000)
    assert F.error_stats(x, xq, E4M3, s).clipped_frac == 0
    assert xq.abs().max() == pytest.approx(1000.0, rel=1e-6)
    _, s1 = F.quantize_current(x, E4M3, margin=1, return_scale=True)
    assert float(s1) == pytest.approx(float(s) / 2)
    assert torch.equal(F.quantize_current(torch.zeros(5), E4M3), torch.zeros(5))


def outlier_tensor(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 512, generator=g) * 0.05
    x[:, 7] *= 2000  # a few outlier channels, as in LLM activations
    x[:, 300] *= 800
    return x


@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_blockwise_scales_are_powers_of_two_and_beat_per_tensor(block):
    x = outlier_tensor()
    xq, scales = F.quantize_blockwise(x, E4M3, block=block, return_scales=True)
    assert scales.shape == (256 // block[0], 512 // block[1])
    m, _ = torch.frexp(scales)
    assert torch.all(m == 0.5), "scales must be powers of two"
    full = F.expand_block_scales(scales, block, x.shape)
    assert F.error_stats(x, xq, E4M3, full).clipped_frac == 0
    assert_bits_equal(xq, reference(x, E4M3, full))
    per_tensor = F.error_stats(x, F.quantize_current(x, E4M3))
    blk = F.error_stats(x, xq)
    assert blk.underflow_frac < per_tensor.underflow_frac
    # outlier columns dominate the norm; compare on the normal columns, where it matters
    mask = torch.ones(512, dtype=torch.bool)
    mask[[7, 300]] = False
    e_blk = F.error_stats(x[:, mask], xq[:, mask]).rel_error
    e_pt = F.error_stats(x[:, mask], F.quantize_current(x, E4M3)[:, mask]).rel_error
    if block == (1, 128):  # row blocks separate outlier channels from most normal ones
        assert e_blk < e_pt
    # float32 scales (power_of_2=False) are exactly max / block amax
    _, s32 = F.quantize_blockwise(x, E4M3, block=block, power_of_2=False, return_scales=True)
    amax = x.reshape(256 // block[0], block[0], 512 // block[1], block[1]).abs().amax(dim=(1, 3))
    assert torch.allclose(s32, 448 / amax)


def test_blockwise_partial_blocks_and_leading_dims():
    x = torch.randn(2, 3, 200)
    xq, s = F.quantize_blockwise(x, E5M2, block=(1, 128), return_scales=True)
    assert xq.shape == x.shape and s.shape == (6, 2)
    assert_bits_equal(xq, reference(x, E5M2, F.expand_block_scales(s, (1, 128), x.shape)))


@pytest.mark.parametrize("fmt", FP8, ids=str)
def test_mxfp8_scales(fmt):
    x = outlier_tensor() * torch.logspace(-6, 2, 512)  # very different blocks along the row
    xq, scales = F.quantize_mxfp8(x, fmt, return_scales=True)
    assert scales.shape == (256, 512 // 32)
    m, e = torch.frexp(scales)
    assert torch.all(m == 0.5) and torch.all((e - 1).abs() <= 127)
    amax = x.abs().reshape(256, 16, 32).amax(-1)
    scaled = amax * scales
    # OCP rule: the block amax lands in the top binade [2**emax, 2**(emax+1))
    assert torch.all(scaled >= 2.0**fmt.max_exponent) and torch.all(scaled < 2.0 ** (fmt.max_exponent + 1))
    full = F.expand_block_scales(scales, (1, 32), x.shape)
    assert_bits_equal(xq, reference(x, fmt, full))
    _, sc = F.quantize_mxfp8(x, fmt, rounding="ceil", return_scales=True)
    assert torch.all(amax * sc <= fmt.max) and torch.all(amax * sc > fmt.max / 2)
    per_tensor = F.error_stats(x, F.quantize_current(x, fmt))
    mx = F.error_stats(x, xq)
    assert mx.underflow_frac < per_tensor.underflow_frac
    if fmt is E4M3:  # E4M3's narrow range: per-tensor scaling crushes the small columns, MX keeps them
        small = slice(0, 64)
        pt_small = F.error_stats(x[:, small], F.quantize_current(x, fmt)[:, small])
        assert F.error_stats(x[:, small], xq[:, small]).snr_db > pt_small.snr_db + 10


def test_mxfp8_zero_block_and_partial():
    x = torch.zeros(2, 40)
    x[1, 35] = 3.0
    xq, s = F.quantize_mxfp8(x, E4M3, return_scales=True)
    assert s.shape == (2, 2) and s[0, 0] == 1.0
    assert xq[1, 35] == 3.0 and torch.count_nonzero(xq) == 1


# ---------------------------------------------------------------- error statistics


def test_error_stats_known_answers():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    xq = torch.tensor([1.0, 2.0, 3.0, 0.0])
    st = F.error_stats(x, xq)
    assert st.rel_error == pytest.approx(4 / math.sqrt(30))
    assert st.snr_db == pytest.approx(10 * math.log10(30 / 16))
    assert st.underflow_frac == 0.25 and st.clipped_frac is None and st.n == 4
    exact = F.error_stats(x, x.clone(), E4M3)
    assert exact.snr_db == math.inf and exact.rel_error == 0 and exact.clipped_frac == 0
    y = torch.tensor([1.0, 500.0, -1000.0, 0.0, math.nan])
    assert F.error_stats(y, F.quantize(y, E4M3), E4M3).clipped_frac == 0.5
    assert F.error_stats(y, F.quantize(y, E4M3, 0.5), E4M3, 0.5).clipped_frac == 0.25
    # underflow counts only nonzero inputs
    z = torch.tensor([0.0, 0.0, 1e-6, 1.0])
    assert F.error_stats(z, F.quantize(z, E4M3), E4M3).underflow_frac == 0.5
    assert set(st.as_dict()) == {"rel_error", "snr_db", "underflow_frac", "clipped_frac", "n"}


# ---------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("call, match", [
    (lambda: F.DelayedScaling(amax_compute_algo="mean"), "amax_compute_algo must be one of max, most_recent"),
    (lambda: F.DelayedScaling(amax_history_len=0), "amax_history_len"),
    (lambda: F.DelayedScaling(margin=-1), "margin"),
    (lambda: F.compute_scale(1.0, E4M3, margin=-2), "margin"),
    (lambda: F.quantize(torch.ones(2), "E3M3"), "fmt must be .* E4M3, E5M2, FP16, BF16"),
    (lambda: F.quantize(torch.ones(2), E4M3, method="fast"), "method must be one of torch, arith"),
    (lambda: F.quantize(torch.ones(2, dtype=torch.int32), E4M3), "floating-point"),
    (lambda: F.quantize_blockwise(torch.ones(4, 4), block=(0, 128)), r"block must be a pair"),
    (lambda: F.quantize_blockwise(torch.ones(4, 4), block=128), r"block must be a pair"),
    (lambda: F.quantize_mxfp8(torch.ones(4, 4), block=0), "block must be a positive int"),
    (lambda: F.quantize_mxfp8(torch.ones(4, 4), rounding="up"), "rounding must be one of floor, ceil"),
    (lambda: F.error_stats(torch.ones(3), torch.ones(4)), "same shape"),
    (lambda: F.make_format(1, 3), "exponent_bits"),
    (lambda: F.make_format(4, 3, special="fnuz"), "special"),
    (lambda: F.all_values(F.make_format(8, 23)), "at most 16 bits"),
])
def test_bad_arguments_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_get_format_accepts_names():
    assert F.get_format("e4m3") is E4M3 and F.get_format("BF16") is BF16


@pytest.mark.parametrize("fmt", FP8, ids=str)
def test_float64_inputs_round_through_float32_like_torch(fmt):
    """Just above a midpoint in float64 but a tie in float32: torch's cast goes through float32."""
    vals = F.all_values(fmt)
    mids = (vals[1:] + vals[:-1]) / 2
    x = torch.cat([mids * (1 + 2.0**-40), mids * (1 - 2.0**-40)])
    assert_bits_equal(F.quantize(x, fmt, method="arith"), reference(x, fmt))
