"""The CreateTrainingJob request of a job: the training image, S3 paths, the staged code channel,
the SDK's ``ModelTrainer``, the input channels, and the dry run that builds the exact request
through the real SDK code path while every AWS call is answered locally.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from fp8lab.core.hardware import SAGEMAKER_CHECKPOINT_DIR as CHECKPOINT_LOCAL_PATH
from fp8lab.core.hardware import SAGEMAKER_TENSORBOARD_DIR
from fp8lab.core.paths import PACKAGE_DIR, SHIPPED_DIR, SHIPPED_FILES, shipped_path
from fp8lab.core.pins import requirement
from fp8lab.core.progress import Counter
from fp8lab.launch.image import IMAGES, TE_BUILD_ENV, installs_te, job_requirements
from fp8lab.launch.metric_line import METRIC_DEFINITIONS
from fp8lab.launch.plan import SweepPlan, as_plan
from fp8lab.launch.redaction import redacted_sdk_logs
from fp8lab.launch.spec import MAX_RUNTIME_CAP_S, MODEL_CHANNEL, JobSpec, hyperparameters, job_name
from fp8lab.plan.runplan import PLANNED_ENV

# pip-installed in every job before training (the job's requirements.txt). torch comes with the
# image and is not pinned; Transformer Engine, pinned by fp8lab/constraints-gpu.txt, where the job
# installs it (fp8lab.launch.image.installs_te: asked for, or the image's TE is too old or unknown),
# because it compiles against the image's CUDA (minutes). nvdlfw-inspect (pure Python, pinned there too) is
# TE's debug API: --fp8-stats-source auto reads a TE job's FP8 health through it, as on a set-up GPU machine.
JOB_REQUIREMENTS = ("transformers>=4.45", "tokenizers>=0.19", "tqdm")
JOB_PINNED = ("nvdlfw-inspect",)  # at the version fp8lab/constraints-gpu.txt pins (read when a job is staged)


def job_base_requirements() -> list[str]:
    """What every job's requirements.txt holds (TE, where the job installs it, comes after)."""
    return [*JOB_REQUIREMENTS, *map(requirement, JOB_PINNED)]
# what --tracker needs in the job (fp8lab.train.trackers); sagemaker-mlflow: MLflow's plugin for a SageMaker tracking
# server's ARN as the tracking URI
TRACKER_REQUIREMENTS = {"none": (), "tensorboard": ("tensorboard",), "mlflow": ("mlflow", "sagemaker-mlflow")}


# ----------------------------------------------------------------------------------------------
# Building the ModelTrainer
# ----------------------------------------------------------------------------------------------


def training_image(spec: JobSpec) -> str:
    """The job's training image: ``image_uri`` as given; a ``pytorch-training`` image resolved offline by the SDK's
    table; a ``pytorch`` (Amazon Linux 2023) image, which that table does not list, in the region's DLC registry as the
    SDK's table names it for ``pytorch-training`` (one registry account per region for both repositories)."""
    from sagemaker.core import image_uris
    from sagemaker.core.common_utils import get_domain_for_region

    if spec.image_uri:
        return spec.image_uri
    im = IMAGES[spec.framework_version]
    if im.tag is None:
        return image_uris.retrieve("pytorch", region=spec.region, version=spec.framework_version,
                                   py_version=spec.py_version, instance_type=spec.instance_type, image_scope="training")
    training = image_uris.config_for_framework("pytorch")["training"]
    newest = max(training["versions"], key=lambda v: tuple(int(x) for x in v.split(".")))
    registries = training["versions"][newest]["registries"]
    if spec.region not in registries:
        raise ValueError(f"JobSpec.region={spec.region!r}: the SageMaker SDK's table lists no Deep Learning Container "
                         f"registry there; allowed: {', '.join(sorted(registries))}, or pass image_uri")
    return f"{registries[spec.region]}.dkr.ecr.{spec.region}.{get_domain_for_region(spec.region)}/{im.name}"


def s3_paths(spec: JobSpec) -> dict[str, str]:
    base = f"s3://{spec.bucket}/{spec.prefix}/{spec.study}"
    name = job_name(spec)
    return {"output": f"{base}/output", "checkpoints": f"{base}/checkpoints/{name}"}


