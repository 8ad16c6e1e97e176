"""Turn training and benchmark runs into the answer: does FP8 pay off, by how much, at what loss?

Three kinds of run sources load into one tidy table (a row per step, with the run's metadata):
trainer output folders (``metrics.jsonl`` + ``config.json``), a ``fp8lab.launch.collect`` table,
and result files under ``data/results/`` (format: ``data/results/README.md``). From that table:
per-run summaries (steady-state throughput, MFU, memory, loss), BF16-vs-FP8 comparisons per model
and scale, time and cost to train a token budget, and a verdict written from those numbers.

Figures live in :mod:`fp8lab.views.plots`; the HTML report and its command (``fp8lab report``) in
:mod:`fp8lab.views.report`, which builds on this package (nothing here reaches up to either).

The package, one idea a module (each re-exported here, so ``from fp8lab.analysis import X`` works):

    load        reading runs (trainer folders, collected tables, result files) into the tidy table;
                writing result files; profiles; the source's reported figures; choosing runs
    labels      what a run is called (variant, layout, model size) and missing-aware predicates
    summary     per-run summaries, BF16-vs-FP8 comparisons, the default budget and price, scaling
    headline    the headline view per model (best runs, speedups, the loss study's gap)
    parity      loss parity against BF16's seed-to-seed noise: per validation step, the gap to the seeds' mean
    conclusion  the verdict: a paragraph written from the comparison (``verdict``)
    answer      the one answer every view renders (``Answer``): chosen runs, speedup, MFU, loss gap,
                and the planned time and cost of a token budget; every run's (``cost_table``), the same way
"""
from __future__ import annotations

from fp8lab.analysis.headline import (BEST_RUN_COLUMNS, DETAILS, HEADLINE_COLUMNS, best_runs,  # noqa: F401
                                      check_detail, headline_runs, headline_table, loss_run_ids)
from fp8lab.analysis.labels import (group_key, is_false, is_fp8, is_hardware_fp8, is_true,  # noqa: F401
                                    layout_label, model_size_b, variant_kind, variant_label)
from fp8lab.analysis.load import (COLUMNS, META_COLUMNS, METRIC_COLUMNS, PROVENANCE_COLUMNS,  # noqa: F401
                                  RECORD_TYPES, RUN_RECORD_REQUIRED, RunFileError, RunFileWarning, describe,
                                  display_path, load_profiles, load_reference, load_runs, reference_for, read_jsonl,
                                  select_runs,
                                  source_link,
                                  write_result_file)
from fp8lab.analysis.summary import (DEFAULT_GPUS_PER_INSTANCE, DEFAULT_PRICE_PER_INSTANCE_HOUR,  # noqa: F401
                                     DEFAULT_TOKEN_BUDGET, LAYOUT_KEYS, SCALE_KEYS, SMOOTHING_METHODS,
                                     check_cost_args, compare_precisions, scaling_axis, scaling_table,
                                     smooth, summarize_runs)
from fp8lab.analysis.conclusion import fmt_tokens, verdict  # noqa: F401
from fp8lab.analysis.parity import parity_curves  # noqa: F401
from fp8lab.analysis.answer import ANSWER_COLUMNS, Answer, cost_table  # noqa: F401
from fp8lab.analysis.index import summary_for  # noqa: F401
from fp8lab.analysis.peers import lead_over_peers, peers_table  # noqa: F401
from fp8lab.core.hardware import PRICE_SOURCE  # noqa: F401 (one statement of the assumed price, the launcher's)

