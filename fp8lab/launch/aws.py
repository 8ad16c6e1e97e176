"""The calls to AWS: launch the jobs (skipping ones already launched), wait for them, collect their metrics.

Throttled calls back off and retry (``call_with_backoff``); everything printed is redacted.
"""
from __future__ import annotations

import json
import re
import tarfile
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from fp8lab.core.hardware import PLACEHOLDER_BUCKET, PLACEHOLDER_ROLE
from fp8lab.records.metrics import LINE_PREFIX
from fp8lab.launch.metric_line import parse_metric_line
from fp8lab.launch.plan import SweepPlan, as_plan, format_cost_table
from fp8lab.launch.redaction import redact, redacted_sdk_logs
from fp8lab.launch.image import installs_te
from fp8lab.launch.requests import (build_requests, build_trainer, request_diff, sdk_config_checked_once, staged_source,
                                    submit)
from fp8lab.launch.spec import JobSpec

THROTTLE_CODES = {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded",
                  "ProvisionedThroughputExceededException", "SlowDown"}
TERMINAL = {"Completed", "Failed", "Stopped"}


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


def launch(spec_or_plan: JobSpec | SweepPlan | Sequence[JobSpec], dry_run: bool = True, *,
           skip_existing: bool = True, relaunch_failed: bool = True, session=None, show_requests: int | None = None,
           out: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Submit the plan's jobs (or, with ``dry_run``, print their requests and cost and call nothing).

    Re-running is safe: a job whose plan name already has a SageMaker job that is running or
    completed is skipped and its existing name returned (``relaunch_failed`` starts failed or
    stopped ones again). Returns the SageMaker job names, in plan order. ``show_requests``
    limits the dry run's full printouts (the others are shown as their differences to the first).
    """
    plan = as_plan(spec_or_plan)
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
    with tempfile.TemporaryDirectory(prefix="fp8lab-src-") as tmp, redacted_sdk_logs(), sdk_config_checked_once():
        staged: dict[tuple, Path] = {}
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
                out(f"skip {job.name}: already launched as {live[0]['TrainingJobName']} "
                    f"({live[0]['TrainingJobStatus']})")
                names.append(live[0]["TrainingJobName"])
                continue
            trainer = build_trainer(spec,
                                    staged_source(staged, tmp, installs_te(spec), spec.framework_version,
                                                  spec.image_uri,
                                                        spec.plan.config.tracker), sess)
            call_with_backoff(lambda: submit(trainer, spec), **backoff)
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


def _describe(sm, name: str, backoff: dict) -> dict:
    """DescribeTrainingJob of ``name``; a job SageMaker does not know is one line naming it."""
    from botocore.exceptions import ClientError

    try:
        return call_with_backoff(lambda: sm.describe_training_job(TrainingJobName=name), **backoff)
    except ClientError as err:
        if _code(err) in ("ValidationException", "ResourceNotFound", "ResourceNotFoundException"):
            raise ValueError(f"job {name!r} is unknown to SageMaker in {sm.meta.region_name} ({_code(err)}); "
                             "allowed: the names fp8lab launch printed, in the region it launched them "
                             "(--region)") from None
        raise


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
    bar = None  # made once SageMaker has answered: an unknown job or no credentials stay one line
    try:
        while True:
            for name in names:
                if name in state and state[name]["status"] in TERMINAL:
                    continue
                d = _describe(sm, name, backoff)
                if bar is None:
                    bar = tqdm(total=len(names), desc="jobs done", unit="job", disable=not progress)
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
        if bar is not None:
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
              "filterPattern": f'"{LINE_PREFIX}"', **({"nextToken": token} if token else {})}
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
        d = _describe(sm, name, backoff)
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
