"""The benchmark harnesses on CPU (tiny Llama, emulated FP8): what they record, not how fast it is."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fp8lab.core.paths import REPO_ROOT

BENCH = REPO_ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))


def _records(path: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out.setdefault(r["record"], []).append(r)
    return out


def test_throughput_leaves_profiled_steps_out_and_keeps_the_profile(tmp_path):
    import throughput

    rc = throughput.main(["--cpu-smoke", "--models", "llama-tiny", "--variants", "hf-bf16", "--steps", "5", "--warmup", "1",
                          "--common-args", "--seq-len 32 --micro-batch-size 2 --profile-steps 3,4",
                          "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--timeout", "300",
                          "--note", "alone on the machine"])
    assert rc == 0
    recs = _records(tmp_path / "out" / "llama-tiny-hf-bf16.jsonl")
    assert recs["summary"][0]["timed_steps"] == 2  # steps 2 and 5: step 1 is warm-up, 3-4 were profiled
    assert recs["run"][0]["note"] == "alone on the machine"
    prof = json.loads((tmp_path / "out" / "llama-tiny-hf-bf16.profile.json").read_text())
    assert prof["run"]["run_id"] == "llama-tiny-hf-bf16" and prof["profile"]["steps"] == 2
    assert prof["profile"]["categories_ms"]


def test_loss_parity_records_the_remedy_of_each_run(tmp_path):
    import loss_parity

    rc = loss_parity.main(["--model", "llama-tiny", "--model-args", "--model-override num_layers=4",
                           "--variants", "hf-bf16,emulated-fp8-delayed-edge1", "--steps", "4", "--val-every", "2",
                           "--val-batches", "1", "--common-args", "--seq-len 32 --micro-batch-size 2 --warmup-steps 2",
                           "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--timeout", "300",
                           "--tag", "t1"])
    assert rc == 0
    fp8 = _records(tmp_path / "out" / "llama-tiny-emulated-fp8-delayed-edge1-t1.jsonl")
    run = fp8["run"][0]
    assert (run["bf16_edge_blocks"], run["recipe"], run["warmup_lr_steps"]) == (1, "delayed", 2)
    assert [r["step"] for r in fp8["step"] if "val_loss" in r] == [2, 4]
    bf16 = _records(tmp_path / "out" / "llama-tiny-hf-bf16-t1.jsonl")
    assert bf16["run"][0]["bf16_edge_blocks"] == 0 and bf16["summary"][0]["val_loss"] > 0


def test_unknown_loss_variant_is_refused(tmp_path, capsys):
    import loss_parity

    with pytest.raises(SystemExit):
        loss_parity.main(["--model", "llama-tiny", "--variants", "te-fp9", "--out", str(tmp_path)])
    assert "te-fp9" in capsys.readouterr().err


def test_kernel_names_seen_on_the_h200_fall_into_the_right_categories():
    from fp8lab.train.profiling import categorize

    assert categorize("nvjet_sm90_qrtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT") == "fp8 gemm"
    assert categorize("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "gemm (bf16/fp32)"
    assert categorize("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26") == "attention"
    assert categorize("cast_transpose_optimized_kernel(__nv_bfloat16 const*, float const*, __nv_fp8_e5m2*)") \
        == "fp8 cast/transpose/amax"
    assert categorize("cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16") == "fp8 gemm"
    assert categorize("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "communication (nccl)"
    assert categorize("aten::_scaled_mm") == "fp8 gemm" and categorize("aten::mm") == "gemm (bf16/fp32)"
    assert categorize("void transformer_engine::dgated_act_kernel<16, true, float>") == "norm/activation"
    assert categorize("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>") \
        == "other (elementwise, copies, reductions)"


def test_throughput_names_a_model_folder_by_its_name_and_config_hash(tmp_path):
    """The families study (benchmarks/study_families.sh) passes model folders: the result file is named
    after the folder, records its config.json hash and model_type, and holds no machine path."""
    import hashlib

    import throughput
    from transformers import Qwen2Config

    folder = tmp_path / "models" / "my-qwen2"
    Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True).save_pretrained(str(folder))
    rc = throughput.main(["--cpu-smoke", "--models", str(folder), "--variants", "hf-bf16,emulated-fp8-delayed", "--steps", "3",
                          "--warmup", "1", "--common-args", "--seq-len 32 --micro-batch-size 2",
                          "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--timeout", "300"])
    assert rc == 0
    run = _records(tmp_path / "out" / "my-qwen2-emulated-fp8-delayed.jsonl")["run"][0]
    assert run["model"] == "my-qwen2" and run["model_type"] == "qwen2" and run["fuse"] is True
    assert run["model_config_sha256"] == hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    assert str(tmp_path) not in json.dumps(run) and "--model <models>/my-qwen2" in run["command"]
    # the docs table's speed row comes from these files (benchmarks/families_table.py)
    import families_table

    header, _, row = families_table.rows(tmp_path / "out")
    bf16 = _records(tmp_path / "out" / "my-qwen2-hf-bf16.jsonl")["summary"][0]["tokens_per_sec_per_gpu"]
    fp8 = _records(tmp_path / "out" / "my-qwen2-emulated-fp8-delayed.jsonl")["summary"][0]["tokens_per_sec_per_gpu"]
    assert row.startswith("| my-qwen2 | qwen2 | 2 x 32 x ") and f"| {fp8 / bf16:.3f}x |" in row
    assert run["model_config_sha256"][:16] in row and "FP8/BF16" in header


@pytest.mark.slow  # two trainer runs
def test_throughput_records_a_fine_tunes_task(tmp_path):
    """The fine-tune study (benchmarks/study_finetune.sh) runs --task sft and LoRA through this harness: each record
    says which (fp8lab.analysis.labels.task_label), so a fine-tune pairs and ranks only among its own task."""
    import throughput

    for tag, extra in (("sft", ""), ("lora", " --lora-rank 4 --fuse False")):
        rc = throughput.main(["--cpu-smoke", "--models", "llama-tiny", "--variants", "hf-bf16,emulated-fp8-delayed",
                              "--steps", "2",
                              "--warmup", "1", "--common-args", "--task sft --seq-len 256 --micro-batch-size 2" + extra,
                              "--data", str(REPO_ROOT / "data" / "sft" / "kjv-qa.jsonl"), "--tag", tag,
                              "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--timeout", "300"])
        assert rc == 0
    runs = {t: _records(tmp_path / "out" / f"llama-tiny-hf-bf16-{t}.jsonl")["run"][0] for t in ("sft", "lora")}
    assert runs["sft"]["task"] == "sft" and runs["lora"]["task"] == "sft-lora"
    fp8 = {t: _records(tmp_path / "out" / f"llama-tiny-emulated-fp8-delayed-{t}.jsonl")["run"][0] for t in ("sft", "lora")}
    assert fp8["sft"]["fuse"] is True and fp8["lora"]["fuse"] is False  # the common arguments' --fuse, as it ran
    # a frozen base's FLOPs: no weight-gradient GEMMs (fp8lab.model.models.model_flops_per_token)
    from fp8lab.model.models import MODEL_CONFIGS, model_flops_per_token
    from fp8lab.plan import lora as lora_plan

    tiny = MODEL_CONFIGS["llama-tiny"]
    adapters = lora_plan.adapter_params(tiny, 4, lora_plan.parse_targets(lora_plan.ALL, tiny.family))
    assert fp8["lora"]["flops_per_token"] == model_flops_per_token(tiny, 256, adapters) < fp8["sft"]["flops_per_token"]
    assert "<data>" in runs["sft"]["command"] and str(REPO_ROOT) not in json.dumps(runs["sft"])


def test_the_fine_tune_loss_table_is_made_from_the_committed_runs(tmp_path):
    """benchmarks/finetune_loss.py: the committed loss.json is what the committed result files give."""
    import shutil

    import finetune_loss

    folder = tmp_path / "ft"
    shutil.copytree(REPO_ROOT / "data" / "results" / "finetune-h100", folder)
    table = json.loads(json.dumps(finetune_loss.table(folder)))  # (seeds as JSON keys)
    assert table == json.loads((folder / "loss.json").read_text())
    gaps = {k: round(v["gap_pct"], 2) for k, v in table["variants"].items()}
    assert gaps == {"bf16 ft": 0.0, "fp8 ft": 1.0, "fp8 ft-current": -1.4, "fp8 ft-uncal": 2.33}
    assert round(table["band_pct"], 2) == 0.96


def _run_file(folder, model, variant, seed=None, speed=None, val_loss=None, head=None):
    """A result file as the harnesses write it: its run record and its summary (the keys the checks read)."""
    run = {"record": "run", "run_id": f"{model}-{variant}", "model": model, "variant": variant, "seed": seed,
           "fp8_lm_head": head}
    summary = {"record": "summary", "tokens_per_sec_per_gpu": speed, "val_loss": val_loss}
    (folder / f"{model}-{variant}.jsonl").write_text(json.dumps(run) + "\n" + json.dumps(summary) + "\n")


def test_the_fp8_head_check_passes_only_on_passed_tests_a_gain_everywhere_and_the_loss_in_band(tmp_path):
    """benchmarks/fp8_head_check.py, what --fp8-lm-head auto waits for (fp8lab.plan.evidence): each part can fail it."""
    import fp8_head_check
    import memory_modes_loss

    folder = tmp_path / "fp8-head-chunks-h100"
    folder.mkdir()
    speeds = (("llama-1b", 105.0, 102.0, 80.0), ("llama-3.2-1b", 99.0, 90.0, 72.0), ("qwen2.5-1.5b", 75.0, 71.0, 57.0))
    for model, fp8, bf16_head, bf16 in speeds:
        _run_file(folder, model, "default-fp8-fp8head-h100", speed=fp8, head=True)
        _run_file(folder, model, "default-fp8-bf16head-h100", speed=bf16_head, head=False)
        _run_file(folder, model, "default-bf16-h100", speed=bf16, head=False)
    for head, losses in (("bf16", (3.40, 3.38)), ("chunks", (3.395, 3.39))):
        for seed, v in zip((1234, 4321), losses):
            _run_file(folder, "llama-1b", f"te-fp8-delayed-head{head}-5m-s{seed}", seed=seed, val_loss=v)
    (folder / "loss.json").write_text(json.dumps(memory_modes_loss.check(folder, "te-fp8-delayed-head", "bf16")))
    ok = "=== 4 passed, 1 warning in 61.20s ==="
    result = fp8_head_check.check(folder, "collected 4 items\n....\n" + ok)
    assert result["passed"] and result["tests"]["summary"] == "4 passed, 1 warning in 61.20s"
    assert round(result["speed"]["models"]["llama-3.2-1b"]["gain_pct"], 2) == 10.0
    assert result["speed"]["models"]["llama-3.2-1b"]["fp8_over_bf16"] == pytest.approx(99 / 72)
    assert result["loss"]["holds"] and result["loss"]["gap_pct"] == pytest.approx(100 * (3.3925 / 3.39 - 1))
    assert not fp8_head_check.check(folder, "=== 1 failed, 3 passed in 60s ===")["passed"]
    assert not fp8_head_check.check(folder, "=== 1 passed, 3 skipped in 6s ===")["passed"]  # no TE there: no check
    (folder / "qwen2.5-1.5b-default-fp8-fp8head-h100.jsonl").unlink()  # a model of the study not measured: no
    assert fp8_head_check.check(folder, ok)["speed"]["missing"] == ["qwen2.5-1.5b"]
    _run_file(folder, "qwen2.5-1.5b", "default-fp8-fp8head-h100", speed=70.0, head=True)  # slower than BF16's: no
    slower = fp8_head_check.check(folder, ok)
    assert not slower["passed"] and not slower["speed"]["faster_everywhere"] and slower["tests"]["passed"]
    _run_file(folder, "qwen2.5-1.5b", "default-fp8-fp8head-h100", speed=75.0, head=False)  # a record that lies
    with pytest.raises(SystemExit, match="fp8_lm_head False, not True as its variant"):
        fp8_head_check.check(folder, ok)
    _run_file(folder, "qwen2.5-1.5b", "default-fp8-fp8head-h100", speed=75.0, head=True)
    (folder / "loss.json").unlink()  # no loss check committed: no pass
    assert not fp8_head_check.check(folder, ok)["loss"]["committed"]
    # the evidence the plan reads follows check.json
    from fp8lab.plan import evidence

    (folder / "check.json").write_text(json.dumps({"passed": True}))
    assert evidence.Evidence.from_dict(evidence.from_results(tmp_path)).fp8_head is True
    assert evidence.Evidence.from_dict(evidence.from_results(tmp_path / "none")).fp8_head is False
