"""Shared test set-up: the ``gpu`` marker skips, with a reason, where no CUDA GPU exists; the
``browser`` marker skips where no Chromium (and its driver) or no Selenium is installed; the ``slow``
marker (the second tier, which .ci/run runs after the README's ``-m "not slow"``) is set here for the
tests of ``SLOW``; the ``prepared`` fixture is the shipped corpus tokenized once per test module."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

# Helpers shared across the test folders import by module name: tests/helpers/fake_runs.py (fake trainer
# runs and result files) and tests/sagemaker/moto_env.py (moto's endpoint and the request checker). The
# folders are no packages, so ``sagemaker`` never shadows the real SDK
for _d in ("helpers", "sagemaker"):
    sys.path.insert(0, str(Path(__file__).resolve().parent / _d))

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The tests' models are tiny: torch's CPU thread pool costs more than it gains on them (one thread took about half
# the CPU time and half the wall time of two on the 2-core machine); trainer subprocesses and notebook kernels
# inherit it. Set before torch is first imported, which reads it then.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _gpu_reason() -> str | None:
    try:
        import torch
    except Exception as exc:  # pragma: no cover - torch is a hard dependency
        return f"torch does not import: {exc}"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (none on this machine; run on the H200 through the device tool)"
    return None


def chromium_paths() -> tuple[str | None, str | None]:
    """(browser, driver): $FP8LAB_CHROMIUM / $FP8LAB_CHROMEDRIVER, else Debian's on the PATH."""
    browser = shutil.which(os.environ.get("FP8LAB_CHROMIUM") or "chromium") or shutil.which("chromium-browser")
    driver = shutil.which(os.environ.get("FP8LAB_CHROMEDRIVER") or "chromedriver")
    return browser, driver


def _browser_reason() -> str | None:
    for module, what in (("selenium", "the selenium package"), ("jupyterlab", "JupyterLab")):
        if importlib.util.find_spec(module) is None:
            return f"needs {what} (bash scripts/setup.sh installs it)"
    browser, driver = chromium_paths()
    if not browser or not driver:
        missing = " and ".join(n for n, p in (("chromium", browser), ("chromedriver", driver)) if not p)
        return (f"needs Chromium and its driver ({missing} not found; on Debian, as root: apt-get install "
                "chromium chromium-driver, which .ci/run does; or set FP8LAB_CHROMIUM / FP8LAB_CHROMEDRIVER)")
    return None


