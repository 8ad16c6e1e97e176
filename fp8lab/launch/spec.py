"""``JobSpec``: one SageMaker training job, validated on construction, and the trainer options it becomes.

A spec is the trainer's options (``TrainConfig``'s fields, with ``TrainConfig``'s defaults except
those in ``JOB_DEFAULTS``) plus where and how the job runs (instance, S3, limits). It is checked
field by field, then planned like the trainer plans a run (``fp8lab.plan.runplan.plan_run``) for the
instance's GPU at 8 x instance_count ranks: ``spec.plan`` is that ``RunPlan``. Nothing planned is
written back into the spec, so ``dataclasses.replace(spec, model="llama-7b")`` plans the 7B job
afresh. Here too: the option vocabularies and limits a spec is checked against, the deterministic
job name (``job_name``) and the trainer's command line as SageMaker hyperparameters
(``hyperparameters``: the plan's decisions spelled out, so the job runs what was planned).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from fp8lab.launch import image, limits
from fp8lab.launch.image import te_release
from fp8lab.core.hardware import (INSTANCES, PLACEHOLDER_BUCKET, PLACEHOLDER_ROLE, SAGEMAKER_TENSORBOARD_DIR,
                                  InstanceInfo,
                                  Machine, at_least)
from fp8lab.fp8.recipe import TABLE as RECIPE_TABLE
from fp8lab.model import user as user_model
from fp8lab.records import data_format
from fp8lab.model.models import MODEL_CONFIGS, config_from_hf, get_config
from fp8lab.plan.layout import AUTO_FIELDS
from fp8lab.plan.options import HARDWARE_BACKENDS, PARALLEL, PRECISIONS, RECIPE_KINDS  # the trainer's vocabularies
from fp8lab.plan.config import TrainConfig, option_problem, recipe_problem  # trainer options: the trainer's own checks
from fp8lab.plan import runplan  # runplan.plan_run looked up at call time (tests count its calls)
from fp8lab.core.validate import AUTO, NONNEG_INT, is_count, one_of, whole_number

# ----------------------------------------------------------------------------------------------
# Option vocabularies and limits
# ----------------------------------------------------------------------------------------------

BACKENDS = (AUTO, *HARDWARE_BACKENDS)  # auto (TE on the instance's GPU), or FP8 on tensor cores (not the emulator)
RECIPES = (AUTO, *RECIPE_KINDS)
SOURCE_NAME_MAX = 48  # 63 (SageMaker limit) - 15 for the SDK's "-YYYYmmddHHMMSS"
MAX_RUNTIME_CAP_S = limits.MAX_RUNTIME_S  # SageMaker's longest training job
# A sanity cap on instances per job: more than a typical regional P5 quota; a typo there (1000 for 10)
# costs real money, so planning beyond it needs allow_large=True (CLI: --allow-large)
MAX_INSTANCES_PER_JOB = 64


# ----------------------------------------------------------------------------------------------
# JobSpec
# ----------------------------------------------------------------------------------------------

_TRAINER_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
# where a job's default differs from ``fp8lab train``'s, and why (every other trainer option: TrainConfig's default)
JOB_DEFAULTS = {
    # auto: FSDP2 where the job has several GPUs (it shards the model states: a 7B model with AdamW does not fit DDP
    # on P5), DDP where it has one (ml.p5.4xlarge: nothing to shard over); job_parallel
    "parallel": AUTO,
}
JOB_PARALLEL = (AUTO, *PARALLEL)


def job_parallel(parallel: str, world_size: int) -> str:
    """The trainer's --parallel of a job: ``auto`` is fsdp on several GPUs and ddp (one process: plain) on one."""
    if parallel != AUTO:
        return parallel
    return "fsdp" if world_size > 1 else "ddp"


def _default(name: str) -> Any:
    """A trainer option's default in a JobSpec: the job's own (JOB_DEFAULTS) or TrainConfig's."""
    return JOB_DEFAULTS.get(name, _TRAINER_DEFAULTS[name])


def _model_names() -> list[str]:
    return list(MODEL_CONFIGS)


