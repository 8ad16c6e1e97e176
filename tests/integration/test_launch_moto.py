"""fp8lab.launch against a real local HTTP endpoint (moto's server): the SDK's real train() path.

Nothing here patches the SDK. Offline snags are handled in the fixture: role validation off
(SAGEMAKER_VALIDATE_ROLE=false), telemetry off and the user's SDK config ignored (both SDK
config override variables point at tests/sagemaker/config.yaml), fake credentials, and
AWS_ENDPOINT_URL at moto. Requests are captured with botocore event hooks on the session
handed to launch(), and judged by botocore's service model, not by moto.
"""
from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import time

import pytest

from fp8lab.core.pins import pins

boto3 = pytest.importorskip("boto3")
pytest.importorskip("sagemaker.train")
pytest.importorskip("moto.server")

from fp8lab import launch as L  # noqa: E402
from fp8lab.launch.aws import _split_s3  # noqa: E402
from fp8lab.launch.redaction import _public_registry_accounts  # noqa: E402

import moto_env as menv  # noqa: E402  (tests/sagemaker/, on sys.path through tests/conftest.py)

BUCKET, ROLE = menv.BUCKET, menv.ROLE
TS = re.compile(r"-\d{14}")
endpoint, aws = menv.endpoint, menv.aws  # fixtures


def _spec(**kw):
    base = dict(model="llama-1b", precision="fp8", role=ROLE, bucket=BUCKET, steps=5, instance_count=2)
    base.update(kw)
    return L.JobSpec(**base)


def _assert_clean(*texts):
    menv.assert_clean(_public_registry_accounts(), *texts)


def _s3_text(boto, uri_or_bucket, key=None):
    if key is None:
        uri_or_bucket, key = _split_s3(uri_or_bucket)
    return boto.client("s3").get_object(Bucket=uri_or_bucket, Key=key)["Body"].read().decode()


@pytest.fixture
def outside_calls(monkeypatch):
    """Host names the process tries to reach other than the local endpoint (telemetry would be one)."""
    import socket
    import threading

    seen: list[str] = []
    real = socket.getaddrinfo

    def spy(host, *a, **k):
        if host not in ("127.0.0.1", "localhost"):
            seen.append(str(host))
            raise OSError(f"test: no network beyond 127.0.0.1 ({host})")
        return real(host, *a, **k)

    monkeypatch.setattr(socket, "getaddrinfo", spy)
    yield seen
    for t in threading.enumerate():  # let a telemetry thread, if any was started, try its call
        if t.name == "sagemaker-telemetry":
            t.join(timeout=5)


