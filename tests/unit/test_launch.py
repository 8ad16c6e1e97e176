"""fp8lab.launch without any endpoint: validation, names, estimates, cost, redaction, CLI."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

pytest.importorskip("sagemaker.train")
from fp8lab import launch as L  # noqa: E402
from fp8lab.launch.plan import as_plan  # noqa: E402
from fp8lab.launch.spec import _known_regions  # noqa: E402

ROLE, BUCKET = L.PLACEHOLDER_ROLE, L.PLACEHOLDER_BUCKET


def spec(**kw):
    base = dict(model="llama-1b", precision="fp8", role=ROLE, bucket=BUCKET, tokens=10**9)
    base.update(kw)
    return L.JobSpec(**base)


@pytest.mark.parametrize("kw, match", [
    ({"model": "gpt-5"}, r"JobSpec.model='gpt-5'.*llama-1b"),
    ({"instance_type": "ml.p9.48xlarge"}, r"instance_type.*ml.p5.48xlarge"),
    ({"instance_type": "ml.p4d.24xlarge"}, r"FP8 tensor cores.*ml.p4d.24xlarge"),
    ({"instance_count": 0}, r"instance_count=0.*>= 1"),
    ({"role": ""}, r"JobSpec.role is missing"),
    ({"role": "my-role"}, r"JobSpec.role='my-role'.*IAM role ARN"),
    ({"bucket": ""}, r"JobSpec.bucket is missing"),
    ({"bucket": "s3://b"}, r"JobSpec.bucket.*without s3://"),
    ({"region": "mars-east-1"}, r"JobSpec.region='mars-east-1'.*us-east-1"),
    ({"steps": 10}, r"exactly one of tokens= or steps="),
    ({"precision": "fp4"}, r"precision='fp4'.*bf16, fp8"),
    ({"recipe": "mxfp8"}, r"mxfp8.*Blackwell"),
    ({"backend": "apex"}, r"backend='apex'.*te, torchao"),
    ({"parallel": "zero3"}, r"parallel='zero3'.*ddp, fsdp"),
    ({"lr": 3.0}, r"lr=3.0"),
    ({"max_run_s": 10**9}, r"max_run_s.*28 days"),
    ({"data_s3_uri": "/local/data"}, r"data_s3_uri.*s3://"),
    ({"keep_alive_s": 7200}, r"keep_alive_s=7200.*0..3600"),
    ({"keep_alive_s": 600, "spot": True}, r"warm pools do not support managed spot"),
    ({"max_wait_s": 7200}, r"max_wait_s only applies to spot"),
])
def test_jobspec_rejects_bad_input_with_a_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        spec(**kw)


# The infrastructure fields, bounded by what S3 and SageMaker take (fp8lab.launch.limits): one line naming the field
INFRA_BAD = [
    ({"data_s3_uri": "s3://"}, "JobSpec.data_s3_uri='s3://' is invalid; allowed: an s3://bucket/prefix URI"),
    ({"data_s3_uri": "s3://bucket/../x"}, "JobSpec.data_s3_uri='s3://bucket/../x' is invalid"),
    ({"data_s3_uri": "s3://bucket/a//b"}, "JobSpec.data_s3_uri='s3://bucket/a//b' is invalid"),
    ({"data_s3_uri": "s3://bucket/./x"}, "JobSpec.data_s3_uri='s3://bucket/./x' is invalid"),
    ({"data_s3_uri": "s3://a..b/x"}, "JobSpec.data_s3_uri='s3://a..b/x' is invalid"),
    ({"data_s3_uri": "s3://bucket/my data"}, "JobSpec.data_s3_uri='s3://bucket/my data' is invalid"),
    ({"data_s3_uri": "s3://bucket/" + "k" * 1100}, "at most 1024 characters"),
    ({"bucket": "a..b"}, "JobSpec.bucket='a..b' is invalid; allowed: an S3 bucket name"),
    ({"bucket": "192.168.1.1"}, "JobSpec.bucket='192.168.1.1' is invalid"),
    ({"bucket": "xn--bucket"}, "S3 reserves the prefixes"),
    ({"bucket": "my-bucket-s3alias"}, "S3 reserves the prefixes"),
    ({"bucket": "My-Bucket"}, "JobSpec.bucket='My-Bucket' is invalid"),
    ({"volume_gb": 10**9}, "JobSpec.volume_gb=1000000000 is invalid; allowed: an integer in 1..16384"),
    ({"volume_gb": 0}, "JobSpec.volume_gb=0 is invalid"),
    ({"volume_gb": 100.5}, "JobSpec.volume_gb=100.5 is invalid"),
    ({"model": "s3://bucket/../models"}, "JobSpec.model='s3://bucket/../models' is invalid"),
    ({"tokens": 1e30}, "JobSpec.tokens=1000000000000000019884624838656 is invalid; allowed: a positive integer, at most 1e15"),
    ({"tokens": None, "steps": 10**23}, "JobSpec.steps=100000000000000000000000 is invalid; allowed: a positive integer, "
                                        "at most 1e8"),
]


@pytest.mark.parametrize("kw, phrase", INFRA_BAD, ids=[p[:40] for _, p in INFRA_BAD])
def test_jobspec_infrastructure_fields_are_bounded_by_what_aws_takes(kw, phrase):
    with pytest.raises(ValueError) as err:
        spec(**kw)
    assert phrase in str(err.value) and len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("kw", [{"data_s3_uri": "s3://my.bucket.name/tokens/v1/"}, {"data_s3_uri": "s3://bucket"},
                                {"bucket": "acme-data.ml-1"}, {"volume_gb": 16384}, {"tokens": 10**15 // 10**5}])
def test_jobspec_takes_what_aws_takes(kw):
    spec(**kw)


def test_local_data_is_read_as_the_trainer_reads_it_before_any_upload(tmp_path):
    """JobSpec.data (the train channel from a local file): bad instruction records, a missing path, an s3:// URI or
    both data fields stop the plan in one line naming the field; a good file plans with the job's task."""
    good = tmp_path / "chats.jsonl"
    good.write_text('{"prompt": "Who?", "response": "Me."}\n{"prompt": "Where?", "response": "Here."}\n')
    sft = {"task": "sft"}
    assert spec(data=str(good), options=sft).plan.config.task == "sft"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Who?", "response": "Me."}\n{"prompt": "Where?"}\n')
    for kw, phrase in (
            ({"data": str(bad), "options": sft}, "JobSpec.data: file 'bad.jsonl' record 2 (line 2): field response is "
                                                 "missing"),
            ({"data": str(tmp_path / "none.jsonl")}, "nothing exists at that path"),
            ({"data": "s3://bucket/chats.jsonl"}, "an s3:// URI goes in data_s3_uri"),
            ({"data": str(good), "data_s3_uri": "s3://bucket/x", "options": sft}, "data and data_s3_uri both name")):
        with pytest.raises(ValueError) as err:
            spec(**kw)
        assert phrase in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