@functools.lru_cache(maxsize=None)  # static data shipped with botocore; loading it costs ~0.4 s
def _sagemaker_regions() -> tuple[str, ...]:
    import botocore.session

    return tuple(botocore.session.get_session().get_available_regions("sagemaker"))


def sdk_config_file(name: str) -> Path | None:
    """A data file the SageMaker SDK ships (``sagemaker/core/image_uri_config/<name>``), found without
    importing the SDK (importing it takes seconds; only building or sending a request needs it)."""
    import importlib.util

    spec = importlib.util.find_spec("sagemaker")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "core" / "image_uri_config" / name
        if path.exists():
            return path
    return None


@functools.lru_cache(maxsize=None)
def _instance_region_table() -> dict[str, frozenset[str]]:
    """The SDK's own table of GPU instance types per region (instance_gpu_info.json)."""
    path = sdk_config_file("instance_gpu_info.json")
    if path is None:
        return {}
    try:
        return {r: frozenset(types) for r, types in json.loads(path.read_text()).items()}
    except OSError:
        return {}


def _known_regions(instance_type: str) -> set[str] | None:
    """Regions where the SDK's table lists ``instance_type``; None when the table does not say."""
    regions = {r for r, types in _instance_region_table().items() if instance_type in types}
    return regions or None


# a container image reference: registry host, repository path, then a tag or a digest
IMAGE_URI = re.compile(r"[a-z0-9.\-]+(:\d+)?/[a-z0-9._/\-]+(:[A-Za-z0-9_.\-]{1,128}|@sha256:[0-9a-f]{64})")


def _bad(name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"JobSpec.{name}={value!r} is invalid; allowed: {allowed}")