def test_real_train_path_sends_a_valid_complete_request(aws, capsys, caplog, outside_calls):
    caplog.set_level(logging.INFO)  # the SDK logs role ARNs and bucket names at INFO: all must be redacted
    sess, rec, boto = aws
    assert sess.sagemaker_config["SageMaker"]["PythonSDK"]["Modules"]["TelemetryOptOut"] is True
    spec = _spec(spot=True, checkpoint_every=100, data_s3_uri=f"s3://{BUCKET}/data/tokens", install_te=True)
    plan = L.plan_sweep(["llama-1b"], ["fp8"], [2], price_per_hour=100.0,
                        **{k: getattr(spec, k) for k in ("role", "bucket", "steps", "spot", "checkpoint_every",
                                                         "data_s3_uri", "install_te")})
    names = L.launch(plan, dry_run=False, session=sess)

    creates = rec["sagemaker.CreateTrainingJob"]
    assert len(creates) == 1 and names == [creates[0]["TrainingJobName"]]
    req = creates[0]
    menv.check_request("CreateTrainingJob", req)
    job = plan.jobs[0]
    assert TS.sub("", req["TrainingJobName"]) == job.name and len(req["TrainingJobName"]) <= 63
    assert req["ResourceConfig"] == {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2, "VolumeSizeInGB": 200}
    assert req["AlgorithmSpecification"]["TrainingImage"] == L.training_image(job.spec)
    # the default: AWS's SageMaker PyTorch image with TE compiled in (fp8lab.launch.image), in the region's DLC registry
    assert re.fullmatch(r"\d{12}\.dkr\.ecr\.us-east-1\.amazonaws\.com/pytorch:2\.13-cu133-amzn2023-sagemaker",
                        req["AlgorithmSpecification"]["TrainingImage"])
    hp = req["HyperParameters"]
    assert hp["model"] == "llama-1b" and hp["precision"] == "fp8" and hp["backend"] == "te"
    # the layout resolver's micro-batch for P5's H100 80 GB (fp8lab.plan.layout), passed explicitly to the job
    assert hp["steps"] == "5" and hp["checkpoint-every"] == "100" and hp["micro-batch-size"] == "16"
    assert "tokens" not in hp
    mdefs = {m["Name"]: m["Regex"] for m in req["AlgorithmSpecification"]["MetricDefinitions"]}
    assert mdefs == L.METRIC_DEFINITIONS
    assert req["StoppingCondition"]["MaxRuntimeInSeconds"] == job.spec.max_run_s >= 3600
    assert req["StoppingCondition"]["MaxWaitTimeInSeconds"] == 2 * job.spec.max_run_s
    assert req["EnableManagedSpotTraining"] is True
    assert req["CheckpointConfig"] == {"S3Uri": f"s3://{BUCKET}/fp8lab/p5-sweep/checkpoints/{job.name}",
                                       "LocalPath": "/opt/ml/checkpoints"}
    assert req["OutputDataConfig"]["S3OutputPath"] == f"s3://{BUCKET}/fp8lab/p5-sweep/output"
    tags = {t["Key"]: t["Value"] for t in req["Tags"]}
    assert tags == {"fp8lab:job": job.name, "fp8lab:study": "p5-sweep", "fp8lab:precision": "fp8",
                    "fp8lab:model": "llama-1b"}
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in req["InputDataConfig"]}
    assert channels["train"] == f"s3://{BUCKET}/data/tokens"
    assert set(channels) == {"train", "code", "sm_drivers"}
    assert req["RoleArn"] == ROLE

    # What was uploaded: the package and requirements under the study's prefix, no bytecode.
    keys = [p["Key"] for p in rec["s3.PutObject"]]
    code_prefix = f"fp8lab/p5-sweep/code/{req['TrainingJobName']}/input/code/"
    code = sorted(k.removeprefix(code_prefix) for k in keys if k.startswith(code_prefix))
    assert {"fp8lab/train/sm_entry.py", "fp8lab/launch/__init__.py", "fp8lab/__init__.py", "fp8lab/train/entry.py", "requirements.txt",
            "fp8lab/shipped/tokenizer.json", "fp8lab/plan/evidence.json"} <= set(code)
    assert any(k.startswith("fp8lab/shipped/corpus/") for k in code)
    assert not [k for k in code if "__pycache__" in k or k.endswith(".pyc")]
    assert channels["code"] == f"s3://{BUCKET}/{code_prefix.rstrip('/')}"
    reqs = _s3_text(boto, BUCKET, code_prefix + "requirements.txt")
    assert reqs.splitlines() == [*L.job_base_requirements(), f"transformer-engine[pytorch,core_cu13]=={pins()['transformer-engine']}"]
    drivers = channels["sm_drivers"]
    src_json = json.loads(_s3_text(boto, drivers + "/sourcecode.json"))
    assert src_json["entry_script"] == "fp8lab/train/sm_entry.py" and src_json["requirements"] == "requirements.txt"
    assert json.loads(_s3_text(boto, drivers + "/distributed.json"))["process_count_per_node"] == 8
    train_sh = _s3_text(boto, drivers + "/sm_train.sh")
    assert "install_requirements.py requirements.txt" in train_sh and "torchrun_driver.py" in train_sh

    # The dry run builds the same request through the same SDK path (only the timestamp differs).
    dry = L.build_requests(plan)[0]
    assert json.loads(TS.sub("-T", json.dumps(dry, sort_keys=True))) == json.loads(TS.sub("-T", json.dumps(req, sort_keys=True)))
    import threading

    for t in threading.enumerate():
        if t.name == "sagemaker-telemetry":
            t.join(timeout=5)
    assert outside_calls == []  # telemetry opted out by tests/sagemaker/config.yaml: nothing left 127.0.0.1
    out = capsys.readouterr()
    assert "<account-id>" in caplog.text  # the SDK did log the role ARN; the filter masked it
    _assert_clean(out.out, out.err, caplog.text)