def stage_source(dest: str | Path, install_te: bool = False, framework_version: str | None = None,
                 image_uri: str | None = None, tracker: str = "none") -> Path:
    """Lay out the code channel in ``dest``: the fp8lab package (its package data included: the evidence the plan's
    ``auto`` decisions follow, and the default corpus and tokenizers in ``fp8lab/shipped/``), requirements.txt.

    In the job the trainer finds the default data in the package (``fp8lab.core.paths.shipped_path``): without a
    ``data_s3_uri`` it reads the shipped corpus, as on a laptop.
    """
    pkg = PACKAGE_DIR
    dest = Path(dest)
    shutil.copytree(pkg, dest / "fp8lab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"),
                    dirs_exist_ok=True)
    for name in SHIPPED_FILES:  # from a checkout's data/ (or FP8LAB_DATA_DIR), or an installed package's copy
        source, target = shipped_path(name), dest / "fp8lab" / SHIPPED_DIR.name / name
        if source.resolve() != target.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    reqs = (job_base_requirements() + job_requirements(install_te, framework_version, image_uri)
            + list(TRACKER_REQUIREMENTS[tracker]))
    (dest / "requirements.txt").write_text("".join(r + "\n" for r in reqs))
    return dest


def build_trainer(spec: JobSpec, source_dir: str | Path, session):
    """A ``ModelTrainer`` for one spec (nothing is called until ``train()``)."""
    from sagemaker.core.training.configs import (CheckpointConfig, Compute, MetricDefinition, OutputDataConfig,
                                                 SourceCode, StoppingCondition, Tag, TensorBoardOutputConfig)
    from sagemaker.train import ModelTrainer
    from sagemaker.train.distributed import Torchrun

    if spec.max_run_s is None:  # the time limit a plan gives it (launch() and build_requests() plan first)
        spec = as_plan(spec).jobs[0].spec
    paths = s3_paths(spec)
    stopping = StoppingCondition(max_runtime_in_seconds=spec.max_run_s)
    if spec.spot:
        stopping.max_wait_time_in_seconds = min(MAX_RUNTIME_CAP_S * 2, spec.max_wait_s or 2 * spec.max_run_s)
    compute = Compute(instance_type=spec.instance_type, instance_count=spec.instance_count,
                      volume_size_in_gb=spec.volume_gb, enable_managed_spot_training=spec.spot or None,
                      keep_alive_period_in_seconds=spec.keep_alive_s or None)
    trainer = ModelTrainer(
        sagemaker_session=session, role=spec.role, base_job_name=job_name(spec),
        input_s3_key_prefix=f"{spec.prefix}/{spec.study}/code",
        training_image=training_image(spec),
        source_code=SourceCode(source_dir=str(source_dir), entry_script="fp8lab/train/sm_entry.py",
                               requirements="requirements.txt"),
        distributed=Torchrun(process_count_per_node=spec.info.gpus),
        compute=compute, stopping_condition=stopping,
        output_data_config=OutputDataConfig(s3_output_path=paths["output"], compression_type="GZIP"),
        checkpoint_config=CheckpointConfig(s3_uri=paths["checkpoints"], local_path=CHECKPOINT_LOCAL_PATH),
        hyperparameters=hyperparameters(spec),
        # the plan made here: the trainer re-plans on the instance and refuses a different plan (fp8lab.train.sm_entry);
        # otherwise the same for BF16 and FP8 jobs (only the precision hyperparameter differs)
        environment={"FP8LAB_STUDY": spec.study, "TOKENIZERS_PARALLELISM": "false",
                     # compact: SageMaker takes at most 512 characters per environment value
                     PLANNED_ENV: json.dumps(spec.plan.decisions(), sort_keys=True, separators=(",", ":")),
                     **(TE_BUILD_ENV if installs_te(spec) else {}),
                     **({"MLFLOW_TRACKING_URI": spec.mlflow_tracking_uri} if spec.mlflow_tracking_uri else {})},
        tags=[Tag(key="fp8lab:job", value=job_name(spec)), Tag(key="fp8lab:study", value=spec.study),
              Tag(key="fp8lab:precision", value=spec.precision), Tag(key="fp8lab:model", value=spec.model_label)],
    )
    trainer.with_metric_definitions([MetricDefinition(name=k, regex=v) for k, v in METRIC_DEFINITIONS.items()])
    if spec.plan.config.tracker == "tensorboard":  # SageMaker copies the event files to S3 while the job runs
        trainer.with_tensorboard_output_config(TensorBoardOutputConfig(
            s3_output_path=f"{paths['output']}/tensorboard/{job_name(spec)}", local_path=SAGEMAKER_TENSORBOARD_DIR))
    return trainer


