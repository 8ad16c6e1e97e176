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
Re-launching the same plan finds the existing jobs by that prefix and skips them.
See ``docs/launch.md`` for how Transformer Engine gets into the job and what the SDK's torchrun
driver sets (NCCL/EFA variables) for every job alike.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import math
import re
import shutil
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

# facts about instances, prices and placeholders live in fp8lab.hardware; their old names import from here too
from fp8lab.hardware import (DEFAULT_PRICES_USD_PER_HOUR, INSTANCES, PLACEHOLDER_BUCKET,  # noqa: F401
                             PLACEHOLDER_ROLE, PRICE_SOURCE, InstanceInfo, price_for)
from fp8lab.hardware import SAGEMAKER_CHECKPOINT_DIR as CHECKPOINT_LOCAL_PATH
from fp8lab.options import HARDWARE_BACKENDS, PARALLEL, PRECISIONS, RECIPE_KINDS, to_text  # the trainer's vocabularies
from fp8lab.recipe import Recipe
from fp8lab.layout import AUTO_FIELDS, INT_FIELDS
from fp8lab.validate import NONNEG_INT, OneLineParser, check_writable_file, is_count, one_of, parse_count, whole_number

# ----------------------------------------------------------------------------------------------
# Option vocabularies and limits
# ----------------------------------------------------------------------------------------------

BACKENDS = HARDWARE_BACKENDS  # FP8 on tensor cores (fp8lab.backends less the emulator)
RECIPES = RECIPE_KINDS
SOURCE_NAME_MAX = 48  # 63 (SageMaker limit) - 15 for the SDK's "-YYYYmmddHHMMSS"
MAX_RUNTIME_CAP_S = 28 * 24 * 3600  # SageMaker's longest training job
# A sanity cap on instances per job: more than a typical regional P5 quota; a typo there (1000 for 10)
# costs real money, so planning beyond it needs allow_large=True (CLI: --allow-large)
MAX_INSTANCES_PER_JOB = 64
# pip-installed in every job before training (the job's requirements.txt). torch comes with the
# image and is not pinned; Transformer Engine only with JobSpec(install_te=True), because it
# compiles against the image's CUDA (slow) and some images already ship it.
JOB_REQUIREMENTS = ("transformers>=4.45", "tokenizers>=0.19", "tqdm")
THROTTLE_CODES = {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded",
                  "ProvisionedThroughputExceededException", "SlowDown"}
TERMINAL = {"Completed", "Failed", "Stopped"}

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
# SageMaker reads these from the job's log stream. The leading space keeps " loss=" from
# matching "val_loss=". Names become CloudWatch metric names of the job.
METRIC_DEFINITIONS: dict[str, str] = {
    "train:loss": rf"fp8lab-metrics step=\d+ loss={_NUM}",
    "train:tokens_per_sec_per_gpu": rf"fp8lab-metrics step=\d+ .* tokens_per_sec_per_gpu={_NUM}",
    "train:mfu": rf"fp8lab-metrics step=\d+ .* mfu={_NUM}",
    "train:step_time_s": rf"fp8lab-metrics step=\d+ .* step_time_s={_NUM}",
    "train:lr": rf"fp8lab-metrics step=\d+ .* lr={_NUM}",
    "train:grad_norm": rf"fp8lab-metrics step=\d+ .* grad_norm={_NUM}",
    "validation:loss": rf"fp8lab-metrics step=\d+ val_loss={_NUM}",
}
_METRIC_LINE = re.compile(r"fp8lab-metrics ((?:\w+=\S+ ?)+)")


def parse_metric_line(line: str) -> dict[str, float | int] | None:
    """The key=value pairs of one trainer metric line (``step`` as int), or None for other lines."""
    m = _METRIC_LINE.search(line)
    if not m:
        return None
    out: dict[str, float | int] = {}
    for pair in m.group(1).split():
        key, _, value = pair.partition("=")
        try:
            out[key] = int(value) if key == "step" else float(value)
        except ValueError:
            continue
    return out if "step" in out else None


# ----------------------------------------------------------------------------------------------
# JobSpec
# ----------------------------------------------------------------------------------------------


def _model_names() -> list[str]:
    from fp8lab.models import MODEL_CONFIGS

    return list(MODEL_CONFIGS)


@functools.lru_cache(maxsize=None)  # static data shipped with botocore; loading it costs ~0.4 s
def _sagemaker_regions() -> tuple[str, ...]:
    import botocore.session

    return tuple(botocore.session.get_session().get_available_regions("sagemaker"))


@functools.lru_cache(maxsize=None)
def _instance_region_table() -> dict[str, frozenset[str]]:
    """The SDK's own table of GPU instance types per region (instance_gpu_info.json)."""
    import sagemaker.core.image_uris as iu

    path = Path(iu.__file__).parent / "image_uri_config" / "instance_gpu_info.json"
    try:
        return {r: frozenset(types) for r, types in json.loads(path.read_text()).items()}
    except OSError:
        return {}


def _known_regions(instance_type: str) -> set[str] | None:
    """Regions where the SDK's table lists ``instance_type``; None when the table does not say."""
    regions = {r for r, types in _instance_region_table().items() if instance_type in types}
    return regions or None