def test_relaunch_skips_existing_jobs_and_restarts_failed_ones(aws, capsys):
    sess, rec, boto = aws
    plan = L.plan_sweep(["llama-1b"], ["bf16", "fp8"], [1], role=ROLE, bucket=BUCKET, steps=5)
    first = L.launch(plan, dry_run=False, session=sess)
    assert len(first) == 2 and len(rec["sagemaker.CreateTrainingJob"]) == 2
    again = L.launch(plan, dry_run=False, session=sess)
    assert again == first and len(rec["sagemaker.CreateTrainingJob"]) == 2
    out = capsys.readouterr().out
    assert out.count("skip ") == 2
    _assert_clean(out)

    # moto cannot fail a job; mark the first one Failed in the ListTrainingJobs answer instead.
    def failed(parsed, **_):
        for s in parsed.get("TrainingJobSummaries", []):
            if s["TrainingJobName"] == first[0]:
                s["TrainingJobStatus"] = "Failed"

    boto.events.register("after-call.sagemaker.ListTrainingJobs", failed)
    time.sleep(1.1)  # the SDK's name suffix has 1 s resolution; a real relaunch is never that fast
    third = L.launch(plan, dry_run=False, session=sess)
    assert third[1] == first[1] and third[0] != first[0]
    assert TS.sub("", third[0]) == TS.sub("", first[0]) == plan.jobs[0].name
    assert len(rec["sagemaker.CreateTrainingJob"]) == 3
    assert rec.checked == sum(len(v) for k, v in rec.calls.items() if k.startswith("sagemaker."))


def test_real_launch_refuses_placeholders(aws):
    sess, rec, _ = aws
    plan = L.plan_sweep(["llama-1b"], ["fp8"], [1], role=L.PLACEHOLDER_ROLE, bucket=BUCKET, steps=5)
    with pytest.raises(ValueError, match="placeholders"):
        L.launch(plan, dry_run=False, session=sess)
    assert rec.calls == {}


def _throttle_first(boto, op, n):
    """Answer the first n calls of op with ThrottlingException (injected on the real client)."""
    from botocore.awsrequest import AWSResponse

    seen = {"n": 0}

    def hook(**_):
        if seen["n"] < n:
            seen["n"] += 1
            err = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
                   "ResponseMetadata": {"HTTPStatusCode": 400}}
            return AWSResponse("http://throttled", 400, {}, None), err
        return None

    boto.events.register(f"before-call.sagemaker.{op}", hook)
    return seen


def test_wait_backs_off_on_throttling(aws, capsys):
    sess, rec, boto = aws
    names = L.launch(L.plan_sweep(["llama-1b"], ["fp8"], [1], role=ROLE, bucket=BUCKET, steps=5),
                     dry_run=False, session=sess)
    seen = _throttle_first(boto, "DescribeTrainingJob", 3)
    sleeps = []
    table = L.wait(names, session=sess, poll_s=0, sleep=sleeps.append, progress=False)
    assert seen["n"] == 3 and sleeps == [2.0, 4.0, 8.0]
    assert list(table["status"]) == ["Completed"]
    out = capsys.readouterr().out
    assert out.count("throttled by AWS (ThrottlingException)") == 3 and "Completed" in out
    _assert_clean(out)

    # Throttling that never ends gives up with the AWS error, not a hang.
    _throttle_first(boto, "DescribeTrainingJob", 100)
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError, match="ThrottlingException"):
        L.wait(names, session=sess, poll_s=0, sleep=lambda s: None, progress=False)


