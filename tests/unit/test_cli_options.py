"""The rule for options: `fp8lab train --help` in sections, each option in one, help that says what it does; the
study and test switches off the user's CLI behind --study. The listing below is the user's options: adding one to
TrainConfig fails this test until it is listed here, so a new option is a decision."""
from __future__ import annotations

import dataclasses

import pytest

from fp8lab.plan.config import TrainConfig
from fp8lab.plan.options import SECTIONS, STUDY, section_of, user_options
from fp8lab.train import entry

USER_OPTIONS = {
    "model": ["model", "model_overrides", "seed"],
    "data": ["steps", "tokens", "data", "task", "val_every", "val_batches"],
    "optimiser": ["lr", "min_lr", "warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip", "memory",
                  "max_bad_steps"],
    "layout": ["micro_batch_size", "grad_accum", "seq_len", "activation_checkpointing", "parallel", "param_dtype",
               "fsdp_keep_weights", "device", "gpu_memory_gib"],
    "fp8": ["precision", "backend", "recipe", "bf16_edge_blocks", "fp8_weights", "fp8_weight_cache", "fp8_calibrate", "fp8_attention",
            "fp8_all_gather", "fp8_stats_every", "fp8_stats_source", "fp8_lm_head"],
    "kernels": ["fuse", "compile", "cuda_graphs", "compute_dtype", "fuse_wgrad_accumulation", "fused_loss"],
    "lora": ["lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "export_merged"],
    "outputs": ["output_dir", "checkpoint_dir", "model_dir", "checkpoint_every", "keep_checkpoints", "resume",
                "resume_with_new_settings", "dry_run", "peak_tflops", "save_model", "plot", "progress",
                "print_metrics", "profile_steps", "tracker", "tracker_dir"],
}
STUDY_OPTIONS = ["inject_nan_at_steps"]  # study and test switches: fp8lab train --study
MAX_HELP = 160  # what an option does; why the plan chose a value is the run's first lines


def test_the_user_options_are_these_by_section():
    by_section: dict[str, list[str]] = {}
    for f in user_options(TrainConfig):
        by_section.setdefault(section_of(f), []).append(f.name)
    assert by_section == USER_OPTIONS, "a new option: give it a section (option(..., section=...)) and list it here"
    assert [f.name for f in dataclasses.fields(TrainConfig) if section_of(f) == STUDY] == STUDY_OPTIONS
    assert set(SECTIONS) == {*USER_OPTIONS, STUDY}


def test_help_is_in_sections_with_short_texts():
    text = entry.build_parser().format_help()
    headings = [SECTIONS[s] + ":" for s in USER_OPTIONS]
    at = [text.index("\n" + h + "\n") for h in headings]
    assert at == sorted(at), "the sections in SECTIONS' order"
    for section, names in USER_OPTIONS.items():  # each option under its own heading
        start = text.index("\n" + SECTIONS[section] + ":\n")
        end = min([i for i in at if i > start] + [len(text)])
        for name in names:
            flag = "--model-override" if name == "model_overrides" else "--" + name.replace("_", "-")
            assert flag + " " in text[start:end] or flag + "," in text[start:end], (section, flag)
    long = {f.name: len(f.metadata["help"]) for f in dataclasses.fields(TrainConfig) if len(f.metadata["help"]) > MAX_HELP}
    assert long == {}, f"help texts over {MAX_HELP} characters (say what it does; the plan's reasons say why): {long}"
    assert "--inject-nan-at-steps" not in text and "--study" in text


def test_study_switches_need_study_on_the_command_line():
    with pytest.raises(ValueError, match=r"unrecognized arguments: --inject-nan-at-steps 3 .*pass --study to use them"):
        entry.parse_args(["--precision", "fp8", "--inject-nan-at-steps", "3"])
    for words in (["--study"], ["--study", "True"], ["--study=true"]):
        c = entry.parse_args([*words, "--precision", "fp8", "--inject-nan-at-steps", "3"])
        assert c.inject_nan_at_steps == (3,)
    with pytest.raises(ValueError, match="unrecognized arguments: --inject-nan-at-steps"):
        entry.parse_args(["--study", "False", "--inject-nan-at-steps", "3"])
    assert "--inject-nan-at-steps" in entry.build_parser(study=True).format_help()
    assert TrainConfig(inject_nan_at_steps=(3,)).inject_nan_at_steps == (3,)  # the Python API takes them as they are
    c = entry.parse_args(["--precision", "fp8", "--fp8-lm-head", "False"])  # a user's option now: no --study
    assert c.fp8_lm_head is False and entry.parse_args([]).fp8_lm_head == "auto"


def test_a_job_takes_no_study_switch_and_passes_the_fp8_head_as_a_user_option():
    from fp8lab import launch as L
    from fp8lab.launch.spec import hyperparameters

    base = dict(model="llama-1b", precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, steps=10)
    for name in STUDY_OPTIONS:  # test hooks stay off the cloud
        with pytest.raises(ValueError, match=f"JobSpec.options: {name} set by JobSpec itself"):
            L.JobSpec(**base, options={name: (3,)})
    hp = hyperparameters(L.JobSpec(**base, options={"fp8_lm_head": False}))
    assert "study" not in hp and hp["fp8-lm-head"] is False
    words = [w for k, v in hp.items() for w in (f"--{k}", str(v))]
    assert entry.parse_args(words).fp8_lm_head is False  # as the job's trainer reads its hyperparameters
