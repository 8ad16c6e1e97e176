"""``--fp8-lm-head``: the LM head's GEMMs in FP8 too. Over the full logits (``--fused-loss off``) the head becomes the
backend's FP8 layer, on the emulated backend here (TE's in tests/gpu/test_fp8_lm_head_gpu.py); in the chunked loss its
three GEMMs run in FP8 (tests/unit/test_fp8_head_chunks.py). Refused where it cannot run, before anything is built;
the head holds the same parameters (tied heads stay tied), runs in FP8 inside autocast only, and a real training run
records it, watches its casts and exports a model its HF class loads."""
from __future__ import annotations

import json

import pytest
import torch

from fp8lab.fp8.convert import autocast, convert_model, export_hf_state_dict, fp8_lm_head
from fp8lab.plan import fused_loss
from fp8lab.train.entry import TrainConfig, train


def _tiny(tied: bool, vocab: int = 224):
    """A real transformers Llama, tiny and fp32; FP8 GEMMs need its vocabulary divisible by 16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=tied))


def test_refused_where_it_cannot_run_before_anything_is_built(tmp_path):
    with pytest.raises(ValueError, match=r"--fp8-lm-head True needs --precision fp8 \(got bf16\).*allowed: "
                                         r"--fp8-lm-head auto \| False"):
        TrainConfig(model="llama-tiny", fp8_lm_head=True, precision="bf16")
    with pytest.raises(ValueError, match=r"--fp8-lm-head='yes' is invalid.*auto \| True \| False"):
        TrainConfig(model="llama-tiny", fp8_lm_head="yes")
    # over the full logits the head is the backend's FP8 layer, which torchao has not: refused when planned
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run

    h100 = Machine(device="cuda", name="NVIDIA H100 80GB HBM3", memory_gib=79.1, te_usable=True, fp8=True)
    c = TrainConfig(model="llama-1b", precision="fp8", backend="torchao", fp8_lm_head=True, fused_loss="off")
    with pytest.raises(ValueError, match=r"--fp8-lm-head True without the fused loss, with --backend torchao: allowed "
                                         r"backends: te \| emulated; or --fused-loss on"):
        plan_run(c, h100)
    # in the chunks it runs beside any backend
    assert plan_run(TrainConfig(model="llama-1b", precision="fp8", backend="torchao", fp8_lm_head=True,
                                fused_loss="on"), h100).fp8_lm_head is True


def test_the_backends_named_for_the_fp8_head_are_those_that_make_one():
    from fp8lab.fp8.backends import FP8_LM_HEAD_BACKENDS, backend_names, get_backend

    assert [n for n in backend_names() if hasattr(get_backend(n), "fp8_linear")] == [
        n for n in backend_names() if n in FP8_LM_HEAD_BACKENDS]


def test_the_rule_runs_the_head_in_fp8_in_the_chunks_of_an_fp8_run_on_fp8_gpus():
    """auto: on where the loss is chunked in an FP8 run on a GPU with FP8 GEMMs and the head's shape suits them."""
    llama = dict(vocab=128_256, hidden=2048)
    assert fused_loss.fp8_head_decide("auto", precision="fp8", fused=True, fp8_gemms=True, **llama)[0] is True
    for kw, why in ((dict(precision="bf16"), "a bf16 run"), (dict(fused=False), "off without the fused loss"),
                    (dict(fp8_gemms=False), "without FP8 GEMMs")):
        on, reason = fused_loss.fp8_head_decide("auto", **{**dict(precision="fp8", fused=True, fp8_gemms=True), **kw},
                                                **llama)
        assert on is False and why in reason, reason
    on, reason = fused_loss.fp8_head_decide("auto", precision="fp8", fused=True, fp8_gemms=True, vocab=50_257,
                                            hidden=768)
    assert on is False and "50257 x hidden 768 is not a multiple of 16" in reason
    on, reason = fused_loss.fp8_head_decide(True, precision="fp8", fused=False, fp8_gemms=False, **llama)
    assert on is True and "over the full logits" in reason
    assert fused_loss.fp8_head_decide(False, precision="fp8", fused=True, fp8_gemms=True, **llama)[0] is False
    # the chunks of an FP8 head hold the gradient's E5M2 copy too: smaller chunks, more bytes counted
    assert fused_loss.chunk_tokens(151_936, 32_768, "triton", fp8=True) < fused_loss.chunk_tokens(151_936, 32_768,
                                                                                                   "triton")
    assert (fused_loss.loss_bytes(vocab=128_256, hidden=2048, tokens_per_micro_batch=32_768, kernel="triton",
                                  fp8_head=True)
            > fused_loss.loss_bytes(vocab=128_256, hidden=2048, tokens_per_micro_batch=32_768, kernel="triton"))


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "swapped"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_head_runs_in_fp8_inside_autocast_holding_the_same_weights(fuse, tied):
    hf = _tiny(tied)
    x = torch.randint(0, 224, (2, 16), generator=torch.Generator().manual_seed(3))
    model = convert_model(hf, backend="emulated", fuse=fuse)
    with torch.no_grad(), autocast("emulated"):
        bf16_head = model(x).logits
    head = model.lm_head
    converted = fp8_lm_head(model)
    assert converted is model and type(model.lm_head).__name__ == "EmuLinear"
    assert model.lm_head.weight is head.weight  # nothing copied
    embed = model.embed if fuse else model.model.embed_tokens
    assert (model.lm_head.weight is embed.weight) == tied
    info = model.fp8lab_conversion
    assert "lm_head" in info.fp8_modules and "lm_head" not in info.high_precision
    with torch.no_grad():
        with autocast("emulated"):
            fp8_head = model(x).logits
        with autocast("emulated", enabled=False):
            plain = model(x).logits
        ref = hf(x).logits if not fuse else None
    err = float((fp8_head - bf16_head).norm() / bf16_head.norm())
    assert 1e-4 < err < 0.1, err  # quantised (not the same logits) yet close
    if ref is not None:  # outside autocast the swapped model is the HF model again
        assert torch.allclose(plain, ref, atol=1e-5)
    sd = export_hf_state_dict(model)  # the head's weight exports under its HF name
    assert torch.equal(sd["lm_head.weight"], head.weight.detach()) or tied


