"""The command line: ``fp8lab launch {plan,dry-run,launch,wait,collect}`` (also ``python -m fp8lab.launch``)."""
from __future__ import annotations

import argparse
import sys

from fp8lab.hardware import INSTANCES, PLACEHOLDER_BUCKET, PLACEHOLDER_ROLE
from fp8lab.launch.aws import TrainingJobFailed, collect, launch, wait
from fp8lab.launch.redaction import redact
from fp8lab.launch.plan import SweepPlan, format_cost_table, plan_sweep
from fp8lab.launch.spec import MAX_INSTANCES_PER_JOB
from fp8lab.options import PRECISIONS
from fp8lab.validate import AUTO, OneLineParser, check_writable_file, parse_count, positive_float


def auto_or_integer(text: str):
    """A layout option on the command line: "auto" (fp8lab.layout picks it for the instance's GPU) or an integer."""
    return AUTO if text == AUTO else int(text)


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["llama-1b", "llama-7b"])
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--instance-counts", nargs="+", type=int, default=[1, 2, 4])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tokens", type=parse_count, help="training tokens per job, e.g. 1e9 (default 1e9 unless --steps)")
    g.add_argument("--steps", type=parse_count, help="optimizer steps per job (instead of --tokens)")
    p.add_argument("--instance-type", default="ml.p5.48xlarge", choices=sorted(INSTANCES))
    p.add_argument("--role", default=PLACEHOLDER_ROLE, help="SageMaker execution role ARN")
    p.add_argument("--bucket", default=PLACEHOLDER_BUCKET)
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--price-per-hour", type=positive_float, help="USD per instance-hour (default: see PRICE_SOURCE)")
    p.add_argument("--micro-batch-size", type=auto_or_integer, default=AUTO,
                   help="sequences per GPU per micro-step; auto (default): the largest that fits the instance's GPU")
    p.add_argument("--seq-len", type=auto_or_integer, default=AUTO, help="tokens per sequence; auto (default): 2048")
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
        print(redact(f"fp8lab launch: error: {exc}"), file=sys.stderr)  # a bucket may hold an account id
        return 1
    except Exception as exc:  # noqa: BLE001 - AWS's own errors (no credentials, access denied): one line, redacted
        if type(exc).__module__.split(".")[0] != "botocore":
            raise
        print(redact(f"fp8lab launch: error: AWS refused the call ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                     "check your credentials (aws configure), --region and the role's permissions"), file=sys.stderr)
        return 1
    return 0