@pytest.mark.parametrize("price", [float("inf"), float("nan"), 0, -1, True])
def test_plan_refuses_a_price_that_is_not_a_finite_positive_number(price):
    with pytest.raises(ValueError, match=r"price_per_hour=.* is invalid; allowed: a finite number > 0"):
        L.plan_sweep(["llama-1b"], ["fp8"], [1], price_per_hour=price, role=ROLE, bucket=BUCKET, tokens=10**9)


def test_a_plan_longer_than_sagemakers_limit_is_refused_with_what_to_change():
    """25,877 h on one P5 (the probe's plan) against SageMaker's 672 h: refused, with the tokens that fit."""
    with pytest.raises(ValueError) as err:
        L.plan_sweep(["llama-7b"], ["bf16"], [1], role=ROLE, bucket=BUCKET, tokens=10**13)
    msg = str(err.value)
    assert msg.startswith("llama-7b bf16 on 1 x ml.p5.48xlarge: estimated ") and "beyond SageMaker's 672 h" in msg
    fit = int(re.search(r"at most about ([\d,]+) tokens", msg).group(1).replace(",", ""))
    plan = L.plan_sweep(["llama-7b"], ["bf16"], [1], role=ROLE, bucket=BUCKET, tokens=fit)  # what it says fits, fits
    assert plan.jobs[0].est_hours <= 672
    with pytest.raises(ValueError, match="beyond SageMaker's 672 h"):  # launch() of a bare spec: the same check
        as_plan(spec(model="llama-7b", precision="bf16", tokens=10**13))