@dataclass(frozen=True)
class JobSpec:
    """One training job: what to train, on what, for how long, and where results go.

    Validated on construction, so a bad sweep fails before any upload or cloud call.
    """

    # a name in fp8lab.model.models.MODEL_CONFIGS, a local model folder (config.json + optional *.safetensors) or
    # s3://... of one
    model: str
    precision: str = "bf16"  # "bf16" or "fp8"
    role: str = ""  # SageMaker execution role ARN (required)
    bucket: str = ""  # S3 bucket for code, outputs and checkpoints (required)
    backend: str = _default("backend")  # auto: TE (FP8 on, or off for BF16: both run the same layers); or te | torchao
    # FP8 scaling recipe (fp8lab.fp8.recipe kinds; auto: the backend's); a kind's row says the GPU it needs
    recipe: str = _default("recipe")
    instance_type: str = "ml.p5.48xlarge"
    instance_count: int = 1
    tokens: int | None = _default("tokens")  # training tokens over all GPUs; exactly one of tokens / steps
    steps: int | None = _default("steps")
    # auto: fp8lab.plan.layout for the instance's GPU (spec.plan)
    micro_batch_size: int | str = _default("micro_batch_size")
    grad_accum: int | str = _default("grad_accum")  # auto: fp8lab.plan.layout's tokens-per-step target
    # auto: 2048; a named Llama shape trains longer from scratch (fp8lab.model.models.sequence_overrides)
    seq_len: int | str = _default("seq_len")
    lr: float = _default("lr")
    fuse: bool | str = _default("fuse")  # fused TE modules (LayerNormLinear / LayerNormMLP); auto: fused
    compile: bool = _default("compile")  # torch.compile each block
    parallel: str = _default("parallel")  # auto (fsdp on several GPUs, ddp on one: job_parallel) | ddp | fsdp (FSDP2)
    # auto: on where nothing fits without it (fp8lab.plan.layout)
    activation_checkpointing: bool | str = _default("activation_checkpointing")
    seed: int = _default("seed")
    # steps between checkpoints to /opt/ml/checkpoints (0 = only at the end)
    checkpoint_every: int = _default("checkpoint_every")
    data_s3_uri: str | None = None  # token data for the "train" channel; None = the trainer's default data
    # or a local file or folder for the "train" channel (text, instruction JSONL for options={"task": "sft"}, or a
    # prepared folder), uploaded by the SDK; checked as the trainer checks --data before anything is uploaded
    data: str | None = None
    spot: bool = False  # managed spot training (checkpoints make it resumable)
    max_run_s: int | None = None  # None = from the plan's time estimate (x2 + 1 h)
    max_wait_s: int | None = None  # spot only: max_run + waiting for capacity; None = 2 x max_run
    keep_alive_s: int = 0  # warm pool: keep instances this long for the next job (0 = off)
    volume_gb: int = 200
    prefix: str = "fp8lab"  # S3 key prefix under the bucket
    study: str = "p5-sweep"  # groups the jobs (tag and S3 folder)
    region: str = "us-east-1"
    # PyTorch training image (AWS Deep Learning Container; fp8lab.launch.image.IMAGES)
    framework_version: str = image.DEFAULT_VERSION
    py_version: str = "py312"  # the SDK-resolved pytorch-training images (2.8, 2.9) only
    # always install the pinned TE in the job (it does anyway where the image's TE is too old or unknown:
    # fp8lab.launch.image)
    install_te: bool = False
    image_uri: str | None = None  # any other training image by its full URI (framework_version is then not used)
    # options={"tracker": "mlflow"}: the job's MLFLOW_TRACKING_URI (SageMaker's managed MLflow: the tracking server's
    # ARN); None: a local store in the job's output
    mlflow_tracking_uri: str | None = None
    # s3:// model only: its config.json contents (the plan validates them; nothing is read from S3)
    model_config: dict | None = None
    # any other trainer option by TrainConfig name, e.g. {"param_dtype": "bf16", "fsdp_keep_weights": True}
    options: dict = dataclasses.field(default_factory=dict)
    allow_large: bool = False  # permit instance_count above MAX_INSTANCES_PER_JOB (not part of the job's identity)

    def __post_init__(self) -> None:
        bad = _bad
        for name in ("tokens", "steps"):  # 1e9 is a count, as on the command line (fp8lab.core.validate.parse_count)
            object.__setattr__(self, name, whole_number(getattr(self, name)))

        self._check_model(bad)
        self._check_options(bad)
        self._check_instance(bad)
        self._check_run_limits(bad)
        self._check_aws(bad)
        self._plan_with_trainer()
        self._check_data(bad)

    def _check_options(self, bad: Callable[[str, Any, str], ValueError]) -> None:
        """The trainer options: vocabularies, the trainer's own per-option checks, and the recipe."""
        for name, choices in (("precision", PRECISIONS), ("backend", BACKENDS), ("parallel", JOB_PARALLEL)):
            if not one_of(choices)(getattr(self, name)):
                raise bad(name, getattr(self, name), ", ".join(choices))
        for name in (*LAYOUT_FIELDS, "tokens", "steps", "seed", "lr", "fuse", "compile"):
            if (allowed := option_problem(name, getattr(self, name))) is not None:
                raise bad(name, getattr(self, name), allowed)
        if (why := recipe_problem(self.recipe)) is not None:
            raise ValueError(f"JobSpec.recipe={self.recipe!r} is invalid{why}")
        if self.image_uri is not None:
            if not isinstance(self.image_uri, str) or not IMAGE_URI.fullmatch(self.image_uri):
                raise bad("image_uri", self.image_uri, "None (the table's image) or a container image URI like "
                          "<registry>/<repository>:<tag> or <registry>/<repository>@sha256:<digest>")
        elif self.framework_version not in image.IMAGES:
            raise bad("framework_version", self.framework_version,
                      ", ".join(image.IMAGES) + " (fp8lab.launch.image.IMAGES), or pass image_uri= for another image")

    def _check_instance(self, bad: Callable[[str, Any, str], ValueError]) -> None:
        """The instance type (and whether its GPU can run the precision and recipe) and the instance count."""
        if self.instance_type not in INSTANCES:
            raise bad("instance_type", self.instance_type, ", ".join(INSTANCES))
        info = INSTANCES[self.instance_type]
        if self.precision == "fp8" and not info.fp8:
            fp8_types = ", ".join(k for k, v in INSTANCES.items() if v.fp8)
            raise ValueError(
                f"JobSpec.precision='fp8' needs FP8 tensor cores, which {self.instance_type} ({info.gpu}) "
                f"does not have; use one of: {fp8_types}"
            )
        kind = RECIPE_TABLE.get(self.recipe.partition(":")[0])  # the kind's row: the GPU generation it needs
        if self.precision == "fp8" and kind is not None and not at_least(info.generation, kind.needs):
            raise ValueError(f"JobSpec.recipe={self.recipe.partition(':')[0]!r} needs {kind.needs.title()} GPUs; "
                             f"{self.instance_type} has {info.gpu}")
        if not is_count(self.instance_count):
            raise bad("instance_count", self.instance_count, "an integer >= 1")
        if self.parallel == "fsdp" and self.world_size == 1:
            raise bad("parallel", self.parallel, f"auto or ddp: {self.instance_type} has one GPU, so one instance has "
                      "nothing to shard over (FSDP needs several GPUs)")
        if (allowed := limits.volume_problem(self.volume_gb)) is not None:
            raise bad("volume_gb", self.volume_gb, allowed)
        if not isinstance(self.allow_large, bool):
            raise bad("allow_large", self.allow_large, "True or False")
        if self.instance_count > MAX_INSTANCES_PER_JOB and not self.allow_large:
            raise bad("instance_count", self.instance_count,
                      f"1..{MAX_INSTANCES_PER_JOB} per job (a sanity limit); to plan more, pass allow_large=True "
                      "(CLI: --allow-large) after checking your SageMaker quota")

    def _check_run_limits(self, bad: Callable[[str, Any, str], ValueError]) -> None:
        """The job's length and timing: tokens or steps, checkpoints, run/wait limits, warm pool and spot."""
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

    def _check_aws(self, bad: Callable[[str, Any, str], ValueError]) -> None:
        """Where the job runs and writes: role, bucket, prefix, study, data URI and region."""
        if not self.role:
            raise ValueError("JobSpec.role is missing: pass your SageMaker execution role ARN "
                             f"(for a dry run without an account: {PLACEHOLDER_ROLE!r})")
        if not re.fullmatch(r"arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+", self.role):
            raise bad("role", self.role, "an IAM role ARN like arn:aws:iam::<12-digit account>:role/<name>")
        if not self.bucket:
            raise ValueError("JobSpec.bucket is missing: pass an S3 bucket name "
                             f"(for a dry run without an account: {PLACEHOLDER_BUCKET!r})")
        if (allowed := limits.bucket_problem(self.bucket)) is not None:
            raise bad("bucket", self.bucket, allowed)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_\-/]*", self.prefix) or self.prefix.endswith("/"):
            raise bad("prefix", self.prefix, "an S3 key prefix of letters, digits, - _ / (no leading or trailing /)")
        if not re.fullmatch(r"[a-z0-9][a-z0-9\-]{0,40}", self.study):
            raise bad("study", self.study, "lowercase letters, digits and -, at most 41 characters")
        if self.mlflow_tracking_uri is not None and (
                not isinstance(self.mlflow_tracking_uri, str) or not self.mlflow_tracking_uri.strip()
                or (self.options if isinstance(self.options, dict) else {}).get("tracker") != "mlflow"):
            raise bad("mlflow_tracking_uri", self.mlflow_tracking_uri, "None, or with options={'tracker': 'mlflow'} "
                      "the job's MLflow tracking URI (e.g. a SageMaker MLflow tracking server's ARN)")
        if self.data_s3_uri is not None and (allowed := limits.s3_uri_problem(self.data_s3_uri)) is not None:
            raise bad("data_s3_uri", self.data_s3_uri, allowed + ", or None")
        regions = _sagemaker_regions()
        if self.region not in regions:
            raise bad("region", self.region, "a region where SageMaker runs: " + ", ".join(regions))
        known = _known_regions(self.instance_type)
        # Only a region the table describes can be said to lack the type; unknown regions pass.
        if known is not None and self.region not in known and self.region in _instance_region_table():
            raise ValueError(f"JobSpec.region={self.region!r}: {self.instance_type} is not offered there "
                             f"(SageMaker SDK instance table); choose one of: {', '.join(sorted(known))}")

    def _check_model(self, bad: Callable[[str, Any, str], ValueError]) -> None:
        """A named model, a local folder (its config.json read and checked) or s3:// with ``model_config``.

        A folder model reaches the job as the input channel ``model`` (the SDK uploads a local folder;
        an s3:// prefix is mounted as it is) and the trainer runs ``--model /opt/ml/input/data/model``.
        For s3:// the plan cannot read the config, so ``model_config`` (the config.json contents, as a
        dict) is required: it is validated like a folder's and gives the FLOPs and memory estimates."""
        models = _model_names()
        allowed = (", ".join(models) + ", a local model folder (config.json + optional *.safetensors) or an s3:// URI "
                   "of one")
        if not isinstance(self.model, str) or not self.model:
            raise bad("model", self.model, allowed)
        if self.model.startswith("s3://"):
            if (why := limits.s3_uri_problem(self.model)) is not None:
                raise bad("model", self.model, why + " of a model folder")
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

    def _check_data(self, bad: Callable[[str, Any, str], ValueError]) -> None:
        """A local ``data``: an existing file or folder (never with ``data_s3_uri``), read as the trainer reads --data
        for the job's task (every instruction record for sft; the model folder's tokenizer fits its embedding), so bad
        data stops the plan, not the job after its instances started."""
        if self.data is None:
            return
        allowed = ("None, or a local file or folder for the train channel (text, instruction .jsonl with "
                   "options={'task': 'sft'}, or a folder from fp8lab prepare-data); an s3:// URI goes in data_s3_uri")
        if not isinstance(self.data, str) or not self.data or self.data.startswith(("s3://", "hf:")):
            raise bad("data", self.data, allowed)
        if self.data_s3_uri is not None:
            raise ValueError("JobSpec: data and data_s3_uri both name the train channel; give one of them")
        if not Path(self.data).exists():
            raise bad("data", self.data, allowed + " (nothing exists at that path)")
        c = self.plan.config
        with _local_model(self) as local:
            try:
                from fp8lab.data import run_data  # numpy and tokenizers: off the plan's import path (torch-free)

                run_data.check_source(self.data, c.task, local, self.plan.model_config.vocab_size,
                                      option="JobSpec.data")
            except ValueError as exc:
                raise ValueError(f"JobSpec({self.model_label}, {self.precision}): {exc}") from None

    @functools.cached_property  # reads the data once (a digest of every file)
    def data_identity(self) -> str | dict | None:
        """A local ``data`` by content, not by where it sits on this machine: a prepared folder's identity
        (fp8lab.data.tokens.identity), else its files' names and SHA-256; None without local data."""
        if self.data is None:
            return None
        from fp8lab.data import tokens as fdata  # numpy: off the plan's import path (torch-free)

        if data_format.is_prepared(self.data):
            return fdata.identity(fdata.read_manifest(self.data))
        return fdata.describe_source(self.data)

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

    @functools.cached_property  # a frozen dataclass: written straight into __dict__
    def model_cfg(self):
        """fp8lab's ModelConfig of the job's model (named, folder or model_config), built once."""
        if self.model_config is not None:
            return config_from_hf(user_model.check_config_dict(self.model_config, "JobSpec.model_config"))
        return get_config(self.model)

    def _plan_with_trainer(self) -> None:
        """Plan this job as the trainer plans a run (fp8lab.plan.runplan.plan_run), for the instance's GPU at
        8 x instance_count ranks; a job the trainer would refuse is refused here. The plan is kept
        (``spec.plan``); no field of the spec changes."""
        if not isinstance(self.options, dict):
            raise ValueError(f"JobSpec.options={self.options!r} is invalid; allowed: a dict of trainer options")
        unknown = sorted(set(self.options) - set(_TRAINER_DEFAULTS))
        reserved = sorted(set(self.options) & JOB_OWNED_OPTIONS)
        if unknown or reserved:
            raise ValueError(f"JobSpec.options: {', '.join(unknown + reserved)} "
                             + ("not trainer options" if unknown else "set by JobSpec itself or by SageMaker")
                             + f"; allowed: {', '.join(sorted(set(_TRAINER_DEFAULTS) - JOB_OWNED_OPTIONS))}")
        try:
            with _local_model(self) as local:  # the model channel's path exists only inside the job
                machine = Machine.planned(self.info.gpu, self.world_size, self.info.fp8,
                                          te_release=te_release(self.install_te, self.framework_version),
                                          host_memory_gib=self.info.host_gib_per_gpu)
                plan = runplan.plan_run(self.trainer_config(model=local), machine)
        except ValueError as exc:
            raise ValueError(f"JobSpec({self.model_label}, {self.precision}, {self.instance_count} x "
                             f"{self.instance_type}): the trainer would refuse this job: {exc}") from None
        object.__setattr__(self, "_plan", plan)  # derived, not a field: replace() plans again

    def trainer_config(self, **override: Any) -> TrainConfig:
        """The trainer options this job requests (its TrainConfig; "auto" as given), ``override`` applied."""
        kw = {name: getattr(self, name) for name in SPEC_OPTIONS}
        kw["parallel"] = job_parallel(self.parallel, self.world_size)
        kw.update(tokens=self.tokens, steps=self.steps, checkpoint_every=self.checkpoint_every, progress="off",
                  **self.options)
        return TrainConfig(**{**kw, **override})

    @property
    def plan(self):
        """The fp8lab.plan.runplan.RunPlan of this job on its instance: what the trainer will decide there."""
        return self._plan

    def with_time_limit(self, max_run_s: int) -> "JobSpec":
        """This job with ``max_run_s`` set (checked as the field is) and its plan kept: a time limit is no
        trainer decision, so nothing is planned again (``dataclasses.replace`` would plan afresh)."""
        new = copy.copy(self)
        object.__setattr__(new, "max_run_s", max_run_s)
        new._check_run_limits(_bad)
        return new

    @property
    def layout(self):
        """The fp8lab.plan.layout.Layout the job runs (memory estimate and reasons included)."""
        return self._plan.layout

    @property
    def builds_te(self) -> bool:
        """Whether the job compiles TE at start-up (fp8lab.launch.image.installs_te): the estimates add its time."""
        return image.installs_te(self)

    @property
    def info(self) -> InstanceInfo:
        return INSTANCES[self.instance_type]

    @property
    def world_size(self) -> int:
        return self.instance_count * self.info.gpus

    @property
    def tokens_per_step(self) -> int:
        return self._plan.tokens_per_step

    @property
    def total_tokens(self) -> int:
        return self.tokens if self.tokens is not None else self.steps * self.tokens_per_step

    def identity(self) -> dict[str, Any]:
        """The fields that define the experiment (not where it is stored or who pays), for the name hash.

        A local folder model counts by its config.json's hash and, when it has weights, a SHA-256 of
        the weight files' bytes (fp8lab.model.checks.weights_digest), not by where it sits."""
        skip = {"role", "bucket", "prefix", "region", "keep_alive_s", "max_wait_s", "study", "allow_large",
                "mlflow_tracking_uri"}
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}
        out.update(_planned_options(self))  # what runs ("auto" as the plan resolved it), so equal jobs get equal names
        if self.model_config is None:
            out.pop("model_config")  # named models: the identity (and job names) as before
        if self.image_uri is None:
            out.pop("image_uri")  # the table's image: framework_version names it
        if self.data is None:
            out.pop("data")  # jobs without local data: the identity (and job names) as before
        else:
            out["data"] = self.data_identity
        if self.is_folder_model and not self.model.startswith("s3://"):
            out["model"] = user_model.identity(self.model)  # the config, not where the folder sits on this machine
            weights = user_model.weights_digest(self.model)  # and the weights: same config, other weights, other job
            if weights is not None:
                out["weights"] = weights
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
# The trainer options a job carries (SageMaker hyperparameters)
# ----------------------------------------------------------------------------------------------


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


