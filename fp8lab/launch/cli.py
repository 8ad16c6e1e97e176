"""The command line: ``fp8lab launch {plan,dry-run,launch,wait,collect}`` (also ``python -m fp8lab.launch``)."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from fp8lab.core.hardware import INSTANCES, PLACEHOLDER_BUCKET, PLACEHOLDER_ROLE
from fp8lab.core.probes import check_writable_file
from fp8lab.core.prices import LOOKUP, price_arg
from fp8lab.core.validate import OneLineParser, parse_count
from fp8lab.launch.image import DEFAULT_VERSION, IMAGES
from fp8lab.launch.aws import TrainingJobFailed, collect, launch, wait
from fp8lab.launch.plan import SweepPlan, format_cost_table, plan_sweep
from fp8lab.launch.redaction import redact
from fp8lab.launch.spec import JOB_DEFAULTS, MAX_INSTANCES_PER_JOB, SPEC_OPTIONS, JobSpec
from fp8lab.model.models import MODEL_CONFIGS
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.options import PRECISIONS, add_arguments, from_text

# the trainer options a job's flags set, from the trainer's schema (TrainConfig's fields; model and
# precision are the sweep's --models / --precisions)
TRAINER_FLAGS = (tuple(name for name in SPEC_OPTIONS if name not in ("model", "precision"))
                 + ("checkpoint_every", "tracker", "memory"))


def _trainer_options(args: argparse.Namespace) -> dict:
    """The trainer options given on the command line, converted by their fields (fp8lab.plan.options.from_text)."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    return {name: from_text(fields[name], getattr(args, name)) for name in TRAINER_FLAGS
            if getattr(args, name) is not None}


DEFAULT_TOKENS = 24 * 10**9  # the source's one epoch; notebook 04 and the results' cost figures price the same budget


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["llama-1b", "llama-7b"], metavar="MODEL",
                   help=f"models to plan: {', '.join(MODEL_CONFIGS)}, a local model folder or s3://... of one "
                        "(default: llama-1b llama-7b)")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS,
                   help="one job per precision, otherwise identical (default: %(default)s)")
    p.add_argument("--instance-counts", nargs="+", type=int, default=[1, 2, 4], metavar="N",
                   help="instances per job, one job per count (default: 1 2 4)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tokens", type=parse_count,
                   help=f"training tokens per job, e.g. 1e9 (default {DEFAULT_TOKENS // 10**9}e9, the source's one "
                        "epoch, as in notebook 04, unless --steps)")
    g.add_argument("--steps", type=parse_count, help="optimizer steps per job (instead of --tokens)")
    p.add_argument("--instance-type", default="ml.p5.48xlarge", choices=sorted(INSTANCES),
                   help="SageMaker instance type (default: %(default)s; FP8 needs FP8 tensor cores: p5, p6)")
    p.add_argument("--role", default=PLACEHOLDER_ROLE,
                   help="SageMaker execution role ARN (default: AWS's documentation placeholder, for plans and dry "
                        "runs)")
    p.add_argument("--bucket", default=PLACEHOLDER_BUCKET,
                   help="S3 bucket for code, outputs and checkpoints (default: AWS's documentation placeholder)")
    p.add_argument("--region", default="us-east-1", help="AWS region of the jobs (default: %(default)s)")
    p.add_argument("--price-per-hour", "--price", type=price_arg, metavar="USD|lookup",
                   help=f"USD per instance-hour, or {LOOKUP!r}: the on-demand SageMaker training price of the instance "
                        "type and --region from the AWS Price List API (needs credentials; says so when it cannot). "
                        "Default: the assumed price of fp8lab.core.hardware with its date; every cost is printed "
                        "beside the price and its date")

    g = p.add_argument_group("trainer options (as for fp8lab train; every job of the sweep gets them)")
    add_arguments(g, TrainConfig, only=TRAINER_FLAGS, defaults=JOB_DEFAULTS)
    p.add_argument("--spot", action="store_true",
                   help="managed spot training (cheaper, may wait; checkpoints resume it)")
    p.add_argument("--install-te", action="store_true",
                   help="add transformer-engine[pytorch] to the job's requirements (if the image lacks it)")
    p.add_argument("--image-uri", default=None,
                   help="the training image by its full URI (default: the newest SageMaker PyTorch image with TE "
                        "compiled in that fp8lab is tested with, fp8lab.launch.image: "
                        f"{IMAGES[DEFAULT_VERSION].name}); an image fp8lab.launch.image does not list gets the pinned "
                        "TE built in the job")
    p.add_argument("--mlflow-tracking-uri", default=None,
                   help="with --tracker mlflow: the jobs' MLFLOW_TRACKING_URI (SageMaker's managed MLflow: the "
                        "tracking server's ARN); default: a local MLflow store in each job's output")
    p.add_argument("--allow-large", action="store_true",
                   help=f"allow more than {MAX_INSTANCES_PER_JOB} instances per job (a sanity limit against typos)")


