"""The fused linear cross-entropy (fp8lab.train.fused_loss, issue 51) against the plain path, in fp32 on the CPU:
loss within 1e-4 relative, gradients of the head and of the last hidden states within 1e-3, tied
embeddings included (Llama-3.2 / Qwen2.5-style configs), and the decision and memory rules."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp8lab.train import fused_loss
from fp8lab.train.fused_loss import linear_cross_entropy


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _plain(h, w, y):
    return F.cross_entropy((h @ w.t()).float().reshape(-1, w.shape[0]), y.reshape(-1), ignore_index=-100)


@pytest.mark.parametrize("chunk", [7, 64, 1000])  # several uneven chunks, and one chunk holding all tokens
def test_matches_plain_path_fp32(chunk):
    g = torch.Generator().manual_seed(chunk)
    h0 = torch.randn(3, 50, 32, generator=g)
    w0 = torch.randn(97, 32, generator=g) * 0.3
    y = torch.randint(0, 97, (3, 50), generator=g)
    h1, w1 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    ref = _plain(h1, w1, y)
    (ref * 0.25).backward()  # the trainer divides by the accumulation
    got = linear_cross_entropy(h2, w2, y, chunk=chunk)
    (got * 0.25).backward()
    assert abs(got.item() - ref.item()) / abs(ref.item()) < 1e-4
    assert rel(h2.grad, h1.grad) < 1e-3
    assert rel(w2.grad, w1.grad) < 1e-3
    assert h2.grad.dtype == h0.dtype and w2.grad.dtype == w0.dtype


def test_ignore_index_counts_only_real_targets():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(40, 16, generator=g, requires_grad=True)
    w = torch.randn(33, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 33, (40,), generator=g)
    y[::3] = -100
    ref = _plain(h, w, y)
    gh, gw = torch.autograd.grad(ref, (h, w))
    got = linear_cross_entropy(h, w, y, chunk=9)
    fh, fw = torch.autograd.grad(got, (h, w))
    assert abs(got.item() - ref.item()) / ref.item() < 1e-4
    assert rel(fh, gh) < 1e-3 and rel(fw, gw) < 1e-3
    assert float(fh[::3].abs().max()) == 0.0  # ignored tokens get no gradient


def test_no_grad_forward_is_the_loss_only():
    h, w = torch.randn(20, 8), torch.randn(11, 8)
    y = torch.randint(0, 11, (20,))
    with torch.no_grad():
        got = linear_cross_entropy(h, w, y, chunk=6)
    assert abs(float(got) - float(_plain(h, w, y))) < 1e-5


def _tiny(family: str, tied: bool):
    """A real transformers model of the Llama-3.2 (tied) / Qwen2.5 (tied, qkv bias) kind, tiny and fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=211, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied)
    torch.manual_seed(0)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                    "original_max_position_embeddings": 16}))
    return Qwen2ForCausalLM(Qwen2Config(**common))