def test_refused_on_a_model_that_is_not_converted_or_has_no_plain_head():
    hf = _tiny(False)
    with pytest.raises(ValueError, match=r"--fp8-lm-head: lm_head has shape \(out=211, in=64\); FP8 GEMMs need both "
                                         r"divisible by 16"):
        fp8_lm_head(convert_model(_tiny(False, vocab=211), backend="emulated", fuse=True))
    with pytest.raises(ValueError, match="not a converted model"):
        fp8_lm_head(hf)
    model = fp8_lm_head(convert_model(hf, backend="emulated", fuse=True))
    with pytest.raises(ValueError, match="--fp8-lm-head: the model's lm_head is EmuLinear, not a high-precision nn.Linear"):
        fp8_lm_head(model)


def test_a_training_run_records_the_fp8_head_and_watches_its_casts(prepared, tmp_path):
    out = tmp_path / "run"
    s = train(TrainConfig(model="llama-tiny", precision="fp8", backend="emulated", fp8_lm_head=True, steps=4,
                          fp8_stats_every=2, data=str(prepared), output_dir=str(out), progress="off",
                          print_metrics=False, plot=False, checkpoint_every=-1))
    assert s["status"] == "completed" and s["nonfinite_steps"] == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["fp8_lm_head"] is True and cfg["fused_loss"] == "off"
    assert "over the full logits" in cfg["plan"]["reasons"]["fp8_lm_head"]
    text = (out / "metrics.jsonl").read_text()
    assert '"lm_head"' in text  # the FP8 health records name the head's casts
    from transformers import AutoModelForCausalLM

    back = AutoModelForCausalLM.from_pretrained(out / "model")
    assert back.lm_head.weight.shape[0] == 512


def test_the_reports_tell_the_fp8_head_runs_apart_and_quote_the_plain_recipe():
    """The committed FP8-head loss runs (data/results/loss-parity-20m, whose harness wrote the option in the command
    only) are labelled ``fp8-head``, are their own seeds, and the headline's loss stays the plain recipe's."""
    from fp8lab import analysis
    from fp8lab.analysis import headline, parity
    from fp8lab.analysis.labels import variant_label
    from fp8lab.core.paths import REPO_ROOT

    assert "fp8-head" in variant_label({"precision": "fp8", "backend": "te", "recipe": "delayed", "fp8_lm_head": 1.0})
    assert "fp8-head" not in variant_label({"precision": "bf16", "backend": "te", "fp8_lm_head": True})
    s = analysis.summarize_runs(analysis.load_runs([REPO_ROOT / "data" / "results" / "loss-parity-20m"]))
    heads = sorted(s.loc[s["variant"].str.contains("fp8-head"), "run_id"])
    assert heads == ["llama-1b-te-fp8-delayed-head-20m-s1234", "llama-1b-te-fp8-delayed-head-20m-s4321"]
    assert sorted(parity.seeds_of(s, heads[0])["run_id"]) == heads
    loss = headline._headline_loss(analysis.compare_precisions(s), s, "llama-1b", "delayed")
    assert "fp8-head" not in loss["loss_fp8_variant"] and loss["loss_fp8_seeds"] == 3
    assert "head" not in loss["loss_fp8_runs"]