def test_bf16_is_fine_on_a100_and_mxfp8_on_blackwell():
    assert spec(precision="bf16", instance_type="ml.p4d.24xlarge").world_size == 8
    assert spec(recipe="mxfp8", instance_type="ml.p6-b200.48xlarge").info.blackwell


def test_region_check_uses_the_sdk_instance_table(monkeypatch):
    # The SDK's table lists the regions it knows for an instance type; a listed region
    # without the type is rejected, a region the table does not know is allowed.
    assert _known_regions("ml.p5.48xlarge") and "us-east-1" in _known_regions("ml.p5.48xlarge")
    monkeypatch.setattr("fp8lab.launch.spec._instance_region_table", lambda: {"us-east-1": frozenset(), "us-west-2": frozenset(L.INSTANCES)})
    with pytest.raises(ValueError, match=r"region='us-east-1'.*not offered there.*us-west-2"):
        spec()
    assert spec(region="eu-west-1").region == "eu-west-1"  # not in the (patched) table: not known, allowed


def test_instance_table_names_are_valid_sagemaker_training_types():
    import botocore.session

    shape = botocore.session.get_session().get_service_model("sagemaker").shape_for("TrainingInstanceType")
    assert set(L.INSTANCES) <= set(shape.enum)
    assert set(L.DEFAULT_PRICES_USD_PER_HOUR) <= set(L.INSTANCES)


def test_plan_names_are_deterministic_unique_and_valid():
    args = (["llama-1b", "llama-7b", "gptneo-1.3b"], ["bf16", "fp8"], [1, 2, 4, 16])
    a = L.plan_sweep(*args, role=ROLE, bucket=BUCKET, tokens=24 * 10**9)
    b = L.plan_sweep(*args, role=ROLE, bucket=BUCKET, tokens=24 * 10**9)
    assert a.names == b.names and len(set(a.names)) == len(a.names) == 24
    for name in a.names:
        # room for the SDK's "-YYYYmmddHHMMSS" within SageMaker's 63 characters
        assert len(name) <= 48 and re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", name)
    assert a.names[0] == L.job_name(a.jobs[0].spec) and a.names[0].startswith("fp8lab-llama-1b-bf16-1xp5-")
    assert "fp8lab-gptneo-1-3b-fp8-16xp5-" in " ".join(a.names)
    # the experiment defines the name; who pays and where it is stored do not
    other = L.plan_sweep(*args, role="arn:aws:iam::444455556666:role/x", bucket="other-bucket", tokens=24 * 10**9)
    assert other.names == a.names
    assert L.plan_sweep(*args, role=ROLE, bucket=BUCKET, tokens=10**9).names != a.names


def test_plan_bf16_and_fp8_differ_only_in_precision():
    plan = L.plan_sweep(["llama-7b"], ["bf16", "fp8"], [2], role=ROLE, bucket=BUCKET, tokens=10**9)
    bf16, fp8 = (j.spec for j in plan.jobs)
    diff = {k for k, v in dataclasses.asdict(bf16).items() if dataclasses.asdict(fp8)[k] != v}
    assert diff == {"precision"}  # even the time limit is shared (the longer of the two estimates)
    assert bf16.max_run_s >= 2 * plan.jobs[0].est_hours * 3600
    hb, hf = L.hyperparameters(bf16), L.hyperparameters(fp8)
    assert {k for k in hb if hb[k] != hf[k]} == {"precision"} and hb["backend"] == "te"