@pytest.mark.parametrize("family,tied", [("llama", True), ("qwen2", True), ("llama", False)])
def test_installed_head_matches_plain_model(family, tied):
    """The head computes the loss inside the model's forward: same loss, same gradients (tied weights included)."""
    import copy

    plain = _tiny(family, tied)
    fused = copy.deepcopy(plain)
    fused_loss.install(fused)
    assert fused_loss.installed(fused) and (fused.lm_head.weight is fused.model.embed_tokens.weight) == tied
    assert set(fused.state_dict()) == set(plain.state_dict())  # checkpoints and export unchanged
    x = torch.randint(0, 211, (2, 24), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    ref = F.cross_entropy(plain(x).logits.float().reshape(-1, 211), y.reshape(-1))
    ref.backward()
    with fused_loss.targets(fused, y):
        got = fused(x).logits  # the head returned the loss
    got.backward()
    assert got.dim() == 0 and abs(got.item() - ref.item()) / ref.item() < 1e-4
    assert rel(fused.lm_head.weight.grad, plain.lm_head.weight.grad) < 1e-3
    for (n, p), q in zip(fused.named_parameters(), plain.parameters()):  # the last hidden states' gradient flows on
        assert rel(p.grad, q.grad) < 1e-3, n
    with torch.no_grad():  # without targets the head is a plain Linear again (generation, export)
        assert torch.allclose(fused(x).logits, plain(x).logits)


def test_install_refuses_a_head_with_bias():
    m = torch.nn.Module()
    m.lm_head = torch.nn.Linear(4, 7, bias=True)
    with pytest.raises(ValueError, match="--fused-loss: the LM head has a bias"):
        fused_loss.install(m)


def test_install_tunes_the_triton_kernel_for_the_trainers_autocast_dtype(monkeypatch):
    """Where the Triton kernel runs, install tunes it before the first step for the dtype the head's GEMM will run
    in (the trainer's autocast dtype, or the weight's own where no autocast runs: --compute-dtype fp32), then checks
    the config the tuning picked at the head's vocabulary against the eager math; where that fails, a warning, and
    the next kernel down runs from then on."""
    from fp8lab.train import ce_kernel

    tuned, checked, verdict = [], [], [None]
    monkeypatch.setattr(fused_loss, "_TRITON_OK", {"cpu": True})
    monkeypatch.setattr(fused_loss, "kernel_for", lambda device_type, planned=None: "triton")
    monkeypatch.setattr(ce_kernel, "warm_up", lambda vocab, dtype, device, out_dtype=None: tuned.append(
        (vocab, dtype, device.type) + ((out_dtype,) if out_dtype else ())))
    monkeypatch.setattr(fused_loss, "_kernel_agrees",
                        lambda device_type, vocab, dtype, config: checked.append((vocab, dtype, config)) or verdict[0])
    for dtype in (torch.bfloat16, None):
        m = torch.nn.Module()
        m.lm_head = torch.nn.Linear(4, 7, bias=False)
        fused_loss.install(m, dtype)
        assert fused_loss.installed(m)
    assert tuned == [(7, torch.bfloat16, "cpu"), (7, torch.float32, "cpu")]
    assert checked == [(7, torch.bfloat16, None), (7, torch.float32, None)]  # None: the autotuned pick
    # with the head's GEMMs in FP8, the kernel that writes the E5M2 gradient is tuned too (Triton keys it apart)
    m16 = torch.nn.Module()
    m16.lm_head = torch.nn.Linear(16, 32, bias=False)
    fused_loss.install(m16, torch.bfloat16, fp8=True)
    assert tuned[-1] == (32, torch.bfloat16, "cpu", "float8_e5m2")
    assert fused_loss._TRITON_OK == {"cpu": True}
    verdict[0] = "its result differs from the eager math"
    with pytest.warns(UserWarning, match="Triton chunk kernel is not used \\(its result differs"):
        fused_loss.install(m, torch.bfloat16)
    assert fused_loss._TRITON_OK == {"cpu": False}


def test_the_installed_head_runs_the_plans_kernel(monkeypatch):
    """The trainer hands install the plan's fused_loss_kernel, and the head runs that kernel (here the compiled math,
    on a CPU counted as a device that compiles), not the rule's choice for the device (a CPU's: eager)."""
    ran = []

    def math_for(device_type, kernel):
        ran.append(kernel)
        return fused_loss._chunk_math_eager

    monkeypatch.setattr(fused_loss, "_math_for", math_for)
    monkeypatch.setattr(fused_loss, "COMPILE_ON", ("cpu",))
    monkeypatch.setattr(fused_loss, "_COMPILED", {})
    assert fused_loss.kernel_for("cpu") == "eager"  # the rule's choice here
    m = torch.nn.Module()
    m.lm_head = torch.nn.Linear(8, 11, bias=False)
    fused_loss.install(m, None, kernel="compiled")
    h, y = torch.randn(2, 5, 8, requires_grad=True), torch.randint(0, 11, (2, 5))
    with fused_loss.targets(m, y):
        loss = m.lm_head(h)
    assert ran == ["compiled"] and loss.dim() == 0
    assert abs(loss.item() - _plain(h, m.lm_head.weight, y).item()) < 1e-5


def test_decide_rule():
    on, why = fused_loss.decide("auto", vocab=128_256, tokens_per_micro_batch=32_768, gpu=True)
    assert on and "auto" in why
    assert fused_loss.decide("auto", vocab=32_000, tokens_per_micro_batch=32_768, gpu=True)[0]  # llama-1b, measured
    off, why = fused_loss.decide("auto", vocab=32_000, tokens_per_micro_batch=4096, gpu=True)  # llama-7b's 2 x 2048
    assert not off and "the plain loss" in why
    assert not fused_loss.decide("auto", vocab=151_936, tokens_per_micro_batch=32_768, gpu=False)[0]
    assert fused_loss.decide("on", vocab=100, tokens_per_micro_batch=4, gpu=False)[0]
    assert not fused_loss.decide("off", vocab=151_936, tokens_per_micro_batch=32_768, gpu=True)[0]
    with pytest.raises(ValueError, match=r"--fused-loss='maybe' is invalid; allowed: auto \| on \| off"):
        fused_loss.decide("maybe", vocab=1, tokens_per_micro_batch=1, gpu=True)


def test_loss_bytes_is_far_below_the_full_logits():
    v, h, n = 128_256, 2048, 32_768
    for kernel in fused_loss.KERNELS:
        assert fused_loss.chunk_tokens(v, n, kernel) * v * fused_loss.BYTES_PER_LOGIT[kernel] <= fused_loss.CHUNK_BYTES
        assert fused_loss.loss_bytes(vocab=v, hidden=h, tokens_per_micro_batch=n, kernel=kernel) < 0.2 * 16 * v * n


def test_chunk_sizes_by_kernel():
    """The in-place Triton kernel takes the whole 16 x 2048 micro-batch at 32K-152K vocabularies; the compiled
    math (its fallback) keeps the chunks the first study's runs had: 8,192 tokens at 128K-152K, all at 32K."""
    for v in (32_000, 128_256, 151_936):
        assert fused_loss.chunk_tokens(v, 32_768, "triton") == 32_768
    assert [fused_loss.chunk_tokens(v, 32_768, "compiled") for v in (32_000, 128_256, 151_936)] == [32_768, 8192, 8192]
    assert fused_loss.chunk_tokens(128_256, 100, "triton") == 100  # at most all the tokens
    assert fused_loss.kernel_for("cpu") == "eager"
    with pytest.raises(ValueError, match=r"kernel='fast' is invalid; allowed: triton \| compiled \| eager"):
        linear_cross_entropy(torch.zeros(2, 4), torch.zeros(3, 4), torch.zeros(2, dtype=torch.long), kernel="fast")


def test_the_plan_records_the_chunk_kernel_its_memory_was_counted_for(monkeypatch):
    """The Triton kernel on a GPU by default, eager on a CPU; a machine whose study chose the compiled math
    (FP8LAB_FUSED_LOSS_KERNEL=compiled, read by Machine.detect into ``loss_kernel``) plans it, and a wrong value is
    refused when the run is planned, naming the allowed ones."""
    import dataclasses

    from fp8lab.core.hardware import Machine
    from fp8lab.plan.layout import resolve
    from fp8lab.plan.runplan import plan_run
    from fp8lab.train.entry import TrainConfig

    gpu = Machine("cuda", "NVIDIA H200", 139.8, te_usable=True, fp8=True)
    cpu = Machine("cpu", "cpu", 24.0)
    monkeypatch.setenv(fused_loss.KERNEL_ENV, "compiled")  # this process's environment: not read by the plan
    tri = plan_run(TrainConfig(model="llama-1b", precision="bf16", backend="te"), gpu)
    assert tri.fused_loss is True and tri.fused_loss_kernel == tri.record()["fused_loss_kernel"] == "triton"
    assert plan_run(TrainConfig(model="llama-tiny", fused_loss="on"), cpu).record()["fused_loss_kernel"] == "eager"
    off = plan_run(TrainConfig(model="llama-tiny"), cpu).record()
    assert off["fused_loss"] is False and off["fused_loss_kernel"] is None
    assert Machine.detect("cpu", unusable=()).loss_kernel == "compiled"  # where it is read: this machine's facts
    comp = plan_run(TrainConfig(model="llama-1b", precision="bf16", backend="te"),
                    dataclasses.replace(gpu, loss_kernel="compiled")).record()
    assert comp["fused_loss"] is True and comp["fused_loss_kernel"] == "compiled"
    assert tri.layout.memory.peak < comp["memory_estimate_peak_gib"]  # its chunk holds its bf16 logits only
    # the layout counts the kernel the plan hands it
    c = TrainConfig(model="llama-1b", precision="bf16", backend="te")
    assert resolve(c, gpu, "te", loss_kernel="compiled").memory.peak == comp["memory_estimate_peak_gib"]
    assert resolve(c, gpu, "te").memory.peak == resolve(c, gpu, "te", loss_kernel="triton").memory.peak \
        == tri.layout.memory.peak
    with pytest.raises(ValueError, match=r"FP8LAB_FUSED_LOSS_KERNEL='fast' is invalid; allowed: triton \| compiled \| eager"):
        plan_run(TrainConfig(model="llama-1b", precision="bf16", backend="te"), dataclasses.replace(gpu, loss_kernel="fast"))


def _falls_back_to_the_plain_result(seed: int, warning: str, **kw) -> None:
    """40 tokens against 31 vocabulary entries: the fused loss (``kw``) warns ``warning`` and still gives the plain
    path's loss and gradients (a kernel failed and the next one down ran)."""
    g = torch.Generator().manual_seed(seed)
    h0, w0 = torch.randn(40, 16, generator=g), torch.randn(31, 16, generator=g)
    y = torch.randint(0, 31, (40,), generator=g)
    h1, w1 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    ref = _plain(h1, w1, y)
    ref.backward()
    with pytest.warns(UserWarning, match=warning):
        got = linear_cross_entropy(h2, w2, y, **kw)
    got.backward()
    assert abs(got.item() - ref.item()) / ref.item() < 1e-5
    assert rel(h2.grad, h1.grad) < 1e-4 and rel(w2.grad, w1.grad) < 1e-4


def test_a_kernel_that_fails_midway_falls_back_to_the_eager_math_on_fresh_logits(monkeypatch):
    """A chunk kernel that raises after writing over part of the logits: a warning, then the eager math on the
    logits computed again, so the loss and gradients are still the plain path's."""
    def broken(logits, t, v, scale):
        logits[:, :5] = 1e4  # an in-place kernel's partial write
        raise RuntimeError("launch failed")

    monkeypatch.setattr(fused_loss, "_math_for",
                        lambda device_type, kernel: fused_loss._chunk_math_eager if kernel == "eager" else broken)
    monkeypatch.setattr(fused_loss, "_TRITON_OK", {})
    monkeypatch.setattr(fused_loss, "_COMPILED", {})
    _falls_back_to_the_plain_result(3, "the triton chunk math failed .*RuntimeError: launch failed.*eagerly",
                                    chunk=16, kernel="triton")
    assert fused_loss._TRITON_OK == {"cpu": False}  # not tried again in this process


def test_a_failed_triton_kernel_leaves_the_compiled_math_in_its_own_chunks(monkeypatch):
    """Only the kernel that failed is dropped: where the compiled math runs (here: a CPU counted as one), the loss
    runs again with it, in the compiled math's smaller chunks (the memory the layout counted), not the Triton kernel's."""
    import fp8lab.plan.fused_loss as rule

    monkeypatch.setattr(rule, "MIN_CHUNK_TOKENS", 4)
    monkeypatch.setattr(rule, "CHUNK_BYTES", 4000)  # 31 entries: triton (2.6 B/logit) 32 tokens, compiled (9) 8
    assert (rule.chunk_tokens(31, 40, "triton"), rule.chunk_tokens(31, 40, "compiled")) == (32, 8)
    sizes = []

    def broken(logits, t, v, scale):
        raise RuntimeError("launch failed")

    def compiled(logits, t, v, scale):
        sizes.append(logits.shape[0])
        return fused_loss._chunk_math_eager(logits, t, v, scale)

    kernels = {"triton": broken, "compiled": compiled, "eager": fused_loss._chunk_math_eager}
    monkeypatch.setattr(fused_loss, "_math_for", lambda device_type, kernel: kernels[kernel])
    monkeypatch.setattr(fused_loss, "COMPILE_ON", ("cpu",))
    monkeypatch.setattr(fused_loss, "_TRITON_OK", {})
    monkeypatch.setattr(fused_loss, "_COMPILED", {})
    _falls_back_to_the_plain_result(4, "the triton chunk math failed .*launch failed.*with the compiled chunk math",
                                    kernel="triton")
    assert sizes == [8, 8, 8, 8, 8]
    assert fused_loss._TRITON_OK == {"cpu": False} and fused_loss._COMPILED == {}  # the compiled math stays usable
    assert fused_loss.kernel_for("cpu", "triton") == "compiled"  # what a study's next loss runs


def test_a_triton_kernel_that_disagrees_is_not_used(monkeypatch):
    """The once-per-process check: where a study asks for ce_kernel and it runs but disagrees with the eager math (or
    raises), a warning names why and the fused loss runs the next kernel down (a CPU: eager)."""
    from fp8lab.train import ce_kernel

    monkeypatch.setattr(ce_kernel, "available", lambda device_type: True)
    monkeypatch.setattr(ce_kernel, "chunk_math", lambda logits, t, v, scale, **kw: (torch.tensor(0.0), logits * 0))
    monkeypatch.setattr(fused_loss, "_TRITON_OK", {})
    with pytest.warns(UserWarning, match="Triton chunk kernel is not used \\(its result differs from the eager math\\)"):
        assert fused_loss.kernel_for("cpu", "triton") == "eager"
    assert fused_loss.kernel_for("cpu", "triton") == "eager"  # checked once


_INTERPRETED_CHECK = """
import torch
from fp8lab.train import ce_kernel, fused_loss
g = torch.Generator().manual_seed(11)
cases = [(i, d, cols) for i in range(len(ce_kernel.CONFIGS)) for d in (torch.float32, torch.bfloat16)
         for cols in (2 * ce_kernel.CONFIGS[i][0] + 123, ce_kernel.CONFIGS[i][0] - 77)]  # several blocks; one (SINGLE)
for i, dtype, cols in cases:
    ce_kernel.INTERPRET_CONFIG = i  # each config the GPU's autotuning may pick (PER_SM: 2 "SMs" here, rows shared)
    x = (torch.randn(5, cols, generator=g) * 3).to(dtype)
    t = torch.randint(0, x.shape[1], (5,), generator=g)
    v = torch.tensor([True, False, True, True, True])
    scale = torch.tensor(0.25)
    want_loss, want_g = fused_loss._chunk_math_eager(x.clone(), t, v, scale)
    buf = x.clone()
    got_loss, got_g = ce_kernel.chunk_math(buf, t, v, scale)
    assert got_g.data_ptr() == buf.data_ptr()
    assert abs(float(got_loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss)), (got_loss, want_loss)
    tol = 1e-7 if dtype == torch.float32 else 2e-3  # bf16: one rounding step of values up to 0.25
    err = float((got_g.float() - want_g.float()).abs().max())
    assert err <= tol, err
    assert float(got_g[1].abs().max()) == 0.0
    # into another buffer (as the FP8 head's E5M2 gradient is written): the logits untouched, the same gradient.
    # (E5M2 itself is checked on the GPU: the interpreter's float-to-FP8 rounding loses the carry into the exponent.)
    out = torch.empty(x.shape, dtype=x.dtype)
    buf = x.clone()
    got_loss2, got_g2 = ce_kernel.chunk_math(buf, t, v, scale, out=out)
    assert got_g2.data_ptr() == out.data_ptr() and torch.equal(buf, x)
    assert torch.equal(got_g2, got_g) and float(got_loss2) == float(got_loss)
# the FP8 head's tiled transpose (fp8lab.train.fp8_transpose), partial tiles at both edges, E4M3 and E5M2
from fp8lab.train import fp8_transpose
for shape in ((70, 300), (64, 256), (1, 5)):
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        x = (torch.randn(*shape, generator=g) * 8).to(fp8)
        y = fp8_transpose.transpose(x)
        assert y.shape == shape[::-1] and y.is_contiguous()
        assert torch.equal(y.view(torch.uint8), x.t().contiguous().view(torch.uint8))
ce_kernel.INTERPRET_CONFIG = 0
assert fused_loss._kernel_agrees("cpu") is None  # the check at first use, and the one after tuning (bf16)
assert fused_loss._kernel_agrees("cpu", 40_000, torch.bfloat16, config=None) is None
print("interpreted kernel ok")
"""


def test_the_triton_kernel_is_the_eager_math_in_the_interpreter():
    """fp8lab.train.ce_kernel run by Triton's interpreter on the CPU (TRITON_INTERPRET=1, set before triton is
    imported: a fresh process) against the eager math: rows of several blocks with a partial last one, and rows of
    one block (read once), an ignored target, fp32 and bf16, for each of its configs (the persistent ones with
    fewer programs than rows), and the gradient written into another buffer (the FP8 head's way); and the FP8 head's
    tiled transpose. The compiled kernels on the GPU: tests/gpu/test_fused_loss_gpu.py, test_fp8_head_chunks_gpu.py."""
    import os
    import subprocess
    import sys

    import importlib.util
    from pathlib import Path

    from fp8lab.core.paths import REPO_ROOT

    cpu_triton = Path(sys.prefix) / "cpu-tests" / "triton"  # FP8LAB_CPU_TRITON=1 bash scripts/setup.sh (.ci/run)
    if not (cpu_triton / "triton").is_dir() and importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton (its interpreter runs the kernel on a CPU): FP8LAB_CPU_TRITON=1 bash scripts/setup.sh "
                    "puts it in .venv/cpu-tests/triton, as .ci/run does; the GPU suite runs the compiled kernel")
    path = [str(cpu_triton) if cpu_triton.is_dir() else None, str(REPO_ROOT), os.environ.get("PYTHONPATH")]
    r = subprocess.run([sys.executable, "-c", _INTERPRETED_CHECK], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(filter(None, path))})
    assert r.returncode == 0 and "interpreted kernel ok" in r.stdout, r.stderr[-2000:]