def test_a_sagemaker_job_carries_the_fp8_head_and_is_refused_as_the_trainer_would():
    from fp8lab import launch as L

    base = dict(role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, tokens=10**9)
    spec = L.JobSpec(model="llama-1b", precision="fp8", options={"fp8_lm_head": True}, **base)
    hp = L.hyperparameters(spec)
    assert spec.plan.fused_loss and spec.plan.fp8_lm_head and hp["fp8-lm-head"] is True and hp["fused-loss"] == "on"
    from fp8lab.plan import evidence as fevidence

    # auto on P5's H100s, once the head's GPU check passes (fp8lab.plan.evidence)
    assert L.JobSpec(model="llama-1b", precision="fp8", **base).plan.fp8_lm_head is fevidence.load().fp8_head
    with pytest.raises(ValueError, match=r"the trainer would refuse this job: --fp8-lm-head True needs --precision fp8"):
        L.JobSpec(model="llama-1b", precision="bf16", options={"fp8_lm_head": True}, **base)


def test_where_only_the_bf16_head_fits_auto_keeps_it_and_says_why():
    """Llama-3.1-8B (32 layers) with --memory fp8-exp-avg fits one H100 only without the FP8 head's copies: auto keeps
    the head in BF16 there (the same layout as before the head ran in FP8), an explicit True is refused."""
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run

    from fp8lab.plan.evidence import Evidence

    h100 = Machine(device="cuda", name="NVIDIA H100 80GB HBM3", memory_gib=79.1, te_usable=True, fp8=True)
    folder = "data/reference/configs/llama-3.1-8b"
    checked = Evidence(fp8_head=True)  # the head's GPU check committed: auto may run it
    p = plan_run(TrainConfig(model=folder, precision="fp8", memory="fp8-exp-avg"), h100, checked)
    assert p.fused_loss and not p.fp8_lm_head and not p.layout.fp8_head
    assert "no layout fits" in p.all_reasons()["fp8_lm_head"] and p.layout.memory.peak < 74
    assert p.options()["fp8_lm_head"] is False
    with pytest.raises(ValueError, match="does not fit"):
        plan_run(TrainConfig(model=folder, precision="fp8", memory="fp8-exp-avg", fp8_lm_head=True), h100, checked)
    small = plan_run(TrainConfig(model="llama-1b", precision="fp8"), h100, checked)  # where it fits, auto runs it
    assert small.fp8_lm_head and small.layout.fp8_head
    # the same layout as the head in BF16 gets, wherever auto runs it (here the H100's plain commands)
    for model in ("llama-1b", "data/reference/configs/llama-3.2-1b", "data/reference/configs/qwen2.5-1.5b"):
        on = plan_run(TrainConfig(model=model, precision="fp8"), h100, checked)
        off = plan_run(TrainConfig(model=model, precision="fp8", fp8_lm_head=False), h100, checked)
        assert on.fp8_lm_head and on.layout.options() == off.layout.options()
    # until that check passes auto plans the head in BF16 (and counts it so), saying why
    unchecked = plan_run(TrainConfig(model="llama-1b", precision="fp8"), h100, Evidence())
    assert not unchecked.fp8_lm_head and "until the FP8 head's GPU check passes" in unchecked.reasons[
        "fp8_lm_head"]
    bf16_head = plan_run(TrainConfig(model="llama-1b", precision="fp8", fp8_lm_head=False), h100, Evidence())
    assert unchecked.layout.options() == bf16_head.layout.options()
    assert unchecked.layout.memory.peak == bf16_head.layout.memory.peak
    assert plan_run(TrainConfig(model="llama-1b", precision="fp8", fp8_lm_head=True), h100, Evidence()).fp8_lm_head