def test_wait_and_collect_for_an_unknown_job_are_one_line(aws, capsys):
    sess, rec, boto = aws
    for call in (lambda: L.wait(["fp8lab-nope"], session=sess, poll_s=0, sleep=lambda s: None, progress=False),
                 lambda: L.collect(["fp8lab-nope"], session=sess, sleep=lambda s: None)):
        with pytest.raises(ValueError, match=r"job 'fp8lab-nope' is unknown to SageMaker in us-east-1 \(.*\); "
                                             r"allowed: the names fp8lab launch printed"):
            call()
    capsys.readouterr()
    assert L.main(["wait", "fp8lab-nope", "--poll-s", "0"]) == 1  # the CLI, on the environment's endpoint
    err = capsys.readouterr().err.strip()
    assert err.startswith("fp8lab launch: error: job 'fp8lab-nope' is unknown") and len(err.splitlines()) == 1, err


def test_failed_job_reason_surfaces(aws, capsys, caplog):
    caplog.set_level(logging.INFO)
    sess, rec, boto = aws
    names = L.launch(L.plan_sweep(["llama-1b"], ["bf16", "fp8"], [1], role=ROLE, bucket=BUCKET, steps=5),
                     dry_run=False, session=sess)
    # The reason the entry script writes when TE is missing (this CPU machine has no TE).
    from fp8lab.train import sm_entry

    reason = sm_entry.preflight(["--precision", "fp8", "--backend", "te"])
    if reason is None:
        pytest.skip("Transformer Engine imports here; the missing-TE message cannot be produced")
    calls = {"n": 0}

    # moto reports every job Completed; turn the FP8 job's second poll into SageMaker's Failed answer.
    def fail(parsed, **_):
        if parsed.get("TrainingJobName") == names[1]:
            calls["n"] += 1
            parsed["TrainingJobStatus"] = "InProgress" if calls["n"] == 1 else "Failed"
            parsed["SecondaryStatus"] = "Training" if calls["n"] == 1 else "Failed"
            if calls["n"] > 1:
                parsed["FailureReason"] = f"AlgorithmError: {reason}"

    boto.events.register("after-call.sagemaker.DescribeTrainingJob", fail)
    with pytest.raises(L.TrainingJobFailed) as exc:
        L.wait(names, session=sess, poll_s=0, sleep=lambda s: None, progress=False)
    assert names[1] in str(exc.value) and "Transformer Engine does not import" in str(exc.value)
    assert names[0] not in str(exc.value)
    out = capsys.readouterr().out
    assert "FailureReason: AlgorithmError: fp8lab: FP8 was requested" in out
    assert "InProgress / Training" in out
    table = L.wait(names, session=sess, poll_s=0, sleep=lambda s: None, progress=False, raise_on_failure=False)
    assert list(table["status"]) == ["Completed", "Failed"]
    _assert_clean(out, caplog.text)


def _metrics_rows(job_precision, n=3):
    return [{"step": i, "tokens": 1000 * i, "loss": 5.0 - 0.1 * i, "lr": 3e-4, "grad_norm": 1.0,
             "step_time_s": 0.5, "tokens_per_sec": 8000.0, "tokens_per_sec_per_gpu": 1000.0 + i, "mfu": 0.4,
             "max_mem_gib": 1.0, "precision": job_precision, "backend": "te", "recipe": "delayed",
             "model": "llama-1b", "world_size": 8, "gpu_name": "H100"} for i in range(1, n + 1)]