# The slow tier, declared once: the tests that took longer than SLOW_AFTER_S seconds each (set-up, call and
# teardown) in one `pytest --durations=0` run of the whole suite on the 2-core CPU machine, while other jobs
# shared it (load average 5-14 on 2 cores: every figure inflated), plus every test of a file given as ALL.
# By test file and test name (a parametrized test by name, all its cases, when any case took longer), so
# moving a file to another folder keeps its tier. The run was cut off before it reached every file: the
# files and tests not measured then are in the slow tier whole, as the comments say, until a run measures
# them. A test marked `slow` in its own file stays slow as well. tests/unit/test_tiers.py checks the names.
SLOW_AFTER_S = 5
ALL = "*"
SLOW: dict[str, str | set[str]] = {
    "test_analysis.py": {
        "test_committed_result_files_load_and_carry_provenance",
        "test_cost_table_known_numbers",
        "test_the_committed_parity_study_is_the_llama_1b_loss_gap_with_its_noise_band",
        "test_the_headline_compares_best_bf16_and_best_fp8_at_one_sequence_length",
    },
    "test_bad_inputs.py": {
        "test_a_torn_metrics_line_is_reported_on_resume",
        "test_an_absolute_model_path_stays_out_of_the_step_records_and_the_report",
        "test_checkpoint_folder_turning_read_only_mid_run_stops_cleanly",
        "test_executed_notebook_records_no_absolute_paths",
        "test_launch_cli_and_api_accept_and_refuse_the_same_values",
        "test_launch_plan_refuses",
        "test_no_loadable_checkpoint_is_a_clear_error_not_a_fresh_start",
        "test_notebook_parameters_refused_before_anything_runs",
        "test_report_flags_nonfinite_losses_and_never_swaps_the_metric",
        "test_resume_with_new_settings_follows_the_new_schedule",
        "test_resume_with_other_settings_is_refused_with_every_difference",
        "test_shared_files_hold_no_absolute_paths",
        "test_train_refuses_a_bad_model_folder_before_anything_runs",
        "test_train_refuses_before_writing_anything",
        "test_truncated_distcp_of_the_newest_checkpoint_falls_back_to_the_older_one",
    },
    "test_benchmarks.py": {
        "test_loss_parity_records_the_remedy_of_each_run",
        "test_throughput_leaves_profiled_steps_out_and_keeps_the_profile",
        "test_throughput_names_a_model_folder_by_its_name_and_config_hash",
    },
    "test_browser.py": ALL,  # drives Chromium (never measured here: no Chromium)
    "test_data.py": {
        "test_prepare_writes_manifest_and_memmap_shards",
        "test_tokenizer_retraining_reproduces_shipped_file",
    },
    "test_docs.py": {
        "test_committed_headline_png_is_the_generated_figure_and_readable",
        "test_committed_results_block_and_results_doc_are_current",
        "test_readme_leads_with_the_answer",
        # not measured before the cut-off:
        "test_docs_command_writes_into_a_checkout",
        "test_render_docs_needs_the_markers",
    },
    "test_env.py": {
        "test_cli_json_and_text",
        "test_env_check_on_this_cpu_machine_passes",
    },
    "test_evidence.py": {
        "test_a_fresh_wheel_plans_as_the_checkout",  # builds and installs the wheel in a fresh venv
    },
    "test_estimates.py": {
        "test_default_plan_rests_on_the_fastest_committed_one_gpu_run_of_each_model_and_precision",
        "test_node_efficiency_is_the_measured_two_gpu_median_of_the_same_layout",
        "test_plan_curve_matches_the_plan_and_draws_readably",
    },
    "test_families.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_fp8_all_gather_processes.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_fp8stats.py": {
        "test_a_run_writes_the_records_and_the_step_readers_skip_them",
        "test_an_injected_weight_outlier_is_seen_and_warned_about",
    },
    "test_fp8stats_overhead.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_graphs.py": {
        "test_trainer_records_why_graphs_are_off",
        "test_trainer_refuses_cuda_graphs_on_a_cpu_before_anything_is_written",
    },
    "test_import_warnings.py": {
        "test_only_the_known_harmless_import_warnings_are_filtered",
    },
    "test_launch.py": {
        "test_a_bare_spec_given_to_build_trainer_gets_the_time_limit_a_plan_gives_it",
        "test_dry_run_never_prints_an_account_id_in_the_bucket_name",
        "test_plan_costs_add_up_and_follow_the_price",
        "test_plan_names_are_deterministic_unique_and_valid",
        "test_warm_pool_request_and_cli_dry_run",
        "test_a_one_gpu_p5_is_planned_priced_and_requested_like_the_others",  # 28 s measured: a plan, a dry run
    },
    "test_launch_image.py": {  # measured on the 2-core machine: dry runs of two or three requests each
        "test_a_dry_run_p5_te_job_names_a_current_image_and_builds_nothing",
        "test_an_image_with_too_old_a_te_builds_the_pinned_one_and_its_start_up_says_so",
        "test_any_image_by_its_uri",
    },
    "test_launch_job.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_launch_moto.py": {
        "test_real_train_path_sends_a_valid_complete_request",
        "test_relaunch_skips_existing_jobs_and_restarts_failed_ones",
        # not measured before the cut-off:
        "test_real_launch_refuses_placeholders",
        "test_wait_backs_off_on_throttling",
        "test_wait_and_collect_for_an_unknown_job_are_one_line",
        "test_failed_job_reason_surfaces",
        "test_collect_reads_output_tar_and_falls_back_to_cloudwatch_logs",
        "test_dry_run_opens_no_connection",
        "test_torchrun_command_on_each_node_of_a_two_node_job",
        "test_a_model_folder_reaches_the_job_as_the_model_channel",
        "test_a_fine_tune_job_takes_the_model_folder_and_the_instruction_data_as_channels",
    },
    "test_launch_notebook.py": {
        "test_notebook_04_custom_sweep",
        "test_notebook_04_defaults_plan_the_blog_sweep_without_aws",
        "test_notebook_04_real_launch_against_moto_and_idempotent_rerun",
    },
    "test_layering.py": {
        "test_a_fresh_import_loads_no_module_above_it",
        "test_analysis_report_plots_are_layered",
        "test_no_import_cycle_at_module_level",
        "test_no_import_cycle_counting_imports_inside_functions",
        "test_no_private_names_across_modules",
        "test_no_unused_imports",
    },
    "test_long_context.py": {
        "test_a_run_past_max_seq_len_says_so_and_records_its_decisions",
    },
    "test_notebook_01.py": {
        "test_default_run_values",
        "test_other_run_differs_as_expected",
        # not measured before the cut-off:
        "test_explorer_scale_follows_format_and_margin",
        "test_explorer_widget_shows_the_numbers_of_each_setting",
        "test_capture_tensors_on_a_real_llama",
        "test_viz_bad_arguments",
        "test_bad_parameter_is_rejected_before_running",
        "test_committed_notebook_is_thin_and_clean",
    },
    "test_notebook_02.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_notebook_03.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_notebook_05.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_notebook_06.py": ALL,  # the notebook's four CPU fine-tunes: 30-60 s on the 2-core machine
    "test_notebooks_runner.py": {
        "test_cli_rejects_unknown_parameter",
        "test_failure_names_notebook_cell_and_error",
        "test_keep_going_reports_each_notebook",
        "test_run_injects_parameters_and_reads_glued_values",
        "test_the_kernel_talks_over_private_local_sockets_without_a_warning",
    },
    "test_nothing_lost.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_shared_folders.py": ALL,  # tiny training runs in real processes: seconds to a minute each
    "test_one_answer.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_one_story.py": ALL,  # reads every committed run (about a minute on the 2-core machine)
    "test_plan.py": {
        "test_planning_a_job_imports_no_torch",
    },
    "test_plots.py": {
        "test_every_figure_renders_on_empty_tables_and_saves_png_and_svg",
        "test_profiles_of_real_runs_become_stacked_bars_with_the_wall_time",
        "test_the_parity_figure_draws_each_run_and_the_band_from_the_committed_study",
    },
    "test_prices.py": {"test_the_price_override_changes_every_view_s_costs_by_its_ratio"},  # 8.5 s measured
    "test_replay.py": ALL,  # measured: 30 s (two CPU runs)
    "test_report.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_scaling.py": {
        "test_the_answer_at_scale_rests_on_its_runs",
        "test_the_model_reproduces_the_committed_two_gpu_runs_within_5_percent",
    },
    "test_setup_gpu.py": {
        "test_h100_without_toolkit_builds_the_pinned_te_with_pips_nvcc",
    },
    "test_study_loss_parity.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_trackers.py": ALL,  # measured: 35-70 s each (a CPU run, MLflow's import and store)
    "test_train.py": {  # measured alone (pytest --durations=0): the rest, the trainer's guards, stay in the fast tier
        "test_cpu_run_writes_metrics_config_checkpoints_and_hf_model",  # 27 s
        "test_activation_checkpointing_recomputes_the_same_math",  # 4-6 s a case
        "test_fp8_delayed_scaling_state_survives_resume",
        "test_resume_rejects_a_checkpoint_of_another_run",
        "test_loss_remedies_reach_the_model_and_the_profile_is_written",
        "test_sagemaker_entry_point_layout",
        "test_fp8_emulated_fused_run_and_hf_export",
        "test_an_emulated_bf16_run_resumes_from_its_own_checkpoint",
        "test_text_channel_is_tokenized_on_the_fly",
        "test_fp8_weight_cache_is_only_active_where_the_backend_has_one",
    },
    "test_train_master_weights.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_train_processes.py": ALL,  # not measured before the cut-off: all of it, until measured
    "test_user_model.py": ALL,  # not measured before the cut-off: all of it, until measured
}