@dataclass(frozen=True)
class JobSpec:
    """One training job: what to train, on what, for how long, and where results go.

    Validated on construction, so a bad sweep fails before any upload or cloud call.
    """

    model: str  # a name in fp8lab.models.MODEL_CONFIGS, a local model folder (config.json + optional *.safetensors) or s3://... of one
    precision: str = "bf16"  # "bf16" or "fp8"
    role: str = ""  # SageMaker execution role ARN (required)
    bucket: str = ""  # S3 bucket for code, outputs and checkpoints (required)
    backend: str = "te"  # FP8 backend, passed to BF16 jobs too so both run the same layers
    recipe: str = "delayed"  # FP8 scaling recipe (fp8lab.recipe kinds); mxfp8 needs Blackwell
    instance_type: str = "ml.p5.48xlarge"
    instance_count: int = 1
    tokens: int | None = None  # training tokens over all GPUs; exactly one of tokens / steps
    steps: int | None = None
    micro_batch_size: int | str = "auto"  # sequences per GPU per micro-step; auto: fp8lab.layout for the instance's GPU
    grad_accum: int | str = "auto"  # auto: fp8lab.layout's tokens-per-step target
    seq_len: int | str = "auto"  # auto: 2048 (at most the model's max_seq_len)
    lr: float = 3e-4
    fuse: bool = True  # fused TE modules (LayerNormLinear / LayerNormMLP)
    compile: bool = False  # torch.compile each block
    parallel: str = "fsdp"  # ddp | fsdp (FSDP2): a 7B model with AdamW state does not fit one GPU under DDP
    activation_checkpointing: bool = False  # recompute blocks in backward: less memory, ~1/3 more compute
    seed: int = 0
    checkpoint_every: int = 0  # steps between checkpoints to /opt/ml/checkpoints (0 = only at the end)
    data_s3_uri: str | None = None  # token data for the "train" channel; None = the trainer's default data
    spot: bool = False  # managed spot training (checkpoints make it resumable)
    max_run_s: int | None = None  # None = from the plan's time estimate (x2 + 1 h)
    max_wait_s: int | None = None  # spot only: max_run + waiting for capacity; None = 2 x max_run
    keep_alive_s: int = 0  # warm pool: keep instances this long for the next job (0 = off)
    volume_gb: int = 200
    prefix: str = "fp8lab"  # S3 key prefix under the bucket
    study: str = "p5-sweep"  # groups the jobs (tag and S3 folder)
    region: str = "us-east-1"
    framework_version: str = "2.9"  # PyTorch training image (AWS Deep Learning Container)
    py_version: str = "py312"
    install_te: bool = False  # add transformer-engine[pytorch] to the job's requirements
    model_config: dict | None = None  # s3:// model only: its config.json contents (the plan validates them; nothing is read from S3)
    options: dict = dataclasses.field(default_factory=dict)  # any other trainer option by TrainConfig name, e.g. {"param_dtype": "bf16", "fsdp_keep_weights": True}
    allow_large: bool = False  # permit instance_count above MAX_INSTANCES_PER_JOB (not part of the job's identity)

    def __post_init__(self) -> None:
        def bad(name: str, value: Any, allowed: str) -> ValueError:
            return ValueError(f"JobSpec.{name}={value!r} is invalid; allowed: {allowed}")

        for name in ("tokens", "steps"):  # 1e9 is a count, as on the command line (fp8lab.validate.parse_count)
            object.__setattr__(self, name, whole_number(getattr(self, name)))

        self._check_model(bad)
        from fp8lab.train import option_problem  # trainer options: the trainer's own checks (its schema)

        for name, choices in (("precision", PRECISIONS), ("backend", BACKENDS), ("parallel", PARALLEL)):
            if not one_of(choices)(getattr(self, name)):
                raise bad(name, getattr(self, name), ", ".join(choices))
        for name in (*LAYOUT_FIELDS, "tokens", "steps", "seed", "lr", "fuse", "compile", "activation_checkpointing"):
            if (allowed := option_problem(name, getattr(self, name))) is not None:
                raise bad(name, getattr(self, name), allowed)
        if not isinstance(self.recipe, str) or self.recipe.partition(":")[0] not in RECIPES:
            raise bad("recipe", self.recipe, ", ".join(RECIPES) + " (optionally kind:key=value,...)")
        try:
            Recipe.parse(self.recipe)
        except ValueError as exc:
            raise ValueError(f"JobSpec.recipe={self.recipe!r} is invalid: {exc}") from None
        if self.instance_type not in INSTANCES:
            raise bad("instance_type", self.instance_type, ", ".join(INSTANCES))
        info = INSTANCES[self.instance_type]
        if self.precision == "fp8" and not info.fp8:
            fp8_types = ", ".join(k for k, v in INSTANCES.items() if v.fp8)
            raise ValueError(
                f"JobSpec.precision='fp8' needs FP8 tensor cores, which {self.instance_type} ({info.gpu}) "
                f"does not have; use one of: {fp8_types}"
            )
        if self.precision == "fp8" and self.recipe.partition(":")[0] == "mxfp8" and not info.blackwell:
            raise ValueError(f"JobSpec.recipe='mxfp8' needs Blackwell GPUs; {self.instance_type} has {info.gpu}")
        for name in ("instance_count", "volume_gb"):
            if not is_count(getattr(self, name)):
                raise bad(name, getattr(self, name), "an integer >= 1")
        if not isinstance(self.allow_large, bool):
            raise bad("allow_large", self.allow_large, "True or False")
        if self.instance_count > MAX_INSTANCES_PER_JOB and not self.allow_large:
            raise bad("instance_count", self.instance_count,
                      f"1..{MAX_INSTANCES_PER_JOB} per job (a sanity limit); to plan more, pass allow_large=True "
                      "(CLI: --allow-large) after checking your SageMaker quota")
        for name in ("checkpoint_every", "keep_alive_s"):  # a job checkpoints to S3: never -1 (off)
            if not NONNEG_INT(getattr(self, name)):
                raise bad(name, getattr(self, name), NONNEG_INT.allowed)
        if (self.tokens is None) == (self.steps is None):
            raise ValueError("JobSpec needs exactly one of tokens= or steps= (got "
                             f"tokens={self.tokens!r}, steps={self.steps!r})")
        for name in ("max_run_s", "max_wait_s"):
            v = getattr(self, name)
            if v is not None and not is_count(v):
                raise bad(name, v, "a positive integer or None")
        if self.keep_alive_s > 3600:
            raise bad("keep_alive_s", self.keep_alive_s, "0..3600 seconds (SageMaker warm pool limit)")
        if self.keep_alive_s and self.spot:
            raise ValueError("JobSpec: keep_alive_s (warm pool) and spot=True cannot be combined; "
                             "SageMaker warm pools do not support managed spot training")
        if self.max_wait_s is not None and not self.spot:
            raise ValueError("JobSpec.max_wait_s only applies to spot=True jobs")
        if self.max_run_s is not None and self.max_run_s > MAX_RUNTIME_CAP_S:
            raise bad("max_run_s", self.max_run_s, f"at most {MAX_RUNTIME_CAP_S} (28 days)")
        if not self.role:
            raise ValueError("JobSpec.role is missing: pass your SageMaker execution role ARN "
                             f"(for a dry run without an account: {PLACEHOLDER_ROLE!r})")
        if not re.fullmatch(r"arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+", self.role):
            raise bad("role", self.role, "an IAM role ARN like arn:aws:iam::<12-digit account>:role/<name>")
        if not self.bucket:
            raise ValueError("JobSpec.bucket is missing: pass an S3 bucket name "
                             f"(for a dry run without an account: {PLACEHOLDER_BUCKET!r})")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", self.bucket):
            raise bad("bucket", self.bucket, "an S3 bucket name (3-63 of a-z 0-9 . -), without s3://")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_\-/]*", self.prefix) or self.prefix.endswith("/"):
            raise bad("prefix", self.prefix, "an S3 key prefix of letters, digits, - _ / (no leading or trailing /)")
        if not re.fullmatch(r"[a-z0-9][a-z0-9\-]{0,40}", self.study):
            raise bad("study", self.study, "lowercase letters, digits and -, at most 41 characters")
        if self.data_s3_uri is not None and not self.data_s3_uri.startswith("s3://"):
            raise bad("data_s3_uri", self.data_s3_uri, "an s3:// URI or None")
        regions = _sagemaker_regions()
        if self.region not in regions:
            raise bad("region", self.region, "a region where SageMaker runs: " + ", ".join(regions))
        known = _known_regions(self.instance_type)
        # Only a region the table describes can be said to lack the type; unknown regions pass.
        if known is not None and self.region not in known and self.region in _instance_region_table():
            raise ValueError(f"JobSpec.region={self.region!r}: {self.instance_type} is not offered there "
                             f"(SageMaker SDK instance table); choose one of: {', '.join(sorted(known))}")
        self._resolve_with_trainer()

    def _check_model(self, bad: Callable[[str, Any, str], ValueError]) -> None:
        """A named model, a local folder (its config.json read and checked) or s3:// with ``model_config``.

        A folder model reaches the job as the input channel ``model`` (the SDK uploads a local folder;
        an s3:// prefix is mounted as it is) and the trainer runs ``--model /opt/ml/input/data/model``.
        For s3:// the plan cannot read the config, so ``model_config`` (the config.json contents, as a
        dict) is required: it is validated like a folder's and gives the FLOPs and memory estimates."""
        from fp8lab import user_model

        models = _model_names()
        allowed = ", ".join(models) + ", a local model folder (config.json + optional *.safetensors) or an s3:// URI of one"
        if not isinstance(self.model, str) or not self.model:
            raise bad("model", self.model, allowed)
        if self.model.startswith("s3://"):
            if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/\S*)?", self.model):
                raise bad("model", self.model, "an s3://bucket/prefix URI of a model folder")
            if not isinstance(self.model_config, dict):
                raise bad("model_config", self.model_config, "the model's config.json contents as a dict (required for "
                          "an s3:// model: the plan validates it before launch), e.g. json.load(open('config.json'))")
            try:
                user_model.check_config_dict(self.model_config, "JobSpec.model_config")
            except ValueError as exc:
                raise ValueError(f"JobSpec.model_config: {exc}") from None
            return
        if self.model_config is not None:
            raise bad("model_config", self.model_config, "None unless model is an s3:// URI (a named model or a local "
                      "folder carries its own config)")
        if self.model.startswith("hf:"):
            raise bad("model", self.model, allowed + " (download hf: models first: a job has no Hub access guaranteed)")
        if self.model in models:
            return
        if not user_model.is_user_model(self.model):
            raise bad("model", self.model, allowed)
        try:
            user_model.hf_config(self.model)
        except ValueError as exc:
            raise ValueError(f"JobSpec.model: {exc}") from None

    @property
    def is_folder_model(self) -> bool:
        """True when the model travels as the job's ``model`` input channel."""
        return self.model not in _model_names()

    @property
    def model_label(self) -> str:
        """A short name for job names, tags and tables: the named model or the folder's own name."""
        if not self.is_folder_model:
            return self.model
        return self.model.rstrip("/").rsplit("/", 1)[-1] or "model"

    @property
    def model_cfg(self):
        """fp8lab's ModelConfig of the job's model (named, folder or model_config)."""
        from fp8lab.models import config_from_hf, get_config
        from fp8lab import user_model

        if self.model_config is not None:
            return config_from_hf(user_model.check_config_dict(self.model_config, "JobSpec.model_config"))
        return get_config(self.model)

    def _resolve_with_trainer(self) -> None:
        """Run the trainer's own parser and start-up checks on this job, for the instance's GPU at
        8 x instance_count ranks, and replace "auto" layout fields by what the trainer will run."""
        from fp8lab.hardware import Machine
        from fp8lab.train import parse_args, preflight

        if not isinstance(self.options, dict):
            raise ValueError(f"JobSpec.options={self.options!r} is invalid; allowed: a dict of trainer options")
        unknown = sorted(set(self.options) - _trainer_option_names())
        reserved = sorted(set(self.options) & JOB_OWNED_OPTIONS)
        if unknown or reserved:
            raise ValueError(f"JobSpec.options: {', '.join(unknown + reserved)} "
                             + ("not trainer options" if unknown else "set by JobSpec itself or by SageMaker")
                             + f"; allowed: {', '.join(sorted(_trainer_option_names() - JOB_OWNED_OPTIONS))}")
        hp = _requested_hyperparameters(self)
        hp.pop("data", None)  # the channel's path exists only inside the job
        try:
            with _local_model(self) as local:  # the model channel's path exists only inside the job, too
                hp["model"] = local
                cfg = parse_args([a for k, v in hp.items() for a in (f"--{k}", _hp_text(v))])
                machine = Machine.planned(self.info.gpu, self.world_size, self.info.fp8)
                cfg, layout, _, _ = preflight(cfg, machine, self.backend)  # parse_args ran the fused-path check
        except ValueError as exc:
            raise ValueError(f"JobSpec({self.model_label}, {self.precision}, {self.instance_count} x {self.instance_type}): "
                             f"the trainer would refuse this job: {exc}") from None
        # spell the resolved layout out, so a copy (dataclasses.replace) resolves to the very same job
        for name in LAYOUT_FIELDS:
            object.__setattr__(self, name, getattr(cfg, name))
        object.__setattr__(self, "options", {**self.options, **{k: getattr(cfg, k) for k in LAYOUT_OPTIONS}})
        object.__setattr__(self, "_layout", layout)

    @property
    def layout(self):
        """The fp8lab.layout.Layout the job runs (memory estimate and reasons included)."""
        return self._layout

    @property
    def info(self) -> InstanceInfo:
        return INSTANCES[self.instance_type]

    @property
    def world_size(self) -> int:
        return self.instance_count * self.info.gpus

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.seq_len * self.world_size

    @property
    def total_tokens(self) -> int:
        return self.tokens if self.tokens is not None else self.steps * self.tokens_per_step

    def identity(self) -> dict[str, Any]:
        """The fields that define the experiment (not where it is stored or who pays), for the name hash."""
        skip = {"role", "bucket", "prefix", "region", "keep_alive_s", "max_wait_s", "study", "allow_large"}
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}
        if self.model_config is None:
            out.pop("model_config")  # named models: the identity (and job names) as before
        if self.is_folder_model and not self.model.startswith("s3://"):
            from fp8lab import user_model

            out["model"] = user_model.identity(self.model)  # the config, not where the folder sits on this machine
        return out