def test_collect_reads_output_tar_and_falls_back_to_cloudwatch_logs(aws, capsys):
    sess, rec, boto = aws
    names = L.launch(L.plan_sweep(["llama-1b"], ["bf16", "fp8"], [1], role=ROLE, bucket=BUCKET, steps=5),
                     dry_run=False, session=sess)
    # Job 0: the trainer's metrics.jsonl inside output.tar.gz, where SageMaker puts /opt/ml/output/data.
    buf = io.BytesIO()
    payload = "".join(json.dumps(r) + "\n" for r in _metrics_rows("bf16")).encode()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("metrics.jsonl")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    s3 = boto.client("s3")
    s3.put_object(Bucket=BUCKET, Key=f"fp8lab/p5-sweep/output/{names[0]}/output/output.tar.gz", Body=buf.getvalue())
    # Job 1: no archive (e.g. stopped); its metric lines are in CloudWatch Logs.
    logs = boto.client("logs")
    group, stream = "/aws/sagemaker/TrainingJobs", f"{names[1]}/algo-1-1700000000"
    logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName=stream)
    lines = ["Starting training script", "fp8lab-metrics step=1 loss=5.5 tokens_per_sec_per_gpu=1200.5 mfu=0.41 "
             "step_time_s=0.5 lr=0.0003 grad_norm=1.5", "fp8lab-metrics step=2 val_loss=5.25",
             "fp8lab-metrics step=2 loss=5.25 tokens_per_sec_per_gpu=1210 mfu=0.42 step_time_s=0.49 lr=0.0003 grad_norm=1.25"]
    logs.put_log_events(logGroupName=group, logStreamName=stream,
                        logEvents=[{"timestamp": int(time.time() * 1000) + i, "message": m} for i, m in enumerate(lines)])
    df = L.collect(names, session=sess)
    a, b = df[df.job == names[0]], df[df.job == names[1]]
    assert list(a.step) == [1, 2, 3] and set(a.source) == {"s3:output.tar.gz"}
    assert list(a.tokens_per_sec_per_gpu) == [1001.0, 1002.0, 1003.0]
    assert set(b.source) == {"cloudwatch-logs"} and list(b.step) == [1, 2, 2]
    assert b.loss.tolist()[0] == 5.5 and b.val_loss.dropna().tolist() == [5.25]
    assert set(b.precision) == {"fp8"} and set(b.model) == {"llama-1b"}
    assert set(df.instance_count) == {1}