def _slow(item) -> bool:
    names = SLOW.get(item.path.name)
    return names == ALL or bool(names) and (item.originalname in names or item.name in names)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _slow(item):
            item.add_marker(pytest.mark.slow)
    reasons = {"gpu": _gpu_reason(), "browser": _browser_reason()}
    for marker, reason in reasons.items():
        if reason is None:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The shipped corpus tokenized with the 512-token tokenizer (one copy per test module)."""
    from fp8lab.data import tokens as fdata

    out = tmp_path_factory.mktemp("tokens")
    fdata.prepare_data(None, out, None, vocab_size=512)
    return out


@pytest.fixture
def capture_trained(monkeypatch):
    """The converted model as it finished training (what fp8lab.train.export.save_hf_model exported), by key "inner"."""
    from fp8lab.train import export as fexport

    seen = {}
    real = fexport.save_hf_model

    def spy(model, inner, conversion, *a, **k):
        seen["inner"] = inner
        return real(model, inner, conversion, *a, **k)

    monkeypatch.setattr(fexport, "save_hf_model", spy)
    return seen


@pytest.fixture
def gpu_record(request):
    """record(**fields): one JSON line per call into $FP8LAB_GPU_RESULTS/<test module>.jsonl (when set), so a
    GPU run's measured figures come back as a result file with the test that produced them."""
    import json

    folder = os.environ.get("FP8LAB_GPU_RESULTS")

    def record(**fields):
        if folder:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{request.module.__name__.rpartition('.')[2]}.jsonl"), "a") as f:
                f.write(json.dumps({"test": request.node.nodeid, **fields}) + "\n")

    return record