def job_name(spec: JobSpec) -> str:
    """Deterministic SageMaker-valid name stem: fp8lab-<model>-<precision>-<n>x<instance>-<hash6>."""
    digest = hashlib.sha1(json.dumps(spec.identity(), sort_keys=True).encode()).hexdigest()[:6]
    model = re.sub(r"[^a-zA-Z0-9]+", "-", spec.model_label).strip("-") or "model"
    inst = re.sub(r"[^a-zA-Z0-9]+", "-", spec.instance_type.removeprefix("ml.").split(".")[0])
    tail = f"-{spec.precision}-{spec.instance_count}x{inst}-{digest}"
    room = SOURCE_NAME_MAX - len("fp8lab-") - len(tail)
    name = f"fp8lab-{model[:room].strip('-')}{tail}"
    assert re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,47}", name), name
    return name


# ----------------------------------------------------------------------------------------------
# Plan: names, time and cost
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """How long and how much, from model FLOPs and an assumed MFU (a planning number, not a measurement)."""

    assumed_mfu: float = 0.35  # of the BF16 dense peak; typical for well-tuned dense LLM training
    fp8_speedup: float = 1.15  # FP8 over BF16 end to end; the source blog reports 13% (1B) to 18% (7B)
    startup_s: int = 600  # provisioning, image pull, pip install: billed or not, it is wall time

    def __post_init__(self) -> None:
        if not 0 < self.assumed_mfu <= 1:
            raise ValueError(f"assumed_mfu={self.assumed_mfu!r} must be in (0, 1]")
        if self.fp8_speedup <= 0:
            raise ValueError(f"fp8_speedup={self.fp8_speedup!r} must be > 0")
        if self.startup_s < 0:
            raise ValueError(f"startup_s={self.startup_s!r} must be >= 0")

    def seconds(self, spec: JobSpec) -> float:
        from fp8lab.models import model_flops_per_token

        flops = model_flops_per_token(spec.model_cfg, spec.seq_len) * spec.total_tokens
        rate = spec.world_size * spec.info.bf16_tflops * 1e12 * self.assumed_mfu
        if spec.precision == "fp8":
            rate *= self.fp8_speedup
        return flops / rate + self.startup_s

    def basis(self, spec: JobSpec) -> str:
        """What a job's estimate rests on (the plan table's ``basis`` column)."""
        return f"assumed MFU {self.assumed_mfu} of BF16 peak" + (f", FP8 x{self.fp8_speedup}" if spec.precision == "fp8" else "")

    def describe(self) -> str:
        return (f"estimate: MFU {self.assumed_mfu} of BF16 peak, FP8 speed-up x{self.fp8_speedup}, "
                f"+{self.startup_s} s start-up per job (planning numbers, not measurements)")