def test_dry_run_opens_no_connection(monkeypatch, capsys):
    import socket

    def refuse(*a, **k):
        raise AssertionError("dry run tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    plan = L.plan_sweep(["llama-1b", "llama-7b"], ["bf16", "fp8"], [2], role=ROLE, bucket=BUCKET, tokens=10**9)
    names = L.launch(plan)
    out = capsys.readouterr().out
    assert len(names) == 4 == out.count("CreateTrainingJob request for")
    assert [TS.sub("", n) for n in names] == plan.names
    assert "TOTAL" in out and "113.07" in out
    _assert_clean(out)
    # The printed requests are the real ones with the account id masked.
    printed = [json.loads(block.split("\n", 1)[1]) for block in re.findall(
        r"--- CreateTrainingJob request for \S+ \(dry run: not sent\) ---\n(.*?\n})", out, flags=re.S)
        for block in ["x\n" + block]]
    assert [p["TrainingJobName"] for p in printed] == names
    assert {p["RoleArn"] for p in printed} == {"arn:aws:iam::<account-id>:role/fp8lab-test-role"}
    for p in printed:
        menv.check_request("CreateTrainingJob", {**p, "RoleArn": ROLE})


def test_torchrun_command_on_each_node_of_a_two_node_job(aws, tmp_path):
    """Run the SDK's own torchrun driver's command builder with the env SageMaker gives node k."""
    sess, rec, boto = aws
    names = L.launch(L.plan_sweep(["llama-1b"], ["fp8"], [2], role=ROLE, bucket=BUCKET, steps=5),
                     dry_run=False, session=sess)
    req = rec["sagemaker.CreateTrainingJob"][0]
    drivers = next(c for c in req["InputDataConfig"] if c["ChannelName"] == "sm_drivers")
    root = drivers["DataSource"]["S3DataSource"]["S3Uri"]
    distributed = _s3_text(boto, root + "/distributed.json")
    entry = json.loads(_s3_text(boto, root + "/sourcecode.json"))["entry_script"]
    # The driver files as uploaded to S3 for this job, so this is the code the job would run.
    bucket, prefix = _split_s3(root)
    local = tmp_path / "sm_drivers"
    for key in ("common/__init__.py", "common/utils.py", "distributed_drivers/__init__.py",
                "distributed_drivers/torchrun_driver.py"):
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        (local / key).write_text(_s3_text(boto, bucket, f"{prefix}/{key}"))
    probe = ("import json, os, sys; sys.path.insert(0, os.environ['DRIVER_DIR']); import torchrun_driver as d; "
             "d.setup_env(); print(json.dumps({'cmd': d.create_commands(), 'env': {k: os.environ.get(k) for k in "
             "('NCCL_PROTO', 'FI_PROVIDER', 'FI_EFA_USE_DEVICE_RDMA', 'NCCL_SOCKET_IFNAME')}}))")
    for rank in (0, 1):
        env = {**os.environ, "DRIVER_DIR": str(local / "distributed_drivers"), "SM_ENTRY_SCRIPT": entry,
               "SM_DISTRIBUTED_CONFIG": distributed, "SM_HPS": json.dumps(req["HyperParameters"]),
               "SM_HOST_COUNT": "2", "SM_MASTER_ADDR": "algo-1", "SM_MASTER_PORT": "7777",
               "SM_CURRENT_HOST_RANK": str(rank), "SM_CURRENT_INSTANCE_TYPE": "ml.p5.48xlarge",
               "SM_NETWORK_INTERFACE_NAME": "eth0"}
        res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout.strip().splitlines()[-1])
        cmd = got["cmd"]
        assert cmd[:6] == ["torchrun", "--nnodes=2", "--nproc_per_node=8", "--master_addr=algo-1",
                           "--master_port=7777", f"--node_rank={rank}"]
        assert cmd[6] == "fp8lab/train/sm_entry.py"
        args = dict(zip(cmd[7::2], cmd[8::2]))
        assert args["--model"] == "llama-1b" and args["--precision"] == "fp8" and args["--steps"] == "5"
        # the layout resolver's choice for P5's H100 80 GB at 16 ranks (fp8lab.plan.layout), not a hand-set guess
        assert args["--micro-batch-size"] == "16" and args["--seq-len"] == "2048" and args["--param-dtype"] == "bf16"
        # The trainer accepts exactly what the driver passes (same parser as `fp8lab train`).
        from fp8lab.plan import lora as lora_plan
        from fp8lab.train.entry import parse_args

        cfg = parse_args(cmd[7:])
        assert (cfg.model, cfg.precision, cfg.backend, cfg.recipe, cfg.steps) == ("llama-1b", "fp8", "te", "delayed", 5)
        assert (cfg.seq_len, cfg.micro_batch_size, cfg.parallel, cfg.fuse, cfg.compile) == (2048, 16, "fsdp", "auto", False)
        assert lora_plan.fuses(cfg) is True  # auto: the fused blocks (no LoRA)
        # The driver's NCCL/EFA settings, identical for BF16 and FP8 jobs.
        assert got["env"] == {"NCCL_PROTO": "simple", "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1",
                              "NCCL_SOCKET_IFNAME": "eth0"}
    assert names


def test_a_model_folder_reaches_the_job_as_the_model_channel(aws, tmp_path):
    """Issue 18: a local model folder is uploaded by the SDK as the ``model`` channel, an s3:// one is
    mounted as it is; the trainer reads it from /opt/ml/input/data/model."""
    from transformers import LlamaConfig

    sess, rec, boto = aws
    cfg = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    cfg.save_pretrained(str(tmp_path / "my-llama"))
    local = _spec(model=str(tmp_path / "my-llama"))
    remote = _spec(model=f"s3://{BUCKET}/models/my-llama", model_config=cfg.to_dict())
    L.launch([local, remote], dry_run=False, session=sess)
    creates = rec["sagemaker.CreateTrainingJob"]
    assert len(creates) == 2
    for req, spec in zip(creates, (local, remote)):
        menv.check_request("CreateTrainingJob", req)
        assert req["HyperParameters"]["model"] == L.MODEL_CHANNEL_PATH
        assert {t["Key"]: t["Value"] for t in req["Tags"]}["fp8lab:model"] == "my-llama"
        assert "my-llama" in req["TrainingJobName"]
        channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in req["InputDataConfig"]}
        assert "model" in channels
    assert channels["model"] == f"s3://{BUCKET}/models/my-llama"  # the s3:// job: as given
    first = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in creates[0]["InputDataConfig"]}
    uploaded = [p["Key"] for p in rec["s3.PutObject"] if p["Key"].endswith("/config.json")]
    assert first["model"].startswith(f"s3://{BUCKET}/") and any(first["model"].endswith(k.rsplit("/config.json", 1)[0])
                                                                 for k in uploaded)
    assert str(tmp_path) not in json.dumps(creates[0]["HyperParameters"])