def input_data(spec: JobSpec):
    """The job's input channels: ``train`` (the data: an s3:// prefix as it is, a local file or folder uploaded by
    the SDK under the job's input prefix) and ``model`` (a user's model folder, alike)."""
    from sagemaker.core.training.configs import InputData

    channels = []
    if spec.data_s3_uri is not None or spec.data is not None:
        channels.append(InputData(channel_name="train", data_source=spec.data_s3_uri or spec.data))
    if spec.is_folder_model:
        channels.append(InputData(channel_name=MODEL_CHANNEL, data_source=spec.model))
    return channels or None


# ----------------------------------------------------------------------------------------------
# Dry run: the real SDK path, every AWS call answered locally
# ----------------------------------------------------------------------------------------------


class _Captured(Exception):
    """Raised from the CreateTrainingJob hook to stop the SDK once the request is built."""

    def __init__(self, params: dict[str, Any]):
        super().__init__("CreateTrainingJob captured")
        self.params = params


def _ok(parsed: dict[str, Any]):
    from botocore.awsrequest import AWSResponse

    parsed.setdefault("ResponseMetadata", {"HTTPStatusCode": 200, "RequestId": "dry-run", "HTTPHeaders": {}})
    return AWSResponse("https://dry-run.invalid", 200, {}, None), parsed


def _offline_session(region: str, bucket: str):
    """A SageMaker Session whose every AWS call is answered here; nothing leaves the process.

    S3 uploads succeed without storing anything, IAM answers that it cannot decide (so the
    SDK keeps the default bucket), and CreateTrainingJob stops the SDK with the request.
    Unexpected calls raise, so a changed SDK cannot make the dry run reach AWS.
    """
    import boto3
    from sagemaker.core.helper.session_helper import Session

    boto = boto3.Session(aws_access_key_id="dry-run", aws_secret_access_key="dry-run", region_name=region)
    trust = json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
    # The role cannot be checked offline: IAM "allows" what the SDK simulates, so that the
    # request is built exactly as for a valid role. A real launch validates it for real.
    answers: dict[str, Callable[[dict], dict]] = {
        "s3.PutObject": lambda p: {"ETag": '"0"'},
        "s3.ListBuckets": lambda p: {"Buckets": [{"Name": bucket}]},
        "s3.HeadBucket": lambda p: {},
        "iam.SimulatePrincipalPolicy": lambda p: {"EvaluationResults": [
            {"EvalActionName": a, "EvalDecision": "allowed"} for a in p.get("ActionNames", [])]},
        "iam.GetRole": lambda p: {"Role": {
            "Path": "/", "RoleName": p["RoleName"], "RoleId": "AROADRYRUNPLACEHOLDER", "Arn": "dry-run",
            "CreateDate": datetime(2024, 1, 1, tzinfo=timezone.utc), "AssumeRolePolicyDocument": trust}},
    }
    last_params: dict[str, dict] = {}

    def on_params(params, model, **_):
        key = f"{model.service_model.service_name}.{model.name}"
        last_params[key] = params
        if model.name == "CreateTrainingJob":
            raise _Captured(json.loads(json.dumps(params, default=str)))

    def on_call(model, **_):
        key = f"{model.service_model.service_name}.{model.name}"
        if key not in answers:
            raise RuntimeError(f"dry run: the SDK tried an unexpected AWS call {key}; nothing was sent")
        return _ok(answers[key](last_params.get(key, {})))

    boto.events.register("before-parameter-build.*.*", on_params)
    boto.events.register("before-call.*.*", on_call)
    config = {"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}}
    session = Session(boto_session=boto, default_bucket=bucket, sagemaker_config=config)
    session.s3_resource = _NoTransferS3(session.s3_resource)
    return session


class _NoTransferObject:
    """An S3 object of the dry run: ``upload_file`` checks the file is there and sends nothing (the dry run stores
    nothing: its PutObject is answered locally anyway); anything else is the real boto3 object's, made when first
    needed (boto3 builds a resource class per object: a millisecond each, 1,500 in a default dry run)."""

    def __init__(self, resource, args: tuple, kwargs: dict):
        self._made = lambda: resource.Object(*args, **kwargs)

    def upload_file(self, Filename, ExtraArgs=None, Callback=None, Config=None):  # noqa: N803 - boto3's names
        if not os.path.isfile(Filename):
            raise FileNotFoundError(f"dry run: the SDK asked to upload {Filename!r}, which does not exist")

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._made(), name)