def default_estimate() -> Estimate:
    """The estimate plans use unless given one: measured throughput from data/results/ where it exists
    (:class:`fp8lab.estimates.MeasuredEstimate`), this MFU assumption elsewhere."""
    from fp8lab.estimates import MeasuredEstimate

    return MeasuredEstimate()


@dataclass(frozen=True)
class PlannedJob:
    spec: JobSpec
    name: str
    est_hours: float  # wall clock of one job
    gpu_hours: float
    cost_usd: float


@dataclass(frozen=True)
class SweepPlan:
    """The jobs of a sweep with their names and estimates; ``table()`` for display, ``summary()`` for tests."""

    jobs: tuple[PlannedJob, ...]
    price_per_hour: float
    price_source: str
    estimate: Estimate

    @property
    def total_cost_usd(self) -> float:
        return sum(j.cost_usd for j in self.jobs)

    @property
    def total_gpu_hours(self) -> float:
        return sum(j.gpu_hours for j in self.jobs)

    @property
    def names(self) -> list[str]:
        return [j.name for j in self.jobs]

    def table(self):
        """One row per job plus a total row, as a pandas DataFrame."""
        import pandas as pd

        rows = [{
            "job": j.name, "model": j.spec.model_label, "precision": j.spec.precision,
            "instances": j.spec.instance_count, "gpus": j.spec.world_size,
            "tokens": j.spec.total_tokens,
            # the layout the trainer will run (fp8lab.layout for the instance's GPU), with its memory estimate
            "layout": f"{j.spec.micro_batch_size} x {j.spec.seq_len} x {j.spec.grad_accum}",
            "mem_est_gib": round(j.spec.layout.memory.peak, 1),
            "max_run_h": round(j.spec.max_run_s / 3600, 2), "est_hours": round(j.est_hours, 2), "gpu_hours": round(j.gpu_hours, 1),
            "cost_usd": round(j.cost_usd, 2), "basis": self.estimate.basis(j.spec),
        } for j in self.jobs]
        rows.append({"job": "TOTAL", "instances": sum(j.spec.instance_count for j in self.jobs),
                     "gpus": sum(j.spec.world_size for j in self.jobs),
                     "tokens": sum(j.spec.total_tokens for j in self.jobs),
                     "gpu_hours": round(self.total_gpu_hours, 1), "cost_usd": round(self.total_cost_usd, 2)})
        df = pd.DataFrame(rows)
        for col in ("instances", "tokens"):
            df[col] = df[col].astype("Int64")
        return df

    def summary(self) -> dict[str, Any]:
        return {
            "n_jobs": len(self.jobs), "names": self.names,
            "total_gpu_hours": round(self.total_gpu_hours, 3), "total_cost_usd": round(self.total_cost_usd, 2),
            "price_per_hour": self.price_per_hour, "price_source": self.price_source,
            "assumptions": dataclasses.asdict(self.estimate),
        }


def _max_run(seconds: float) -> int:
    """Time limit from an estimate: twice the estimate plus an hour, within SageMaker's 28 days."""
    return int(min(MAX_RUNTIME_CAP_S, math.ceil(2 * seconds + 3600)))


def _plan_job(spec: JobSpec, price: float, est: Estimate) -> PlannedJob:
    seconds = est.seconds(spec)
    if spec.max_run_s is None:
        spec = dataclasses.replace(spec, max_run_s=_max_run(seconds))
    hours = seconds / 3600
    return PlannedJob(spec, job_name(spec), hours, hours * spec.world_size, hours * spec.instance_count * price)


def plan_sweep(models: Sequence[str], precisions: Sequence[str], instance_counts: Sequence[int], *,
               price_per_hour: float | None = None, estimate: Estimate | None = None, **common: Any) -> SweepPlan:
    """Every model x precision x instance count as a validated JobSpec with name, time and cost.

    ``common`` are JobSpec fields shared by all jobs (tokens or steps, role, bucket, ...), so BF16
    and FP8 runs differ only in precision. Order is deterministic (models, then precisions, then counts).
    """
    for pname, values in (("models", models), ("precisions", precisions), ("instance_counts", instance_counts)):
        if isinstance(values, (str, int)) or not list(values):
            raise ValueError(f"plan_sweep({pname}=...) needs a non-empty list, got {values!r}")
        if len(set(values)) != len(list(values)):
            raise ValueError(f"plan_sweep({pname}={list(values)!r}) has duplicates")
    fields = {f.name for f in dataclasses.fields(JobSpec)}
    bad = sorted((set(common) - fields) | (set(common) & {"model", "precision", "instance_count"}))
    if bad:
        raise ValueError(f"plan_sweep: unknown or reserved JobSpec field(s) {', '.join(bad)}")
    specs = [JobSpec(model=m, precision=p, instance_count=n, **common)
             for m, p, n in itertools.product(models, precisions, instance_counts)]
    price, source = price_for((s.instance_type for s in specs), price_per_hour)
    est = estimate or default_estimate()
    if "max_run_s" not in common:
        # One time limit per (model, instance count), the longer of its BF16 and FP8 estimates,
        # so the paired jobs differ in nothing but precision.
        longest: dict[tuple, float] = {}
        for s in specs:
            key = (s.model, s.instance_count)
            longest[key] = max(longest.get(key, 0.0), est.seconds(s))
        specs = [dataclasses.replace(s, max_run_s=_max_run(longest[s.model, s.instance_count])) for s in specs]
    jobs = tuple(_plan_job(s, price, est) for s in specs)
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):  # cannot happen with distinct inputs; guard the invariant
        raise ValueError(f"plan_sweep produced duplicate job names: {names}")
    return SweepPlan(jobs, price, source, est)


def _as_plan(spec_or_plan: JobSpec | SweepPlan | Sequence[JobSpec], price_per_hour: float | None = None) -> SweepPlan:
    if isinstance(spec_or_plan, SweepPlan):
        return spec_or_plan
    specs = [spec_or_plan] if isinstance(spec_or_plan, JobSpec) else list(spec_or_plan)
    if not specs or not all(isinstance(s, JobSpec) for s in specs):
        raise ValueError("launch() takes a JobSpec, a list of JobSpecs or a SweepPlan from plan_sweep()")
    try:
        price, source = price_for((s.instance_type for s in specs), price_per_hour)
    except ValueError:
        price, source = float("nan"), "no price known for this instance type (pass price_per_hour)"
    est = default_estimate()
    return SweepPlan(tuple(_plan_job(s, price, est) for s in specs), price, source, est)


