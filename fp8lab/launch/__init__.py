"""Plan, launch, watch and collect BF16 vs FP8 sweeps as SageMaker training jobs (P5 and up).

Everything goes through the SageMaker Python SDK 3.x ``ModelTrainer``: the package ships as
source code, the SDK's torchrun driver starts 8 processes per node, and the trainer's metric
line is read back by SageMaker metric definitions. Specs are validated before anything is
uploaded, and a dry run (the default) builds the exact CreateTrainingJob request through the
real SDK code path while every AWS call is answered locally, so it runs with no account.

    plan = plan_sweep(["llama-1b", "llama-7b"], ["bf16", "fp8"], [1, 2, 4],
                      tokens=2_000_000_000, role=ROLE_ARN, bucket="my-bucket")
    launch(plan)                      # dry run: requests + cost table, no AWS call
    names = launch(plan, dry_run=False)
    wait(names); df = collect(names)

Job names: ``plan_sweep`` gives each job a deterministic name (``fp8lab-<model>-<precision>-
<count>x<instance>-<hash>``, at most 48 characters). The SDK appends a ``-<timestamp>`` (its
local clock) to it when it creates the job, so SageMaker's name is ``<plan name>-YYYYmmddHHMMSS`` (<= 63).
Re-launching the same plan finds the existing jobs by that prefix and skips them. The hash covers
what defines the experiment; for a model folder, its config.json and its weights' bytes (SHA-256),
so another fine-tune with the same config is another job.
See ``docs/launch.md`` for how Transformer Engine gets into the job and what the SDK's torchrun
driver sets (NCCL/EFA variables) for every job alike.

The package, one idea a module (each re-exported here, so ``from fp8lab.launch import X`` works):

    spec         JobSpec (validated on construction, by the trainer's own checks too), job names,
                 the trainer options a job carries as hyperparameters
    limits       what S3 and SageMaker take: bucket names, S3 URIs, volume, price, a job's 28 days
    plan         plan_sweep, Estimate, SweepPlan: names, time limits, time and cost
    requests     the CreateTrainingJob request: image, S3 paths, code channel, ModelTrainer, dry run
    aws          the AWS calls: launch, wait, collect (throttling back-off)
    redaction    account ids and keys out of everything printed
    metric_line  the trainer's metric line: SageMaker metric definitions and its parser
    cli          ``fp8lab launch {plan,dry-run,launch,wait,collect}`` (also ``python -m fp8lab.launch``)
"""
from __future__ import annotations

# facts about instances, prices and placeholders live in fp8lab.core.hardware; their old names import from here too
from fp8lab.core.hardware import (DEFAULT_PRICES_USD_PER_HOUR, INSTANCES, PLACEHOLDER_BUCKET,  # noqa: F401
                             PLACEHOLDER_ROLE, PRICE_SOURCE, InstanceInfo, price_for)
from fp8lab.core.hardware import SAGEMAKER_CHECKPOINT_DIR as CHECKPOINT_LOCAL_PATH  # noqa: F401
from fp8lab.launch.aws import (TERMINAL, THROTTLE_CODES, TrainingJobFailed, call_with_backoff,  # noqa: F401
                               collect, find_existing, launch, wait)
from fp8lab.launch.cli import main  # noqa: F401
from fp8lab.launch.metric_line import METRIC_DEFINITIONS, parse_metric_line  # noqa: F401
from fp8lab.plan.flops_estimate import Estimate  # noqa: F401
from fp8lab.launch.plan import (PlannedJob, SweepPlan, default_estimate, format_cost_table, plan_curve,  # noqa: F401
                                plan_sweep)
from fp8lab.launch.redaction import redact  # noqa: F401
from fp8lab.launch.requests import (JOB_REQUIREMENTS, build_requests, build_trainer, input_data,  # noqa: F401
                                    job_base_requirements, request_diff, s3_paths, stage_source, training_image)
from fp8lab.launch.spec import (BACKENDS, JOB_OWNED_OPTIONS, LAYOUT_FIELDS, LAYOUT_OPTIONS,  # noqa: F401
                                MAX_INSTANCES_PER_JOB, MAX_RUNTIME_CAP_S, MODEL_CHANNEL, MODEL_CHANNEL_PATH,
                                PARALLEL, PRECISIONS, RECIPES, SOURCE_NAME_MAX, SPEC_OPTIONS, JobSpec, hyperparameters,
                                job_name)