def test_plan_costs_add_up_and_follow_the_price():
    plan = L.plan_sweep(["llama-1b", "llama-7b"], ["bf16", "fp8"], [1, 4], role=ROLE, bucket=BUCKET,
                        tokens=24 * 10**9)
    assert plan.price_per_hour == 113.07 and "ml.p5.48xlarge" in plan.price_source and "2024" in plan.price_source
    for j in plan.jobs:
        assert j.cost_usd == pytest.approx(j.est_hours * j.spec.instance_count * 113.07)
        assert j.gpu_hours == pytest.approx(j.est_hours * 8 * j.spec.instance_count)
        assert j.spec.max_run_s >= 2 * j.est_hours * 3600
    assert plan.total_cost_usd == pytest.approx(sum(j.cost_usd for j in plan.jobs))
    by = {(j.spec.model, j.spec.precision, j.spec.instance_count): j for j in plan.jobs}
    # more parameters -> more time; FP8 faster than BF16 by the assumed factor; more nodes -> shorter
    assert by["llama-7b", "bf16", 1].est_hours > 4 * by["llama-1b", "bf16", 1].est_hours
    assert by["llama-1b", "bf16", 4].est_hours < by["llama-1b", "bf16", 1].est_hours
    # the MFU-assumption Estimate (the fallback for models without measurements): FP8 faster by the assumed factor
    assumed = L.plan_sweep(["llama-1b", "llama-7b"], ["bf16", "fp8"], [1, 4], role=ROLE, bucket=BUCKET,
                           tokens=24 * 10**9, estimate=L.Estimate())
    by = {(j.spec.model, j.spec.precision, j.spec.instance_count): j for j in assumed.jobs}
    start = assumed.estimate.startup_s / 3600
    assert (by["llama-1b", "bf16", 1].est_hours - start) == pytest.approx(1.15 * (by["llama-1b", "fp8", 1].est_hours - start))
    assert by["llama-7b", "bf16", 1].est_hours > 4 * by["llama-1b", "bf16", 1].est_hours
    assert set(assumed.table()["basis"].dropna()) == {"assumed MFU 0.35 of BF16 peak", "assumed MFU 0.35 of BF16 peak, FP8 x1.15"}
    assert "MFU 0.35 of BF16 peak" in L.format_cost_table(assumed)
    cheaper = L.plan_sweep(["llama-1b", "llama-7b"], ["bf16", "fp8"], [1, 4], role=ROLE, bucket=BUCKET,
                           tokens=24 * 10**9, price_per_hour=50.0)
    assert cheaper.total_cost_usd == pytest.approx(plan.total_cost_usd * 50.0 / 113.07)
    table = plan.table()
    assert table.iloc[-1]["job"] == "TOTAL" and table.iloc[-1]["cost_usd"] == pytest.approx(plan.total_cost_usd, abs=0.01)
    assert plan.summary()["n_jobs"] == 8
    assert "price: $113.07 per instance-hour (ml.p5.48xlarge, us-east-1, as of 2024-11" in L.format_cost_table(plan)


def test_plan_rejects_bad_sweeps():
    with pytest.raises(ValueError, match="duplicates"):
        L.plan_sweep(["llama-1b", "llama-1b"], ["fp8"], [1], role=ROLE, bucket=BUCKET, tokens=10**9)
    with pytest.raises(ValueError, match="non-empty list"):
        L.plan_sweep("llama-1b", ["fp8"], [1], role=ROLE, bucket=BUCKET, tokens=10**9)
    with pytest.raises(ValueError, match="unknown or reserved JobSpec field.*nodes"):
        L.plan_sweep(["llama-1b"], ["fp8"], [1], role=ROLE, bucket=BUCKET, tokens=10**9, nodes=2)
    with pytest.raises(ValueError, match="no default price for ml.p5e.48xlarge"):
        L.plan_sweep(["llama-1b"], ["fp8"], [1], role=ROLE, bucket=BUCKET, tokens=10**9,
                     instance_type="ml.p5e.48xlarge")
    with pytest.raises(ValueError, match="instance_count=0"):
        L.plan_sweep(["llama-1b"], ["fp8"], [0, 1], role=ROLE, bucket=BUCKET, tokens=10**9)
    with pytest.raises(ValueError, match="assumed_mfu"):
        L.Estimate(assumed_mfu=0)


def test_steps_give_tokens_from_the_global_batch():
    s = spec(tokens=None, steps=100, instance_count=2, micro_batch_size=4, grad_accum=2, seq_len=1024)
    assert s.total_tokens == 100 * 4 * 2 * 1024 * 16


FAKE_SHAPED_KEY = "AKIA" + "ABCDEFGHIJKLMNOP"  # a fake with a real key id's shape (built so scanners skip it)