def format_cost_table(plan: SweepPlan) -> str:
    """The plan as text: one line per job and the total, with the price assumption spelled out."""
    df = plan.table()
    text = df.drop(columns="basis").to_string(index=False, na_rep="")
    basis = "\n".join(f"  {j.spec.model_label} {j.spec.precision} x{j.spec.instance_count}: {plan.estimate.basis(j.spec)}"
                      for j in plan.jobs)
    return (f"{text}\nprice: {plan.price_per_hour} USD per instance-hour ({plan.price_source})\n"
            f"{plan.estimate.describe()}\nwhat each estimate rests on:\n{basis}")


# ----------------------------------------------------------------------------------------------
# Redaction: nothing printed may carry an account id or a key
# ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _public_registry_accounts() -> frozenset[str]:
    """Account ids of AWS's public Deep Learning Container registries (part of every image URI)."""
    import sagemaker.core.image_uris as iu

    path = Path(iu.__file__).parent / "image_uri_config" / "pytorch.json"
    data = json.loads(path.read_text())
    out: set[str] = set()
    for scope in data.values():
        for v in scope.get("versions", {}).values():
            out.update(v.get("registries", {}).values())
    return frozenset(out)


# Where account ids appear in what the SDK and fp8lab print: ARNs, ECR hosts, the SDK's default
# bucket name. Plain numbers (a token count of 288000000000) are left alone.
_ACCOUNT = re.compile(r"(?P<pre>arn:aws[\w-]*:[\w-]*:[\w-]*:)(?P<id>\d{12})(?!\d)"
                      r"|(?<![\w-])(?P<id2>\d{12})(?P<post>\.dkr\.ecr\.)"
                      r"|(?P<pre3>sagemaker-[a-z]{2}(?:-[a-z]+)+-\d-)(?P<id3>\d{12})(?!\d)")
_KEY = re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")


def redact(text: str) -> str:
    """Replace account ids in ARNs, ECR hosts and default bucket names (except AWS's public image
    registries, part of every image URI) and access key ids by placeholders."""
    public = _public_registry_accounts()

    def sub(m: re.Match) -> str:
        if m.group("id"):
            return m.group("pre") + "<account-id>"
        if m.group("id2"):
            return m.group(0) if m.group("id2") in public else "<account-id>" + m.group("post")
        return m.group("pre3") + "<account-id>"

    return _KEY.sub("<access-key-id>", _ACCOUNT.sub(sub, text))


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), ()
        return True


@contextlib.contextmanager
def _redacted_sdk_logs() -> Iterator[None]:
    """While the SDK works for us, its log records (role ARNs, bucket names) are redacted."""
    from sagemaker.train import ModelTrainer  # noqa: F401  (import first: its loggers must exist to be filtered)

    flt = _RedactFilter()
    names = [n for n in logging.Logger.manager.loggerDict if n.split(".")[0] in ("sagemaker", "botocore", "boto3")]
    loggers = [logging.getLogger(n) for n in names]
    for lg in loggers:
        lg.addFilter(flt)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(flt)


# ----------------------------------------------------------------------------------------------
# Building the ModelTrainer
# ----------------------------------------------------------------------------------------------


def training_image(spec: JobSpec) -> str:
    """The AWS PyTorch training image for the spec's region and GPU, resolved offline from the SDK's tables."""
    from sagemaker.core import image_uris

    return image_uris.retrieve("pytorch", region=spec.region, version=spec.framework_version,
                               py_version=spec.py_version, instance_type=spec.instance_type, image_scope="training")


MODEL_CHANNEL = "model"  # input channel of a user's model folder
MODEL_CHANNEL_PATH = f"/opt/ml/input/data/{MODEL_CHANNEL}"


@contextlib.contextmanager
def _local_model(spec: JobSpec) -> Iterator[str]:
    """The ``--model`` value the plan validates: the name, the local folder, or for s3:// a temporary
    folder holding ``model_config`` as config.json (removed afterwards)."""
    if spec.model_config is None:
        yield spec.model
        return
    with tempfile.TemporaryDirectory(prefix="fp8lab-model-config-") as d:
        folder = Path(d) / spec.model_label
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(spec.model_config))
        yield str(folder)


LAYOUT_FIELDS = INT_FIELDS  # JobSpec fields the layout resolver fills in
LAYOUT_OPTIONS = tuple(f for f in AUTO_FIELDS if f not in INT_FIELDS)  # and trainer options it fills into JobSpec.options
# trainer options a job does not take from JobSpec.options: JobSpec fields, SageMaker's folders, test hooks
JOB_OWNED_OPTIONS = frozenset({"model", "precision", "backend", "recipe", "micro_batch_size", "grad_accum", "seq_len",
                               "lr", "seed", "fuse", "compile", "parallel", "activation_checkpointing", "progress",
                               "tokens", "steps", "checkpoint_every", "data", "output_dir", "checkpoint_dir",
                               "model_dir", "device", "dry_run", "inject_nan_at_steps"})


def _trainer_option_names() -> set[str]:
    from fp8lab.train import TrainConfig

    return {f.name for f in dataclasses.fields(TrainConfig)}


_hp_text = to_text  # a hyperparameter as the torchrun driver passes it (a string the trainer reads back)


def hyperparameters(spec: JobSpec) -> dict[str, Any]:
    """The trainer's CLI options; the torchrun driver passes each as ``--key value``.

    Layout options are the resolved values (``JobSpec`` replaced "auto" when it was made), plus
    everything in ``spec.options``; the set passed the trainer's own parser and start-up checks."""
    return _requested_hyperparameters(spec)


def _requested_hyperparameters(spec: JobSpec) -> dict[str, Any]:
    hp: dict[str, Any] = {
        "model": spec.model, "precision": spec.precision, "backend": spec.backend, "recipe": spec.recipe,
        "micro-batch-size": spec.micro_batch_size, "grad-accum": spec.grad_accum, "seq-len": spec.seq_len,
        "lr": spec.lr, "seed": spec.seed, "fuse": spec.fuse, "compile": spec.compile,
        "parallel": spec.parallel, "activation-checkpointing": spec.activation_checkpointing,
        "progress": "off",  # no tqdm bar in CloudWatch logs; the metric lines carry the progress
    }
    hp["tokens" if spec.tokens is not None else "steps"] = spec.tokens if spec.tokens is not None else spec.steps
    if spec.checkpoint_every:
        hp["checkpoint-every"] = spec.checkpoint_every
    if spec.data_s3_uri is not None:
        hp["data"] = "/opt/ml/input/data/train"  # the "train" channel (the trainer also reads SM_CHANNEL_TRAIN)
    if spec.is_folder_model:
        hp["model"] = MODEL_CHANNEL_PATH  # the "model" channel: the user's folder
    for name, value in spec.options.items():
        hp[name.replace("_", "-")] = value
    return hp


