"""Bring your own model (issue 18) on CPU: folders written by ``save_pretrained`` train from
``--model DIR`` (emulated FP8), export back to their own format, reload with ``from_pretrained`` and
give the trained converted model's logits; unsupported variants are refused with their message."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from fp8lab.data import tokens as fdata
from fp8lab.model import user as user_model
from fp8lab.model.models import count_parameters, get_config, model_flops_per_token
from fp8lab.train.entry import TrainConfig, train

RUN = dict(seq_len=32, micro_batch_size=2, grad_accum=1, compute_dtype="fp32", plot=False, progress="off",
           print_metrics=False, val_every=0, steps=3, lr=3e-3, warmup_steps=1, precision="fp8", backend="emulated")


def llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False)
    return LlamaConfig(**{**base, **kw})


def gptneo_config(**kw):
    from transformers import GPTNeoConfig

    base = dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                max_position_embeddings=256, window_size=16, embed_dropout=0.0, resid_dropout=0.0,
                attention_dropout=0.0, bos_token_id=511, eos_token_id=511)
    return GPTNeoConfig(**{**base, **kw})


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # < RUN's seq_len


def qwen2_config(**kw):
    from transformers import Qwen2Config

    base = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, use_sliding_window=True,
                sliding_window=16, max_window_layers=1)
    return Qwen2Config(**{**base, **kw})


def mistral_config(**kw):
    from transformers import MistralConfig

    base = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, sliding_window=16, tie_word_embeddings=False)
    return MistralConfig(**{**base, **kw})


VARIANTS = {
    "llama2-mha-untied": lambda: llama_config(),
    # Llama 3 style: GQA 4:2, rope_theta 5e5, tied embeddings, head_dim 32 != 64 / 4
    "llama3-gqa-tied-headdim": lambda: llama_config(num_key_value_heads=2, head_dim=32, rope_theta=500000.0,
                                                     tie_word_embeddings=True),
    "gptneo": lambda: gptneo_config(),
    # issue 27: Llama 3.1+ RoPE scaling, Qwen2 (Q/K/V biases, tied, sliding layers), Mistral with a window
    "llama31-rope-scaled": lambda: llama_config(num_key_value_heads=2, rope_parameters=LLAMA3_ROPE),
    "qwen2-bias-windows": lambda: qwen2_config(),
    "mistral-window": lambda: mistral_config(),
}


def save_folder(path, cfg, weights=True, tokenizer=False):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    if weights:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    else:
        cfg.save_pretrained(str(path))
    if tokenizer:
        tok = PreTrainedTokenizerFast(tokenizer_file=str(fdata.shipped_tokenizer_path(512)), eos_token=fdata.EOS_TOKEN)
        tok.save_pretrained(str(path))
    return path


def assert_same_logits(trained, exported_dir, vocab):
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(str(exported_dir), dtype=torch.float32).eval()
    x = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    trained.eval()
    with torch.no_grad():
        want = trained(x).logits.float()  # outside FP8 autocast: the trained weights in fp32
        got = reloaded(x).logits.float()
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    return reloaded


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("fuse", [True, False])
def test_supported_variant_round_trips(variant, fuse, prepared, tmp_path, capture_trained):
    cfg = VARIANTS[variant]()
    src = save_folder(tmp_path / "mine", cfg, tokenizer=True)
    out = tmp_path / "run"
    s = train(TrainConfig(**RUN, model=str(src), fuse=fuse, data=str(prepared), output_dir=str(out)))
    assert s["status"] == "completed" and s["steps"] == 3
    rec = json.loads((out / "config.json").read_text())
    ms = rec["model_source"]
    assert ms["source"] == "folder" and ms["name"] == "mine" and ms["weights"].startswith("loaded")
    assert len(ms["config_sha256"]) == 64 and ms["params_built"] == ms["params_from_config"] == rec["params"]
    assert not rec["model"].startswith("/")  # shareable: no absolute machine path
    assert rec["conversion"]["fused"] is fuse
    reloaded = assert_same_logits(capture_trained["inner"], out / "model", cfg.vocab_size)
    assert type(reloaded).__name__ == type(cfg).__name__.replace("Config", "ForCausalLM")
    assert reloaded.config.tie_word_embeddings == cfg.tie_word_embeddings
    if cfg.model_type in ("qwen2", "mistral"):
        assert reloaded.config.sliding_window == cfg.sliding_window
    if cfg.model_type == "llama":
        assert reloaded.config.head_dim == getattr(cfg, "head_dim") and reloaded.config.num_key_value_heads == cfg.num_key_value_heads
    # the user's tokenizer went back along, byte for byte
    assert (out / "model" / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    # trained: the exported weights moved away from the folder's
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    moved = [k for k, v in reloaded.state_dict().items() if not torch.equal(v, start.state_dict()[k])]
    assert moved


def test_folder_without_weights_is_random_init_from_its_config(prepared, tmp_path):
    src = save_folder(tmp_path / "cfg-only", VARIANTS["llama3-gqa-tied-headdim"](), weights=False)
    out = tmp_path / "run"
    s = train(TrainConfig(**RUN, model=str(src), data=str(prepared), output_dir=str(out)))
    rec = json.loads((out / "config.json").read_text())
    assert s["status"] == "completed" and rec["model_source"]["weights"] == "random init from config.json"
    assert (out / "model" / "tokenizer.json").exists()  # no tokenizer in the folder: the data's goes along
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(out / "model")).config.head_dim == 32


def test_user_config_feeds_flops_layout_and_counts(tmp_path):
    from transformers import AutoModelForCausalLM

    for name, make in VARIANTS.items():
        cfg = make()
        src = save_folder(tmp_path / name, cfg, weights=False)
        mc = get_config(str(src))
        built = AutoModelForCausalLM.from_config(cfg)
        assert count_parameters(mc).total == sum(p.numel() for p in built.parameters()), name
        assert model_flops_per_token(str(src), 32) == model_flops_per_token(mc, 32) > 0
    # the layout resolver reads the same ModelConfig fields
    c = TrainConfig(**{**RUN, "micro_batch_size": "auto"}, model=str(tmp_path / "gptneo"))
    from fp8lab.fp8.backends import detect_machine
    from fp8lab.plan.runplan import plan_run

    p = plan_run(c, detect_machine(torch.device("cpu"), 1, 0))
    assert p.micro_batch_size >= 1 and p.layout.memory.peak > 0


def test_fingerprint_follows_the_config_not_the_path(tmp_path):
    from fp8lab.train import resume
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run

    def fingerprint(model):
        return resume.fingerprint(plan_run(TrainConfig(**RUN, model=model), Machine("cpu", "cpu", 24.0)))

    a = save_folder(tmp_path / "a", VARIANTS["gptneo"](), weights=False)
    b = save_folder(tmp_path / "elsewhere" / "b", VARIANTS["gptneo"](), weights=False)
    fa = fingerprint(str(a))
    fb = fingerprint(str(b))
    assert fa == fb and fa["model"].startswith("config.json sha256 ")
    assert fingerprint("llama-tiny")["model"] == "llama-tiny"


def test_llama31_rope_scaling_trains_fused(prepared, tmp_path, capture_trained):
    """Issue 27: Llama 3.1+ RoPE scaling was refused by the fused conversion; it now trains fused with
    transformers' own frequencies, and the export keeps the scaling."""
    cfg = llama_config(num_key_value_heads=2, rope_parameters=LLAMA3_ROPE)
    src = save_folder(tmp_path / "l31", cfg)
    out = tmp_path / "run"
    s = train(TrainConfig(**RUN, model=str(src), data=str(prepared), output_dir=str(out)))
    assert s["status"] == "completed"
    assert json.loads((out / "config.json").read_text())["conversion"]["fused"] is True
    reloaded = assert_same_logits(capture_trained["inner"], out / "model", cfg.vocab_size)
    assert reloaded.config.rope_parameters["rope_type"] == "llama3"