def test_redact_masks_account_ids_and_keys_but_not_aws_image_registries():
    image = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.9-gpu-py312"
    text = (f"arn:aws:iam::123456789012:role/r {image} {FAKE_SHAPED_KEY} sagemaker-us-east-1-210987654321 "
            "444455556666.dkr.ecr.us-east-1.amazonaws.com/mine:1 arn:aws:sagemaker:us-east-1:777788889999:training-job/x "
            "tokens=288000000000")
    out = L.redact(text)
    for acct in ("123456789012", "210987654321", "444455556666", "777788889999", FAKE_SHAPED_KEY):
        assert acct not in out
    assert image in out and out.count("<account-id>") == 4 and "<access-key-id>" in out
    assert "tokens=288000000000" in out  # a plain 12-digit number is not an account id


def test_redact_masks_an_account_id_inside_a_bucket_name_but_not_numbers():
    for text in ("s3://acme-123456789012-ml/fp8lab", "s3://123456789012-data/x", "bucket acme123456789012",
                 "s3://ml.123456789012.data/x", "'Bucket': 'acme_123456789012'"):
        assert "123456789012" not in L.redact(text) and "<account-id>" in L.redact(text), text
    for text in ("tokens=288000000000", "lr 0.000300000000", "fp8lab-llama-1b-fp8-1xp5-e528a2-20261201185500",
                 "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.9-gpu-py312"):
        assert L.redact(text) == text


def test_dry_run_never_prints_an_account_id_in_the_bucket_name(capsys):
    assert L.main(["dry-run", "--models", "llama-1b", "--precisions", "fp8", "--instance-counts", "1",
                   "--bucket", "acme-123456789012-ml", "--tokens", "1e9"]) == 0
    out = capsys.readouterr()
    assert "123456789012" not in out.out + out.err and out.out.count("acme-<account-id>-ml") >= 1