def test_a_fine_tune_job_takes_the_model_folder_and_the_instruction_data_as_channels(aws, tmp_path):
    """A LoRA fine-tune of a model folder with its own tokenizer on a local instruction JSONL: it plans (the trainer's
    checks, the records read), dry-runs and launches with both channels, the folder as ``model`` and the file as
    ``train``, each uploaded by the SDK; the job trains what was planned (task, LoRA, unfused layers)."""
    from fp8lab.data import sft, tiny_model
    from fp8lab.launch.plan import as_plan

    sess, rec, boto = aws
    folder = tiny_model.build(tmp_path / "my-llama")
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(sft.shipped().read_text().splitlines(keepends=True)[:20]))
    spec = _spec(model=str(folder), data=str(data), fuse=False, instance_count=1,
                 options={"task": "sft", "lora_rank": 8})
    assert spec.plan.config.task == "sft" and spec.plan.config.lora_rank == 8
    plan = L.plan_sweep([str(folder)], ["bf16", "fp8"], [1], role=ROLE, bucket=BUCKET, steps=5, data=str(data),
                        fuse=False, options={"task": "sft", "lora_rank": 8})
    assert "my-llama" in L.format_cost_table(plan)
    dry = L.build_requests(spec)  # the dry run: every AWS call answered in the process
    launched = L.launch([spec], dry_run=False, session=sess)
    [req] = rec["sagemaker.CreateTrainingJob"]
    assert [TS.sub("", n) for n in launched] == [j.name for j in as_plan(spec).jobs]
    for r in (dry[0], req):
        menv.check_request("CreateTrainingJob", r)
        hp = r["HyperParameters"]
        assert (hp["model"], hp["data"]) == (L.MODEL_CHANNEL_PATH, "/opt/ml/input/data/train")
        assert (hp["task"], hp["lora-rank"], hp["fuse"]) == ("sft", "8", "false")
        channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in r["InputDataConfig"]}
        assert {"model", "train"} <= set(channels)  # beside the SDK's own code channels
        assert channels["train"].endswith("/input/train/chats.jsonl")  # the file itself, under the job's prefix
        assert str(tmp_path) not in json.dumps(r)
    keys = [p["Key"] for p in rec["s3.PutObject"]]
    uploaded = next(k for k in keys if k.endswith("/train/chats.jsonl"))
    assert _s3_text(boto, BUCKET, uploaded) == data.read_text()  # the records, as they are
    assert any(k.endswith("/model/tokenizer.json") for k in keys)  # the folder's own tokenizer travels with it
    # the job's identity is the data's content: other records, another job; the same records elsewhere, the same
    moved = tmp_path / "elsewhere" / "chats.jsonl"
    moved.parent.mkdir()
    moved.write_text(data.read_text())
    assert L.job_name(_spec(model=str(folder), data=str(moved), fuse=False, instance_count=1,
                            options={"task": "sft", "lora_rank": 8})) == L.job_name(spec)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(sft.shipped().read_text().splitlines(keepends=True)[20:40]))
    assert L.job_name(_spec(model=str(folder), data=str(other), fuse=False, instance_count=1,
                            options={"task": "sft", "lora_rank": 8})) != L.job_name(spec)