@pytest.mark.parametrize("kw, feature", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_fused_refuses_what_it_cannot_represent(kw, feature, tmp_path):
    src = save_folder(tmp_path / "m", llama_config(**kw), weights=False)
    with pytest.raises(ValueError, match=re.escape(feature) + ".*use fuse=False"):
        TrainConfig(**RUN, model=str(src))
    TrainConfig(**RUN, model=str(src), fuse=False)  # the unfused path keeps them: accepted
    # and convert_model itself refuses before building the fused model
    from transformers import AutoModelForCausalLM

    from fp8lab.fp8.convert import convert_model

    with pytest.raises(ValueError, match=re.escape(feature)):
        convert_model(AutoModelForCausalLM.from_config(llama_config(**kw)), backend="emulated", fuse=True)


@pytest.mark.parametrize("make", ["gemma", "mixtral"])
def test_other_architectures_refused_with_the_supported_list(make, tmp_path):
    from transformers import GemmaConfig, MixtralConfig

    cfg = (GemmaConfig if make == "gemma" else MixtralConfig)(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2)
    src = tmp_path / make
    cfg.save_pretrained(str(src))
    with pytest.raises(ValueError, match=f"model_type='{make}'.*supported: llama .*gpt_neo"):
        TrainConfig(**RUN, model=str(src))


def test_bad_folder_inputs(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        TrainConfig(**RUN, model=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="--model='no-such-model' is invalid; allowed: llama-tiny.*model folder.*hf:<repo id>"):
        TrainConfig(**RUN, model="no-such-model")
    src = save_folder(tmp_path / "m", llama_config(), weights=False)
    with pytest.raises(ValueError, match="--model-override applies to the named models only.*config.json"):
        TrainConfig(**RUN, model=str(src), model_overrides={"num_layers": 1})


def test_vocab_smaller_than_data_is_refused_with_the_fix(prepared, tmp_path):
    src = save_folder(tmp_path / "m", llama_config(vocab_size=300), weights=False)
    with pytest.raises(ValueError, match="vocab_size 300; use a model whose config.json has vocab_size >= 512"):
        train(TrainConfig(**RUN, model=str(src), data=str(prepared), output_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_hf_without_network_fails_fast_in_one_line(tmp_path):
    t = time.perf_counter()
    with pytest.raises(ValueError, match="needs network access to the Hugging Face Hub.*HF_HUB_OFFLINE") as e:
        TrainConfig(**RUN, model="hf:example-org/not-cached-model")
    assert time.perf_counter() - t < 10 and "\n" not in str(e.value)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "fp8lab.train", "--model", "hf:example-org/not-cached-model",
                        "--output-dir", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "Hugging Face Hub" in ln]
    assert len(lines) == 1 and "hf:example-org/not-cached-model" in lines[0]
    assert not (tmp_path / "run").exists()


def test_hf_without_route_fails_fast_without_the_offline_flag(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")  # a name that never resolves
    t = time.perf_counter()
    with pytest.raises(ValueError, match="needs network access to the Hugging Face Hub, but cannot reach hub.invalid"):
        user_model.model_config("hf:example-org/not-cached-model")
    assert time.perf_counter() - t < 2 * user_model.CONNECT_TIMEOUT_S + 5


@pytest.mark.parametrize("variant, name", [("llama3-gqa-tied-headdim", "my-llama3"), ("qwen2-bias-windows", "my-qwen2")])
def test_notebook_02_converts_a_model_folder(variant, name, tmp_path):
    from fp8lab.notebooks import read_glued, run

    src = save_folder(tmp_path / name, VARIANTS[variant]())
    res = run(["02"], {"model_folder": str(src), "backend": "emulated", "seq_len": 32}, output_dir=tmp_path / "nb",
              progress=False)
    vals = read_glued(res[0].output)
    assert vals["model"] == name and vals["num_layers"] == 2 and vals["round_trip_identical"] is True
    assert vals["fp8_off_logits_rel_diff"] < 1e-5 and vals["fp8_on_logits_rel_diff"] > 1e-4
    assert str(src) not in res[0].output.read_text()  # the machine path is not written into the notebook


@pytest.mark.parametrize("variant, name", [("gptneo", "neo"), ("mistral-window", "mistral")])
def test_run_pair_trains_a_model_folder(variant, name, prepared, tmp_path):
    """What notebook 03 runs for ``-p model <folder>``."""
    from fp8lab.trainpair import run_pair

    src = save_folder(tmp_path / name, VARIANTS[variant]())
    pair = run_pair(str(src), steps=2, backends=["emulated"], output_dir=tmp_path / "pair", data=str(prepared),
                    seq_len=32, micro_batch_size=2)
    baseline = "fp32" if pair.device == "cpu" else "bf16"  # on a CPU the baseline computes in fp32: named so
    assert set(pair.summaries) == {baseline, "fp8 emulated"}
    for s in pair.summaries.values():  # summary.json names the folder without the machine path
        assert s["status"] == "completed" and s["model"] == f"<abs>/{name}"


def test_jobspec_takes_a_model_folder_and_checks_it_before_launch(tmp_path):
    pytest.importorskip("sagemaker.train")
    from fp8lab import launch as L

    base = dict(precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, steps=10)
    cfg = VARIANTS["llama3-gqa-tied-headdim"]()
    src = save_folder(tmp_path / "my-llama3", cfg, weights=False)
    spec = L.JobSpec(model=str(src), **base)
    assert spec.is_folder_model and spec.model_label == "my-llama3"
    assert L.hyperparameters(spec)["model"] == "/opt/ml/input/data/model"
    assert [c.channel_name for c in L.input_data(spec)] == ["model"]
    assert spec.model_cfg == get_config(str(src)) and spec.plan.micro_batch_size >= 1  # layout planned for H100
    q = L.JobSpec(model=str(save_folder(tmp_path / "my-qwen2", qwen2_config(), weights=False)), **base)
    assert q.model_cfg.qkv_bias and q.model_cfg.layer_windows == (None, 16) and q.model_label == "my-qwen2"
    assert "my-llama3" in L.job_name(spec) and str(tmp_path) not in json.dumps(spec.identity())
    # the same config elsewhere is the same job (identity = config hash, not path)
    other = save_folder(tmp_path / "copy" / "my-llama3", cfg, weights=False)
    assert L.job_name(L.JobSpec(model=str(other), **base)) == L.job_name(spec)
    plan = L.plan_sweep([str(src)], ["bf16", "fp8"], [1], role=base["role"], bucket=base["bucket"], steps=10)
    assert set(plan.table()["model"].dropna()) == {"my-llama3"} and len(plan.jobs) == 2
    # s3://: the config travels as model_config and is validated like a folder's
    s3 = L.JobSpec(model="s3://my-bucket/models/my-llama3", model_config=cfg.to_dict(), **base)
    assert s3.model_cfg == spec.model_cfg and L.input_data(s3)[0].data_source == "s3://my-bucket/models/my-llama3"
    for kw, match in [
        ({"model": "s3://my-bucket/models/x"}, r"JobSpec.model_config=None is invalid; allowed: the model's config.json"),
        ({"model": "s3://my-bucket/m", "model_config": {**cfg.to_dict(), "model_type": "gemma"}},
         r"model_type='gemma'.*supported: llama"),
        ({"model": str(src), "model_config": cfg.to_dict()}, r"model_config.*None unless model is an s3:// URI"),
        ({"model": "hf:meta-llama/Llama-3.1-8B"}, r"JobSpec.model='hf:meta-llama/Llama-3.1-8B' is invalid.*download hf: models first"),
        ({"model": str(tmp_path / "missing")}, r"JobSpec.model=.*is invalid; allowed: llama-tiny.*local model folder"),
        ({"model": str(save_folder(tmp_path / "gelu", llama_config(hidden_act="gelu"), weights=False))},
         r"trainer would refuse this job.*hidden_act='gelu'.*fuse=False"),
    ]:
        with pytest.raises(ValueError, match=match):
            L.JobSpec(**{**base, **kw})


def test_job_names_tell_apart_folders_with_the_same_config_and_other_weights(tmp_path):
    """Issue 30: the launcher skipped a different model, since job names hashed config.json only."""
    pytest.importorskip("sagemaker.train")
    import shutil

    from safetensors.torch import load_file, save_file

    from fp8lab import launch as L

    base = dict(precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, steps=10)
    a = save_folder(tmp_path / "a" / "my-llama", llama_config())
    b = tmp_path / "b" / "my-llama"
    shutil.copytree(a, b)
    same = L.job_name(L.JobSpec(model=str(b), **base))
    assert L.job_name(L.JobSpec(model=str(a), **base)) == same  # a copy elsewhere: the same job
    sd = load_file(str(b / "model.safetensors"))
    sd["model.norm.weight"] = sd["model.norm.weight"] + 1  # a fine-tune: same names, shapes and sizes
    save_file(sd, str(b / "model.safetensors"), metadata={"format": "pt"})
    assert (b / "model.safetensors").stat().st_size == (a / "model.safetensors").stat().st_size
    other = L.JobSpec(model=str(b), **base)
    assert L.job_name(other) != same and other.identity()["weights"] == user_model.weights_digest(str(b))
    # without weights the identity is the config's alone, as before
    c = save_folder(tmp_path / "c" / "my-llama", llama_config(), weights=False)
    assert "weights" not in L.JobSpec(model=str(c), **base).identity()


def test_a_named_shape_stays_named_when_a_folder_of_that_name_exists(tmp_path, monkeypatch):
    """--model llama-tiny in a working directory that happens to hold a folder called llama-tiny."""
    from fp8lab.model import user as user_model
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run
    from fp8lab.train.entry import TrainConfig

    (tmp_path / "llama-tiny").mkdir()
    monkeypatch.chdir(tmp_path)
    assert not user_model.is_user_model("llama-tiny") and user_model.is_user_model(str(tmp_path / "llama-tiny"))
    c = TrainConfig(model="llama-tiny", precision="fp8", backend="emulated")
    p = plan_run(c, Machine("cpu", "cpu", 24.0))
    assert p.config.model == "llama-tiny" and p.total_steps == 100 and user_model.describe("llama-tiny")["source"] == "named"


def test_an_hf_model_is_looked_up_once_per_process(tmp_path, monkeypatch):
    """describe, the checks and the build each ask for the folder of an hf: model; the Hub client is
    asked once (a cached snapshot here: the stand-in returns a folder as snapshot_download does)."""
    import huggingface_hub

    folder = save_folder(tmp_path / "snapshot", llama_config(), weights=False)
    calls = []

    def snapshot_download(repo, allow_patterns=None, local_files_only=False):
        calls.append((repo, local_files_only))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(user_model, "_HUB_FOLDERS", {})
    spec = "hf:example-org/tiny-llama"
    assert user_model.folder_of(spec) == folder
    user_model.describe(spec)
    user_model.model_config(spec)
    assert user_model.folder_of(spec) == folder
    assert calls == [("example-org/tiny-llama", True)]