# JobSpec fields that are trainer options of the same name, passed as they are (hyperparameters())
SPEC_OPTIONS = ("model", "precision", "backend", "recipe", "micro_batch_size", "grad_accum", "seq_len", "lr", "seed",
                "fuse", "compile", "parallel", "activation_checkpointing")
# JobSpec fields the layout resolver decides (spec.plan.layout)
LAYOUT_FIELDS = tuple(f for f in AUTO_FIELDS if f in SPEC_OPTIONS)
# and trainer options it decides (passed as options)
LAYOUT_OPTIONS = tuple(f for f in AUTO_FIELDS if f not in SPEC_OPTIONS)
# trainer options a job does not take from JobSpec.options: those fields, the run length and checkpoints (also
# JobSpec fields), SageMaker's folders and channels, the log style, test hooks
JOB_OWNED_OPTIONS = frozenset(SPEC_OPTIONS) | {"progress", "tokens", "steps", "checkpoint_every", "data", "output_dir",
                                              "checkpoint_dir", "model_dir", "device", "dry_run", "inject_nan_at_steps",
                                              "tracker_dir"}  # the tracker writes where SageMaker collects it


def _planned_options(spec: JobSpec) -> dict[str, Any]:
    """The job's fields and options with the plan's decisions for "auto": the backend, the recipe, the layout
    (activation checkpointing included) and CUDA graphs."""
    plan = spec.plan
    c = plan.config  # the request as planned (a model folder stands in for an s3:// model)
    # a backend's default is its kind
    recipe = c.recipe if c.recipe != AUTO or plan.recipe is None else plan.recipe.kind
    # the layout's "auto" (micro-batch, activation checkpointing, ...) is decided from the memory a machine has
    # too: the job carries the launch's values, explicit, so the instance re-plans nothing of it
    layout = {name: getattr(plan.layout, name) for name in LAYOUT_FIELDS}
    # CUDA graphs "auto" is decided from the memory a machine has: the instance, detecting its own,
    # could decide otherwise near the limit and refuse the job after it started. It runs the launch's.
    graphs = {"cuda_graphs": "on" if plan.graphs.active else "off"} if c.cuda_graphs == AUTO else {}
    # the fused loss follows the layout's micro-batch (decided above from the launch's memory): carried too
    fused = {"fused_loss": "on" if plan.fused_loss else "off"} if c.fused_loss == AUTO else {}
    # the memory mode follows the memory the launch planned for: carried as well, as is a BF16 LM head the layout
    # chose (fp8lab.plan.layout.resolve; the same for both runs of a pair, so their jobs differ only in precision)
    memory = {"memory": plan.memory_mode} if c.memory == AUTO else {}
    head = {"fp8_lm_head": False} if c.fp8_lm_head == AUTO and not plan.layout.fp8_head else {}
    return {"backend": plan.backend_label, "recipe": recipe, "parallel": c.parallel, **layout,
            "options": {**spec.options, **{k: getattr(plan.layout, k) for k in LAYOUT_OPTIONS}, **graphs, **fused,
                        **memory, **head}}