def test_cli_wait_without_aws_credentials_is_one_line(monkeypatch, tmp_path, capsys):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL",
              "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert L.main(["wait", "fp8lab-nope", "--region", "us-east-1", "--poll-s", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("fp8lab launch: error: AWS refused the call (NoCredentialsError") and len(err.splitlines()) == 1


def test_parse_metric_line():
    line = ("2024-11-01 algo-1 fp8lab-metrics step=12 loss=3.456789 tokens_per_sec_per_gpu=12345.6 mfu=0.4123 "
            "step_time_s=0.5123 lr=0.0003 grad_norm=1.234")
    assert L.parse_metric_line(line) == {"step": 12, "loss": 3.456789, "tokens_per_sec_per_gpu": 12345.6,
                                         "mfu": 0.4123, "step_time_s": 0.5123, "lr": 0.0003, "grad_norm": 1.234}
    assert L.parse_metric_line("fp8lab-metrics step=12 val_loss=3.4567") == {"step": 12, "val_loss": 3.4567}
    assert L.parse_metric_line("Starting training script") is None


def test_warm_pool_request_and_cli_dry_run(capsys):
    import moto_env as menv  # tests/sagemaker/, on sys.path through tests/conftest.py
    (req,) = L.build_requests(spec(keep_alive_s=900, instance_count=2))
    assert req["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900 and "EnableManagedSpotTraining" not in req
    menv.check_request("CreateTrainingJob", req)
    assert L.main(["dry-run", "--models", "llama-7b", "--precisions", "fp8", "--instance-counts", "2",
                   "--tokens", "1000000000"]) == 0
    out = capsys.readouterr().out
    assert out.count("CreateTrainingJob request for fp8lab-llama-7b-fp8-2xp5-") == 1 and "TOTAL" in out


def test_dry_run_validates_the_sdk_config_once_and_transfers_no_file(monkeypatch):
    """Issue 47: the SDK validated its config at every lookup (most of a dry run) and pushed each staged file through
    boto3's transfer manager; now each config is validated once per build and no file is transferred. The request
    is unchanged (test_launch_moto compares it with the real train() path's)."""
    import boto3.s3.transfer
    import jsonschema
    from sagemaker.core.config import config_manager

    validated = []
    real_validate = jsonschema.validate
    monkeypatch.setattr(config_manager.jsonschema, "validate",
                        lambda instance, schema, *a, **k: (validated.append(json.dumps(instance, sort_keys=True)),
                                                           real_validate(instance, schema, *a, **k))[1])

    def no_transfer(*a, **k):
        raise AssertionError("the dry run pushed a file through boto3's transfer manager")

    monkeypatch.setattr(boto3.s3.transfer.S3Transfer, "upload_file", no_transfer)
    before = config_manager.SageMakerConfig.__dict__["validate_sagemaker_config"]
    reqs = L.build_requests(L.plan_sweep(["llama-1b"], ["bf16", "fp8"], [1, 2], role=L.PLACEHOLDER_ROLE,
                                         bucket=L.PLACEHOLDER_BUCKET, tokens=10**9))
    assert len(reqs) == 4 and len({r["TrainingJobName"] for r in reqs}) == 4
    # one config: checked when the SDK's Session is made, then once for all lookups of the four jobs (was ~6 per job)
    assert len(set(validated)) == 1 and len(validated) == 2
    assert config_manager.SageMakerConfig.__dict__["validate_sagemaker_config"] is before  # the SDK's method back
    with pytest.raises(jsonschema.ValidationError):  # and it still validates: a bad config is refused
        config_manager.SageMakerConfig.validate_sagemaker_config({"SchemaVersion": 1})
    from fp8lab.launch.requests import sdk_config_checked_once

    with sdk_config_checked_once(), pytest.raises(jsonschema.ValidationError):  # inside the block too
        config_manager.SageMakerConfig().validate_sagemaker_config({"SchemaVersion": 1})


def test_cli_plan_and_errors(capsys):
    assert L.main(["plan", "--models", "llama-1b", "--instance-counts", "1", "2", "--tokens", "1000000000"]) == 0
    out = capsys.readouterr().out
    assert "TOTAL" in out and out.count("fp8lab-llama-1b-") == 4
    assert L.main(["plan", "--models", "nope"]) == 1
    assert "JobSpec.model='nope'" in capsys.readouterr().err
    assert L.main(["launch", "--models", "llama-1b", "--instance-counts", "1"]) == 1  # placeholders refused
    assert "placeholders" in capsys.readouterr().err


def test_wait_and_collect_reject_bad_job_lists():
    with pytest.raises(ValueError, match="job names"):
        L.wait([])
    with pytest.raises(ValueError, match="job names"):
        L.collect([None])


def test_cli_plan_uses_the_layout_resolver_like_the_api(capsys):
    """`fp8lab launch plan` with no layout flags plans the layout JobSpec resolves (not a fixed micro-batch)."""
    job = L.plan_sweep(["llama-7b"], ["fp8"], [2], role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET,
                       tokens=10**9).jobs[0].spec
    assert L.main(["plan", "--models", "llama-7b", "--precisions", "fp8", "--instance-counts", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{job.plan.micro_batch_size} x {job.plan.seq_len} x {job.plan.grad_accum}" in out
    assert L.main(["plan", "--models", "llama-7b", "--precisions", "fp8", "--instance-counts", "2",
                   "--micro-batch-size", "1", "--seq-len", "1024"]) == 0
    assert " 1 x 1024 x " in capsys.readouterr().out


def test_a_bare_spec_given_to_build_trainer_gets_the_time_limit_a_plan_gives_it(tmp_path):
    from fp8lab.launch import requests

    spec = L.JobSpec(model="llama-1b", precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET,
                     tokens=2_000_000_000)
    assert spec.max_run_s is None
    planned = L.plan_sweep(["llama-1b"], ["fp8"], [1], role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET,
                           tokens=2_000_000_000).jobs[0].spec
    source = requests.staged_source({}, str(tmp_path), spec.install_te)
    trainer = L.build_trainer(spec, source, requests._offline_session(spec.region, spec.bucket))
    assert trainer.stopping_condition.max_runtime_in_seconds == planned.max_run_s > 0


def test_a_job_runs_its_planned_graphs_decision_and_the_instance_does_not_re_decide_it():
    """CUDA graphs "auto" is decided from a machine's memory: an instance that detects less than the launch
    planned for must not decide otherwise (and be refused after it started). The job pins the launch's."""
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run
    from fp8lab.train.entry import parse_args

    spec = L.JobSpec(model="llama-1b", precision="fp8", role=ROLE, bucket=BUCKET, steps=10)
    hp = L.hyperparameters(spec)
    assert spec.trainer_config().cuda_graphs == "auto" and hp["cuda-graphs"] == "off" == \
        ("on" if spec.plan.graphs.active else "off")
    c = parse_args([x for k, v in hp.items() for x in (f"--{k}", str(v))])  # what the instance's trainer reads
    assert c.cuda_graphs == "off"
    planned = spec.plan.machine
    smaller = Machine("cuda", planned.name, planned.memory_gib - 1.0, planned.world_size, te_usable=True, fp8=True)
    here = plan_run(c, smaller)
    assert here.graphs.reason == "--cuda-graphs off" and here.differences(spec.plan) == {}
    # an explicit choice travels as it was; nothing is pinned over it
    assert L.hyperparameters(dataclasses.replace(spec, options={"cuda_graphs": "off"}))["cuda-graphs"] == "off"


def test_a_job_runs_its_planned_activation_checkpointing_and_the_instance_does_not_re_decide_it():
    """#34/#26: activation checkpointing "auto" is a layout decision from a machine's memory. A job planned with
    it on (llama-7b at 16K on P5: no micro-batch fits without) carries an explicit True: with "auto" beside its
    pinned micro-batch the instance resolved it off and refused the job after it started."""
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run
    from fp8lab.train.trainer import check_same_plan
    from fp8lab.train.entry import parse_args

    long = L.JobSpec(model="llama-7b", precision="fp8", seq_len=16384, role=ROLE, bucket=BUCKET, steps=10)
    assert long.trainer_config().activation_checkpointing == "auto" and long.activation_checkpointing == "auto"
    assert long.layout.activation_checkpointing is True and "activation_checkpointing" in long.layout.reasons
    hp = L.hyperparameters(long)
    assert hp["activation-checkpointing"] is True
    # what the instance's trainer reads: each value as the SDK serialises it, to --key value as its driver does
    import sagemaker.train.container_drivers.common.utils as drv
    from sagemaker.train.utils import safe_serialize

    c = parse_args(drv.hyperparameters_to_cli_args({k: safe_serialize(v) for k, v in hp.items()}))
    assert c.activation_checkpointing is True and c.micro_batch_size == long.layout.micro_batch_size
    planned = long.plan.machine
    for memory in (planned.memory_gib, planned.memory_gib - 1.0):  # the instance detects what it has
        here = plan_run(c, Machine("cuda", planned.name, memory, planned.world_size, te_usable=True, fp8=True))
        assert here.layout.activation_checkpointing is True and here.differences(long.plan) == {}
        check_same_plan(here, long.plan.decisions())  # what sm_entry checks on the instance: no refusal
    assert long.identity()["activation_checkpointing"] is True  # what runs names the job
    # where nothing needs it the job pins it off; an explicit choice travels as it was
    short = spec(steps=10, tokens=None)
    assert short.layout.activation_checkpointing is False and L.hyperparameters(short)["activation-checkpointing"] is False
    forced = dataclasses.replace(short, activation_checkpointing=True)
    assert forced.layout.activation_checkpointing is True and L.hyperparameters(forced)["activation-checkpointing"] is True
    assert "activation_checkpointing" not in forced.layout.reasons
    with pytest.raises(ValueError, match=r"trainer would refuse this job: --micro-batch-size auto: .*even at micro-batch 1"):
        dataclasses.replace(long, activation_checkpointing=False)
    with pytest.raises(ValueError, match=r"JobSpec.activation_checkpointing='sometimes' is invalid"):
        dataclasses.replace(short, activation_checkpointing="sometimes")


def test_plan_sweep_plans_each_job_once(monkeypatch):
    """Setting the shared time limit once re-planned every job (dataclasses.replace runs __post_init__)."""
    import fp8lab.plan.runplan as fplan

    calls = []
    real = fplan.plan_run
    monkeypatch.setattr(fplan, "plan_run", lambda c, m: calls.append(c.model) or real(c, m))
    plan = L.plan_sweep(["llama-1b"], ["bf16", "fp8"], [1, 2], role=ROLE, bucket=BUCKET, tokens=10**9)
    assert len(calls) == len(plan.jobs) == 4
    for j in plan.jobs:  # the time limit is set, checked and the plan the same as a fresh one's
        assert j.spec.max_run_s > 0 and j.spec.plan.decisions() == dataclasses.replace(j.spec).plan.decisions()
    with pytest.raises(ValueError, match="JobSpec.max_run_s=0 is invalid; allowed: a positive integer or None"):
        plan.jobs[0].spec.with_time_limit(0)


def test_launch_command_skips_the_unused_iri_grammar_and_the_sdk_still_validates():
    """`fp8lab launch dry-run`/`launch` import jsonschema without rfc3987_syntax in their own process (about a second
    of grammar building for a format check the SDK never asks for); the SDK's config still validates, a bad one is
    still refused, and rfc3987_syntax still imports afterwards. A process that already has jsonschema is left alone."""
    import subprocess
    import sys

    probe = ("import sys; from fp8lab.launch.cli import skip_unused_iri_grammar as skip; assert skip(); "
             "assert 'jsonschema' in sys.modules and 'rfc3987_syntax' not in sys.modules; "
             "from sagemaker.core.config.config_manager import SageMakerConfig as C; "
             "C.validate_sagemaker_config({'SchemaVersion': '1.0'}); import jsonschema\n"
             "try:\n    C.validate_sagemaker_config({'SchemaVersion': 1})\nexcept jsonschema.ValidationError:\n    pass\n"
             "else:\n    raise SystemExit('a bad config passed')\n"
             "import rfc3987_syntax; assert not skip(); print('ok')")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_one_gpu_p5_is_planned_priced_and_requested_like_the_others(capsys):
    """ml.p5.4xlarge: one H100, so one process and no FSDP; priced at its assumed price with the date."""
    from fp8lab.launch.cli import main

    assert main(["plan", "--instance-type", "ml.p5.4xlarge", "--models", "llama-1b"]) == 0
    out = capsys.readouterr().out
    assert "price: $14.13 per instance-hour (ml.p5.4xlarge, us-east-1, as of 2024-11" in out
    assert "8 GPUs/node" not in out  # a one-GPU instance runs at the measured one-GPU rate
    plan = L.plan_sweep(["llama-1b"], ["bf16", "fp8"], [1, 2], instance_type="ml.p5.4xlarge", role=ROLE,
                        bucket=BUCKET, tokens=24 * 10**9)
    one = plan.jobs[0]
    assert one.spec.world_size == 1 and one.spec.plan.config.parallel == "ddp"
    assert L.hyperparameters(one.spec)["parallel"] == "ddp"
    assert one.cost_usd == pytest.approx(one.est_hours * 14.13) and one.gpu_hours == pytest.approx(one.est_hours)
    assert plan.jobs[1].spec.world_size == 2 and plan.jobs[1].spec.plan.config.parallel == "fsdp"  # 2 instances
    eight = L.plan_sweep(["llama-1b"], ["fp8"], [1], role=ROLE, bucket=BUCKET, tokens=24 * 10**9).jobs[0]
    assert eight.spec.plan.config.parallel == "fsdp" and L.hyperparameters(eight.spec)["parallel"] == "fsdp"
    # one GPU is slower than eight per job, and the same GPU's rate: 8x the hours, within the node efficiency
    fp8_one = [j for j in plan.jobs if j.spec.precision == "fp8" and j.spec.instance_count == 1][0]
    assert 7 < fp8_one.est_hours / eight.est_hours < 9
    with pytest.raises(ValueError, match="JobSpec.parallel='fsdp' is invalid; allowed: auto or ddp: ml.p5.4xlarge has one GPU"):
        L.JobSpec(model="llama-1b", precision="fp8", instance_type="ml.p5.4xlarge", parallel="fsdp", role=ROLE,
                  bucket=BUCKET, tokens=10**9)
    req = L.build_requests(one.spec)[0]
    assert req["ResourceConfig"]["InstanceType"] == "ml.p5.4xlarge" and req["ResourceConfig"]["InstanceCount"] == 1
    assert req["HyperParameters"]["parallel"] == "ddp"


def test_a_job_carries_the_task_as_a_trainer_option():
    """--task is the trainer's option (one declaration): a job takes it in options, passes it on, names it apart."""
    from fp8lab.train.entry import parse_args

    sft = spec(options={"task": "sft"})
    hp = L.hyperparameters(sft)
    assert hp["task"] == "sft" and parse_args(["--task", hp["task"]]).task == "sft"
    assert sft.trainer_config().task == "sft" and "task" not in L.hyperparameters(spec())
    assert L.job_name(sft) != L.job_name(spec())
    with pytest.raises(ValueError, match="task"):
        spec(options={"task": "chat"})