def s3_paths(spec: JobSpec) -> dict[str, str]:
    base = f"s3://{spec.bucket}/{spec.prefix}/{spec.study}"
    name = job_name(spec)
    return {"output": f"{base}/output", "checkpoints": f"{base}/checkpoints/{name}"}


def stage_source(dest: str | Path, install_te: bool = False) -> Path:
    """Lay out the code channel in ``dest``: the fp8lab package, the shipped corpus and tokenizers, requirements.txt.

    In the job ``fp8lab.paths.DATA_DIR`` resolves next to the package, so ``data/`` travels along:
    without a ``data_s3_uri`` the trainer reads the shipped corpus, as on a laptop.
    """
    from fp8lab.paths import DATA_DIR

    pkg = Path(__file__).resolve().parent
    dest = Path(dest)
    shutil.copytree(pkg, dest / "fp8lab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"),
                    dirs_exist_ok=True)
    (dest / "data").mkdir(parents=True, exist_ok=True)
    if (DATA_DIR / "corpus").is_dir():
        shutil.copytree(DATA_DIR / "corpus", dest / "data" / "corpus", dirs_exist_ok=True)
    for tok in sorted(DATA_DIR.glob("tokenizer*.json")):
        shutil.copy2(tok, dest / "data" / tok.name)
    reqs = list(JOB_REQUIREMENTS) + (["transformer-engine[pytorch]"] if install_te else [])
    (dest / "requirements.txt").write_text("".join(r + "\n" for r in reqs))
    return dest


def build_trainer(spec: JobSpec, source_dir: str | Path, session):
    """A ``ModelTrainer`` for one spec (nothing is called until ``train()``)."""
    from sagemaker.core.training.configs import (CheckpointConfig, Compute, MetricDefinition, OutputDataConfig,
                                                 SourceCode, StoppingCondition, Tag)
    from sagemaker.train import ModelTrainer
    from sagemaker.train.distributed import Torchrun

    if spec.max_run_s is None:
        spec = _plan_job(spec, 1.0, Estimate()).spec
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
        source_code=SourceCode(source_dir=str(source_dir), entry_script="fp8lab/sm_entry.py",
                               requirements="requirements.txt"),
        distributed=Torchrun(process_count_per_node=spec.info.gpus),
        compute=compute, stopping_condition=stopping,
        output_data_config=OutputDataConfig(s3_output_path=paths["output"], compression_type="GZIP"),
        checkpoint_config=CheckpointConfig(s3_uri=paths["checkpoints"], local_path=CHECKPOINT_LOCAL_PATH),
        hyperparameters=hyperparameters(spec),
        # Same for BF16 and FP8 jobs: only the precision hyperparameter differs.
        environment={"FP8LAB_STUDY": spec.study, "TOKENIZERS_PARALLELISM": "false"},
        tags=[Tag(key="fp8lab:job", value=job_name(spec)), Tag(key="fp8lab:study", value=spec.study),
              Tag(key="fp8lab:precision", value=spec.precision), Tag(key="fp8lab:model", value=spec.model_label)],
    )
    trainer.with_metric_definitions([MetricDefinition(name=k, regex=v) for k, v in METRIC_DEFINITIONS.items()])
    return trainer


def _input_data(spec: JobSpec):
    """The job's input channels: ``train`` (token data) and ``model`` (a user's model folder: an s3://
    prefix as it is, a local folder uploaded by the SDK under the job's input prefix)."""
    from sagemaker.core.training.configs import InputData

    channels = []
    if spec.data_s3_uri is not None:
        channels.append(InputData(channel_name="train", data_source=spec.data_s3_uri))
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