def hyperparameters(spec: JobSpec) -> dict[str, Any]:
    """The trainer's CLI options; the torchrun driver passes each as ``--key value``.

    What the plan decided for the instance (``spec.plan``: backend, recipe and layout instead of
    "auto"), plus everything in ``spec.options``: the job runs what was planned."""
    planned = _planned_options(spec)
    values = {name: planned.get(name, getattr(spec, name)) for name in SPEC_OPTIONS}
    hp: dict[str, Any] = {name.replace("_", "-"): value for name, value in values.items()}
    hp["progress"] = "off"  # no tqdm bar in CloudWatch logs; the metric lines carry the progress
    hp["tokens" if spec.tokens is not None else "steps"] = spec.tokens if spec.tokens is not None else spec.steps
    if spec.checkpoint_every:
        hp["checkpoint-every"] = spec.checkpoint_every
    if spec.data_s3_uri is not None or spec.data is not None:
        hp["data"] = "/opt/ml/input/data/train"  # the "train" channel (the trainer also reads SM_CHANNEL_TRAIN)
    if spec.is_folder_model:
        hp["model"] = MODEL_CHANNEL_PATH  # the "model" channel: the user's folder
    if spec.plan.config.tracker == "tensorboard":
        hp["tracker-dir"] = SAGEMAKER_TENSORBOARD_DIR  # the job's TensorBoard output path (fp8lab.launch.requests)
    for name, value in planned["options"].items():
        hp[name.replace("_", "-")] = value
    return hp