class _NoTransferS3:
    """The offline session's S3 resource: the session's own, except that the SDK's per-file uploads
    (``Session.upload_data``: one boto3 transfer manager, with its threads, per file of the staged code, about 130
    files per job) transfer nothing. The SDK still walks the folder and names every key and the channel's URI."""

    def __init__(self, resource):
        self._resource = resource

    def Object(self, *args, **kwargs):  # noqa: N802 - boto3's name
        return _NoTransferObject(self._resource, args, kwargs)

    def __getattr__(self, name: str):
        return getattr(self._resource, name)


@contextlib.contextmanager
def sdk_config_checked_once():
    """While the SDK builds requests, each distinct SDK config is validated against the SDK's schema once.

    The SDK validates its whole config at every value it looks up (``SageMakerConfig.get_sagemaker_config_value``,
    dozens per job) with ``jsonschema.validate``, which first re-checks the schema itself: about 0.3 s each, most of
    a dry run's time. Here the first validation of a config runs as the SDK's (same checks, same errors); a config
    seen valid before is not validated again. The SDK's method is restored on leaving.
    """
    from sagemaker.core.config.config_manager import SageMakerConfig

    original = SageMakerConfig.__dict__["validate_sagemaker_config"]
    validate = original.__func__ if isinstance(original, staticmethod) else original
    valid: set[str] = set()

    def once(sagemaker_config=None):
        key = json.dumps(sagemaker_config, sort_keys=True, default=repr)
        if key not in valid:
            validate(sagemaker_config)
            valid.add(key)

    SageMakerConfig.validate_sagemaker_config = staticmethod(once)
    try:
        yield
    finally:
        SageMakerConfig.validate_sagemaker_config = original


def staged_source(staged: dict[tuple, Path], tmp: str, install_te: bool, framework_version: str | None = None,
                  image_uri: str | None = None, tracker: str = "none") -> Path:
    """The job's source folder, staged once per sweep for each kind of job: with or without TE in its
    requirements (and, with it, the image whose CUDA its TE core is built for), and its tracker's packages."""
    key = (install_te, (framework_version, image_uri) if install_te else None, tracker)
    if key not in staged:
        staged[key] = stage_source(Path(tmp) / f"src{len(staged)}", install_te, framework_version, image_uri, tracker)
    return staged[key]


def submit(trainer, spec: JobSpec) -> None:
    """Start the job through the SDK's ModelTrainer (returns at once; nothing is waited for or streamed)."""
    trainer.train(input_data_config=input_data(spec), wait=False, logs=False)


def build_requests(spec_or_plan: JobSpec | SweepPlan | Sequence[JobSpec]) -> list[dict[str, Any]]:
    """The exact CreateTrainingJob request of each job, built by ModelTrainer.train() with no AWS call."""
    plan = as_plan(spec_or_plan)
    out = []
    # the bar's clock starts before the SDK is imported (seconds), so that a long wait shows as one
    with Counter("building requests (dry run)", unit="job", total=len(plan.jobs)) as bar, \
            tempfile.TemporaryDirectory(prefix="fp8lab-src-") as tmp, redacted_sdk_logs(), sdk_config_checked_once():
        staged: dict[tuple, Path] = {}
        sessions: dict[tuple, Any] = {}  # one offline session per region and bucket (making one takes seconds)
        for job in plan.jobs:
            bar.tick(0)
            spec = job.spec
            where = (spec.region, spec.bucket)
            if where not in sessions:
                sessions[where] = _offline_session(*where)
            trainer = build_trainer(spec, staged_source(staged, tmp, installs_te(spec), spec.framework_version,
                                                        spec.image_uri, spec.plan.config.tracker), sessions[where])
            try:
                submit(trainer, spec)
            except _Captured as cap:
                out.append(cap.params)
            else:  # pragma: no cover - the hook always fires
                raise RuntimeError("dry run: the SDK finished without sending CreateTrainingJob")
            bar.tick()
    return out


def _flatten(obj: Any, path: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flatten(val, f"{path}.{key}" if path else key).items()}
    if isinstance(obj, list):
        return {k: v for i, val in enumerate(obj) for k, v in _flatten(val, f"{path}[{i}]").items()}
    return {path: obj}


def request_diff(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Fields of ``other`` that differ from ``reference`` (flattened paths), ignoring the job's own name and S3 keys."""
    a, b = _flatten(reference), _flatten(other)
    skip = re.compile(r"TrainingJobName|InputDataConfig\[\d+\]\.DataSource\.S3DataSource\.S3Uri")
    return {k: b.get(k) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and not skip.fullmatch(k)}