def _plan_from(args: argparse.Namespace) -> SweepPlan:
    size = ({"tokens": args.tokens} if args.tokens is not None else
            {"steps": args.steps} if args.steps is not None else {"tokens": DEFAULT_TOKENS})
    return plan_sweep(args.models, args.precisions, args.instance_counts, price_per_hour=args.price_per_hour,
                      instance_type=args.instance_type, role=args.role, bucket=args.bucket, region=args.region,
                      spot=args.spot, install_te=args.install_te, allow_large=args.allow_large,
                      **({"image_uri": args.image_uri} if args.image_uri else {}),
                      **({"mlflow_tracking_uri": args.mlflow_tracking_uri} if args.mlflow_tracking_uri else {}),
                      **_spec_fields(_trainer_options(args)), **size)


def _spec_fields(options: dict) -> dict:
    """The trainer options as JobSpec takes them: its own fields by name, the others in ``options``."""
    own = {f.name for f in dataclasses.fields(JobSpec)}
    other = {k: v for k, v in options.items() if k not in own}
    return {**{k: v for k, v in options.items() if k in own}, **({"options": other} if other else {})}


def skip_unused_iri_grammar() -> bool:
    """Import jsonschema without ``rfc3987_syntax`` when this process has imported neither (True: skipped).

    The SageMaker SDK validates its config with ``jsonschema.validate`` and no format checker, so jsonschema's "iri"
    format check, whose grammars ``rfc3987_syntax`` compiles when imported (about a second on a 2-core machine), is
    never used; ``fp8lab launch dry-run`` and ``launch`` skip that import in their own process, where nothing else
    uses jsonschema. ``rfc3987_syntax`` itself still imports afterwards."""
    if "jsonschema" in sys.modules or "rfc3987_syntax" in sys.modules:
        return False
    sys.modules["rfc3987_syntax"] = None  # an import of it raises ImportError, which jsonschema expects and skips
    try:
        import jsonschema  # noqa: F401
    finally:
        del sys.modules["rfc3987_syntax"]
    return True


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="fp8lab launch", description="BF16 vs FP8 sweeps as SageMaker jobs.")
    sub = parser.add_subparsers(dest="action", required=True)
    for action, help_ in (("plan", "show jobs, names, time and cost"),
                          ("dry-run", "print each exact CreateTrainingJob request; call nothing"),
                          ("launch", "submit the jobs (skips ones already launched)")):
        _plan_args(sub.add_parser(action, help=help_))
    for action in ("wait", "collect"):
        p = sub.add_parser(action, help=f"{action} for jobs by name")
        p.add_argument("jobs", nargs="+", help="job names, as launch printed them")
        p.add_argument("--region", default=None, help="AWS region of the jobs (default: the SDK's configured region)")
        if action == "wait":
            p.add_argument("--poll-s", type=float, default=60.0, help="seconds between status checks (default: 60)")
        else:
            p.add_argument("--csv", help="write the table here")
    args = parser.parse_args(argv)
    try:
        if args.action in ("plan", "dry-run", "launch"):
            plan = _plan_from(args)
            if args.action == "plan":
                print(redact(format_cost_table(plan)))  # a given image URI may name an account
            else:
                skip_unused_iri_grammar()  # this command's own process: see there
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