def _offline_session(region: str, bucket: str, stop_at_create: bool = True):
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
        if model.name == "CreateTrainingJob" and stop_at_create:
            raise _Captured(json.loads(json.dumps(params, default=str)))

    def on_call(model, **_):
        key = f"{model.service_model.service_name}.{model.name}"
        if key not in answers:
            raise RuntimeError(f"dry run: the SDK tried an unexpected AWS call {key}; nothing was sent")
        return _ok(answers[key](last_params.get(key, {})))

    boto.events.register("before-parameter-build.*.*", on_params)
    boto.events.register("before-call.*.*", on_call)
    config = {"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}}
    return Session(boto_session=boto, default_bucket=bucket, sagemaker_config=config)


def build_requests(spec_or_plan: JobSpec | SweepPlan | Sequence[JobSpec]) -> list[dict[str, Any]]:
    """The exact CreateTrainingJob request of each job, built by ModelTrainer.train() with no AWS call."""
    plan = _as_plan(spec_or_plan)
    out = []
    with tempfile.TemporaryDirectory(prefix="fp8lab-src-") as tmp, _redacted_sdk_logs():
        staged: dict[bool, Path] = {}
        for job in plan.jobs:
            spec = job.spec
            if spec.install_te not in staged:
                staged[spec.install_te] = stage_source(Path(tmp) / f"te{int(spec.install_te)}", spec.install_te)
            trainer = build_trainer(spec, staged[spec.install_te], _offline_session(spec.region, spec.bucket))
            try:
                trainer.train(input_data_config=_input_data(spec), wait=False, logs=False)
            except _Captured as cap:
                out.append(cap.params)
            else:  # pragma: no cover - the hook always fires
                raise RuntimeError("dry run: the SDK finished without sending CreateTrainingJob")
    return out


# ----------------------------------------------------------------------------------------------
# Launch, wait, collect
# ----------------------------------------------------------------------------------------------


def _code(err: Exception) -> str:
    return getattr(err, "response", {}).get("Error", {}).get("Code", "") if hasattr(err, "response") else ""


def call_with_backoff(fn: Callable[[], Any], *, sleep: Callable[[float], None] = time.sleep, attempts: int = 8,
                      base_s: float = 2.0, cap_s: float = 60.0, out: Callable[[str], None] = print) -> Any:
    """``fn()``, retried with exponential backoff while AWS answers with a throttling error."""
    from botocore.exceptions import ClientError

    for attempt in range(attempts):
        try:
            return fn()
        except ClientError as err:
            if _code(err) not in THROTTLE_CODES or attempt == attempts - 1:
                raise
            delay = min(cap_s, base_s * 2 ** attempt)
            out(f"throttled by AWS ({_code(err)}); retry {attempt + 1}/{attempts - 1} in {delay:.0f} s")
            sleep(delay)
    raise AssertionError("unreachable")


def _session(region: str, bucket: str | None = None):
    import boto3
    from sagemaker.core.helper.session_helper import Session

    return Session(boto_session=boto3.Session(region_name=region), default_bucket=bucket)


def _client(service: str, region: str | None, session=None):
    import boto3
    from botocore.config import Config

    boto = session.boto_session if session is not None else boto3.Session(region_name=region)
    # No botocore retries: call_with_backoff owns throttling, and says so in the output.
    return boto.client(service, config=Config(retries={"max_attempts": 1, "mode": "standard"}))


def find_existing(name: str, client, **backoff: Any) -> list[dict[str, Any]]:
    """SageMaker jobs created from plan name ``name`` (its SDK-timestamped variants), newest first."""
    pat = re.compile(re.escape(name) + r"-\d{14}")
    found, token = [], None
    while True:
        kw = {"NameContains": name, "MaxResults": 100, **({"NextToken": token} if token else {})}
        page = call_with_backoff(lambda: client.list_training_jobs(**kw), **backoff)
        found += [j for j in page.get("TrainingJobSummaries", []) if pat.fullmatch(j["TrainingJobName"])]
        token = page.get("NextToken")
        if not token:
            break
    return sorted(found, key=lambda j: j["TrainingJobName"], reverse=True)


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


def launch(spec_or_plan: JobSpec | SweepPlan | Sequence[JobSpec], dry_run: bool = True, *,
           skip_existing: bool = True, relaunch_failed: bool = True, session=None, show_requests: int | None = None,
           out: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Submit the plan's jobs (or, with ``dry_run``, print their requests and cost and call nothing).

    Re-running is safe: a job whose plan name already has a SageMaker job that is running or
    completed is skipped and its existing name returned (``relaunch_failed`` starts failed or
    stopped ones again). Returns the SageMaker job names, in plan order. ``show_requests``
    limits the dry run's full printouts (the others are shown as their differences to the first).
    """
    plan = _as_plan(spec_or_plan)
    if dry_run:
        requests = build_requests(plan)
        for i, (job, req) in enumerate(zip(plan.jobs, requests)):
            if show_requests is None or i < show_requests:
                out(f"--- CreateTrainingJob request for {job.name} (dry run: not sent) ---")
                out(redact(json.dumps(req, indent=2, sort_keys=True)))
            else:
                diff = request_diff(requests[0], req)
                out(f"--- {job.name}: as the first request except " + redact(json.dumps(diff, sort_keys=True)))
        out(format_cost_table(plan))
        out("dry run: nothing was uploaded or submitted. Launch with launch(plan, dry_run=False) "
            "(or `fp8lab launch launch ...`) with a real role ARN and bucket and AWS credentials.")
        return [r["TrainingJobName"] for r in requests]

    placeholders = [j.name for j in plan.jobs if j.spec.role == PLACEHOLDER_ROLE or j.spec.bucket == PLACEHOLDER_BUCKET]
    if placeholders:
        raise ValueError("launch(dry_run=False) needs a real role ARN and bucket; these jobs still use the "
                         f"placeholders {PLACEHOLDER_ROLE!r} / {PLACEHOLDER_BUCKET!r}: {', '.join(placeholders)}")
    backoff = {"sleep": sleep, "out": out}
    names: list[str] = []
    sessions: dict[tuple[str, str], Any] = {}
    with tempfile.TemporaryDirectory(prefix="fp8lab-src-") as tmp, _redacted_sdk_logs():
        staged: dict[bool, Path] = {}
        for job in plan.jobs:
            spec = job.spec
            key = (spec.region, spec.bucket)
            if session is not None:
                sessions.setdefault(key, session)
            elif key not in sessions:
                sessions[key] = _session(spec.region, spec.bucket)
            sess = sessions[key]
            sm = _client("sagemaker", spec.region, sess)
            existing = find_existing(job.name, sm, **backoff)
            live = [j for j in existing if skip_existing
                    and not (relaunch_failed and j["TrainingJobStatus"] in ("Failed", "Stopped"))]
            if live:
                out(f"skip {job.name}: already launched as {live[0]['TrainingJobName']} ({live[0]['TrainingJobStatus']})")
                names.append(live[0]["TrainingJobName"])
                continue
            if spec.install_te not in staged:
                staged[spec.install_te] = stage_source(Path(tmp) / f"te{int(spec.install_te)}", spec.install_te)
            trainer = build_trainer(spec, staged[spec.install_te], sess)
            call_with_backoff(lambda: trainer.train(input_data_config=_input_data(spec), wait=False, logs=False),
                              **backoff)
            # The SDK chose the timestamped name; read it back from SageMaker (public API only).
            before = {j["TrainingJobName"] for j in existing}
            created = [j["TrainingJobName"] for j in find_existing(job.name, sm, **backoff)
                       if j["TrainingJobName"] not in before]
            if not created:
                raise RuntimeError(f"launched {job.name} but SageMaker does not list it")
            out(f"launched {created[0]}  ({job.spec.model_label}, {job.spec.precision}, "
                f"{job.spec.instance_count} x {job.spec.instance_type})")
            names.append(created[0])
    return names


class TrainingJobFailed(RuntimeError):
    """One or more jobs ended Failed or Stopped; the message carries SageMaker's FailureReason."""


def _job_names(jobs: Iterable[str] | str) -> list[str]:
    names = [jobs] if isinstance(jobs, str) else list(jobs)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"expected SageMaker training job names (as returned by launch()), got {jobs!r}")
    return names


def wait(jobs: Iterable[str] | str, *, region: str | None = None, session=None, poll_s: float = 60.0,
         timeout_s: float | None = None, raise_on_failure: bool = True, progress: bool = True,
         out: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep):
    """Poll the jobs until all have ended; print status changes; return one row per job (DataFrame).

    Throttled DescribeTrainingJob calls back off and retry; a failed job's FailureReason is
    printed and, with ``raise_on_failure``, raised as :class:`TrainingJobFailed` once all have ended.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    names = _job_names(jobs)
    if poll_s < 0:
        raise ValueError(f"poll_s={poll_s!r} must be >= 0")
    sm = _client("sagemaker", region, session)
    backoff = {"sleep": sleep, "out": out}
    state: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    bar = tqdm(total=len(names), desc="jobs done", unit="job", disable=not progress)
    try:
        while True:
            for name in names:
                if name in state and state[name]["status"] in TERMINAL:
                    continue
                d = call_with_backoff(lambda: sm.describe_training_job(TrainingJobName=name), **backoff)
                start = d.get("TrainingStartTime") or d.get("CreationTime")
                end = d.get("TrainingEndTime") or datetime.now(timezone.utc)
                row = {"job": name, "status": d["TrainingJobStatus"], "secondary_status": d.get("SecondaryStatus", ""),
                       "elapsed_s": round((end - start).total_seconds()) if start else None,
                       "failure_reason": d.get("FailureReason", ""),
                       "billable_s": d.get("BillableTimeInSeconds")}
                old = state.get(name)
                if old is None or (old["status"], old["secondary_status"]) != (row["status"], row["secondary_status"]):
                    line = f"{name}: {row['status']} / {row['secondary_status']} (elapsed {row['elapsed_s']} s)"
                    if row["failure_reason"]:
                        line += f"\n  FailureReason: {row['failure_reason']}"
                    out(redact(line))
                    if row["status"] in TERMINAL:
                        bar.update(1)
                state[name] = row
            counts: dict[str, int] = {}
            for r in state.values():
                counts[r["status"]] = counts.get(r["status"], 0) + 1
            bar.set_postfix_str(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
            if all(r["status"] in TERMINAL for r in state.values()):
                break
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"wait: jobs still running after {timeout_s} s: "
                                   + ", ".join(n for n, r in state.items() if r["status"] not in TERMINAL))
            sleep(poll_s)
    finally:
        bar.close()
    table = pd.DataFrame([state[n] for n in names])
    bad = table[table["status"] != "Completed"]
    if raise_on_failure and len(bad):
        raise TrainingJobFailed(redact("; ".join(f"{r.job} {r.status}: {r.failure_reason or 'no reason given'}"
                                                 for r in bad.itertuples())))
    return table


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _metrics_from_tar(s3, uri: str) -> list[dict[str, Any]] | None:
    """metrics.jsonl from a .tar.gz in S3, streamed (never the whole archive in memory)."""
    from botocore.exceptions import ClientError

    bucket, key = _split_s3(uri)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    except ClientError as err:
        if _code(err) in ("NoSuchKey", "404", "AccessDenied"):
            return None
        raise
    with tarfile.open(fileobj=body, mode="r|gz") as tar:
        for member in tar:
            if member.isfile() and Path(member.name).name == "metrics.jsonl":
                text = tar.extractfile(member).read().decode()
                return [json.loads(line) for line in text.splitlines() if line.strip()]
    return None


def _metrics_from_logs(logs, name: str, **backoff: Any) -> list[dict[str, Any]]:
    """Per-step metrics parsed from the job's CloudWatch log streams (the trainer's metric lines)."""
    from botocore.exceptions import ClientError

    rows, token = [], None
    while True:
        kw = {"logGroupName": "/aws/sagemaker/TrainingJobs", "logStreamNamePrefix": f"{name}/",
              "filterPattern": '"fp8lab-metrics"', **({"nextToken": token} if token else {})}
        try:
            page = call_with_backoff(lambda: logs.filter_log_events(**kw), **backoff)
        except ClientError as err:
            if _code(err) == "ResourceNotFoundException":
                return rows
            raise
        for ev in page.get("events", []):
            parsed = parse_metric_line(ev["message"])
            if parsed:
                rows.append(parsed)
        token = page.get("nextToken")
        if not token:
            return rows


def collect(jobs: Iterable[str] | str, *, region: str | None = None, session=None,
            out: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep):
    """Per-step metrics of the jobs as one DataFrame (column ``job``, ``source`` says where each row came from).

    Reads the trainer's ``metrics.jsonl`` from the job's ``output.tar.gz`` (then ``model.tar.gz``);
    for a job without it (e.g. stopped early) falls back to the metric lines in CloudWatch Logs.
    """
    import pandas as pd

    names = _job_names(jobs)
    sm, s3, logs = (_client(s, region, session) for s in ("sagemaker", "s3", "logs"))
    backoff = {"sleep": sleep, "out": out}
    frames = []
    for name in names:
        d = call_with_backoff(lambda: sm.describe_training_job(TrainingJobName=name), **backoff)
        candidates = []
        out_path = d.get("OutputDataConfig", {}).get("S3OutputPath", "").rstrip("/")
        if out_path:
            candidates.append(("s3:output.tar.gz", f"{out_path}/{name}/output/output.tar.gz"))
        model_uri = d.get("ModelArtifacts", {}).get("S3ModelArtifacts")
        if model_uri:
            candidates.append(("s3:model.tar.gz", model_uri))
        rows, source = None, None
        for source, uri in candidates:
            rows = _metrics_from_tar(s3, uri)
            if rows:
                break
        if not rows:
            source, rows = "cloudwatch-logs", _metrics_from_logs(logs, name, **backoff)
        if not rows:
            out(f"{name}: no metrics found (no metrics.jsonl in S3, no metric lines in CloudWatch Logs)")
            continue
        df = pd.DataFrame(rows)
        hp = d.get("HyperParameters", {})
        for col in ("model", "precision"):
            if col not in df and col in hp:
                df[col] = hp[col]
        df.insert(0, "job", name)
        df["instance_count"] = d.get("ResourceConfig", {}).get("InstanceCount")
        df["source"] = source
        frames.append(df)
        out(f"{name}: {len(df)} steps from {source}")
    if not frames:
        return pd.DataFrame(columns=["job", "step", "source"])
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------------------------
# CLI: fp8lab launch {plan,dry-run,launch,wait,collect}
# ----------------------------------------------------------------------------------------------


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["llama-1b", "llama-7b"])
    p.add_argument("--precisions", nargs="+", default=["bf16", "fp8"], choices=PRECISIONS)
    p.add_argument("--instance-counts", nargs="+", type=int, default=[1, 2, 4])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tokens", type=parse_count, help="training tokens per job, e.g. 1e9 (default 1e9 unless --steps)")
    g.add_argument("--steps", type=parse_count, help="optimizer steps per job (instead of --tokens)")
    p.add_argument("--instance-type", default="ml.p5.48xlarge", choices=sorted(INSTANCES))
    p.add_argument("--role", default=PLACEHOLDER_ROLE, help="SageMaker execution role ARN")
    p.add_argument("--bucket", default=PLACEHOLDER_BUCKET)
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--price-per-hour", type=float, help="USD per instance-hour (default: see PRICE_SOURCE)")
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--spot", action="store_true")
    p.add_argument("--install-te", action="store_true")
    p.add_argument("--allow-large", action="store_true",
                   help=f"allow more than {MAX_INSTANCES_PER_JOB} instances per job (a sanity limit against typos)")


def _plan_from(args: argparse.Namespace) -> SweepPlan:
    size = ({"tokens": args.tokens} if args.tokens is not None else
            {"steps": args.steps} if args.steps is not None else {"tokens": 10**9})
    return plan_sweep(args.models, args.precisions, args.instance_counts, price_per_hour=args.price_per_hour,
                      instance_type=args.instance_type, role=args.role, bucket=args.bucket, region=args.region,
                      micro_batch_size=args.micro_batch_size, seq_len=args.seq_len, spot=args.spot,
                      install_te=args.install_te, allow_large=args.allow_large, **size)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="fp8lab launch", description="BF16 vs FP8 sweeps as SageMaker jobs.")
    sub = parser.add_subparsers(dest="action", required=True)
    for action, help_ in (("plan", "show jobs, names, time and cost"),
                          ("dry-run", "print each exact CreateTrainingJob request; call nothing"),
                          ("launch", "submit the jobs (skips ones already launched)")):
        _plan_args(sub.add_parser(action, help=help_))
    for action in ("wait", "collect"):
        p = sub.add_parser(action, help=f"{action} for jobs by name")
        p.add_argument("jobs", nargs="+")
        p.add_argument("--region", default=None)
        if action == "wait":
            p.add_argument("--poll-s", type=float, default=60.0)
        else:
            p.add_argument("--csv", help="write the table here")
    args = parser.parse_args(argv)
    try:
        if args.action in ("plan", "dry-run", "launch"):
            plan = _plan_from(args)
            if args.action == "plan":
                print(format_cost_table(plan))
            else:
                for name in launch(plan, dry_run=args.action == "dry-run"):
                    print(name)
        elif args.action == "wait":
            print(wait(args.jobs, region=args.region, poll_s=args.poll_s).to_string(index=False))
        else:
            if args.csv:
                check_writable_file("--csv", args.csv)
            df = collect(args.jobs, region=args.region)
            if args.csv:
                df.to_csv(args.csv, index=False)
            print(df.tail(20).to_string(index=False))
    except (ValueError, TrainingJobFailed, TimeoutError) as exc:
        print(f"fp8lab launch: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