def test_where_the_fp8_head_would_cut_the_loss_into_more_chunks_auto_keeps_it_in_bf16():
    """Qwen2.5-1.5B's plain layout on an H200 (16 x 2048 tokens, 152K vocabulary): the head in BF16 is one chunk, in
    FP8 (a byte more per logit) two, measured slower; auto keeps the BF16 head there and says why. On the H100 (8 x
    2048) both are one chunk: auto runs it. An explicit True still runs it in two."""
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.evidence import Evidence
    from fp8lab.plan.fused_loss import chunk_tokens
    from fp8lab.plan.runplan import plan_run

    checked = Evidence(fp8_head=True)
    h200 = Machine(device="cuda", name="NVIDIA H200", memory_gib=139.8, te_usable=True, fp8=True)
    h100 = Machine(device="cuda", name="NVIDIA H100 80GB HBM3", memory_gib=79.1, te_usable=True, fp8=True)
    folder = "data/reference/configs/qwen2.5-1.5b"
    p = plan_run(TrainConfig(model=folder, precision="fp8"), h200, checked)
    tokens = p.layout.micro_batch_size * p.layout.seq_len
    assert chunk_tokens(151_936, tokens, "triton", True) < tokens == chunk_tokens(151_936, tokens, "triton", False)
    assert p.fused_loss and not p.fp8_lm_head and not p.layout.fp8_head and p.options()["fp8_lm_head"] is False
    assert "2 chunks instead of 1" in p.all_reasons()["fp8_lm_head"]
    off = plan_run(TrainConfig(model=folder, precision="fp8", fp8_lm_head=False), h200, checked)
    assert p.layout.options() == off.layout.options()
    assert plan_run(TrainConfig(model=folder, precision="fp8", fp8_lm_head=True), h200, checked).fp8_lm_head
    assert plan_run(TrainConfig(model=folder, precision="fp8"), h100, checked).fp8_lm_head
    llama = plan_run(TrainConfig(model="data/reference/configs/llama-3.2-1b", precision="fp8"), h200, checked)
    assert llama.fp8_lm_head  # (128K x 32,768 tokens: one chunk either way)


def test_explicit_fp8_head_in_the_chunks_is_refused_on_a_gpu_without_fp8_gemms():
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run

    a100 = Machine(device="cuda", name="NVIDIA A100-SXM4-80GB", memory_gib=79.1, te_usable=True, fp8=False)
    c = TrainConfig(model="llama-1b", precision="fp8", backend="emulated", fp8_lm_head=True, fused_loss="on")
    with pytest.raises(ValueError, match=r"--fp8-lm-head True: this GPU has no FP8 GEMMs.*allowed: --fp8-lm-head auto "
                                         r"\| False"):
        plan_run(c, a100)
    p = plan_run(TrainConfig(model="llama-1b", precision="fp8", backend="emulated", fused_loss="on"), a100)
    assert p.fp8_lm_head is False and "without FP8 GEMMs" in p.reasons["fp8_lm_head"]


def test_a_job_carries_a_bf16_head_the_layout_chose(monkeypatch):
    """The instance runs what the launch planned (as the layout and the fused loss): where the layout kept the head
    in BF16, the job says so; elsewhere auto decides the same on the instance (both jobs of a pair alike)."""
    from fp8lab import launch as L
    from fp8lab.plan import evidence as fevidence

    monkeypatch.setattr(fevidence, "load", lambda path=None: fevidence.Evidence(fp8_head=True))  # the check committed
    base = dict(role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, tokens=10**9)
    assert "fp8-lm-head" not in L.hyperparameters(L.JobSpec(model="llama-1b", precision="fp8", **base))
    for precision in ("bf16", "fp8"):
        spec = L.JobSpec(model="data/reference/configs/llama-3.1-8b", precision=precision,
                         instance_type="ml.p5.4xlarge", options={"memory": "fp8-exp-avg"}, **base)
        assert not spec.plan.layout.fp8_head and L.hyperparameters(spec)["fp8-lm-head"] is False


def test_a_head_the_fp8_gemms_cannot_take_is_refused_when_asked_for_by_name():
    """True with the fused loss on a 50,257-token vocabulary: refused (auto keeps such a head in BF16 and says so)."""
    assert fused_loss.fp8_head_decide("auto", precision="fp8", fused=True, fp8_gemms=True, vocab=50_257,
                                      hidden=768)[0] is False
    with pytest.raises(ValueError, match=r"--fp8-lm-head True: the LM head's vocabulary 50257 x hidden 768 is not a "
                                         r"multiple of 16 each.*allowed: --fp8-lm-head auto \| False"):
        fused_loss.fp8_head_decide(True, precision="fp8", fused=True, fp8_gemms=True, vocab=50_257, hidden=768)


def test_a_pair_asking_for_the_fp8_head_runs_its_bf16_baseline_without_it(tmp_path):
    """run_pair (notebook 03's pair) passes the options to both runs: the BF16 run has no FP8 head to run."""
    from fp8lab import trainpair

    pair = trainpair.run_pair("llama-tiny", 2, ["emulated"], output_dir=tmp_path, dry_run=True, fp8_lm_head=True,
                              fused_loss="on")
    assert len(pair.layouts) == 2
