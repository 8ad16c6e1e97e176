"""What a SageMaker training job can take: S3 names, volume, time and price, each as a small check.

Each ``*_problem`` function returns None for a value the target accepts, else what is allowed (the
text after ``allowed:`` in the error), so ``JobSpec`` (and whatever builds jobs after it) reports one
line naming the field. The limits are AWS's:

* S3 bucket names: 3-63 characters of a-z, 0-9, ``.`` and ``-``, starting and ending with a letter or
  digit, no two adjacent periods, not an IP address, not the reserved prefixes ``xn--``, ``sthree-``
  or suffixes ``-s3alias``, ``--ol-s3``, ``.mrap``, ``--x-s3``, ``--table-s3`` (S3 general purpose
  bucket naming rules);
* S3 URIs: ``s3://<bucket>/<key>`` with at most 1024 characters (the CreateTrainingJob ``S3Uri``
  shape, botocore's service model); fp8lab also refuses ``.``/``..``/empty key segments and
  whitespace, which S3 would store as literal names no one meant;
* the storage volume: EBS gp2, at most 16,384 GB (16 TiB, the largest gp2 volume; instance types
  with local NVMe such as P5 mount that instead and may not ask for more than it holds);
* a job's run time: at most 28 days (``MaxRuntimeInSeconds``; SageMaker's longest training job).
"""
from __future__ import annotations

import ipaddress
import re
from typing import Any
from fp8lab.core.validate import is_count

MAX_RUNTIME_S = 28 * 24 * 3600  # SageMaker's longest training job (672 h)
MAX_VOLUME_GB = 16384  # EBS gp2's largest volume (16 TiB)
S3_URI_MAX = 1024  # CreateTrainingJob S3Uri max length (botocore service model)
BUCKET_ALLOWED = ("an S3 bucket name: 3-63 of a-z 0-9 . -, starting and ending with a letter or digit, no '..', "
                  "not an IP address, without s3://")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_RESERVED_PREFIXES = ("xn--", "sthree-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def bucket_problem(name: Any) -> str | None:
    """None for a valid S3 general purpose bucket name, else what is allowed."""
    if not isinstance(name, str) or not _BUCKET.fullmatch(name) or ".." in name:
        return BUCKET_ALLOWED
    try:
        ipaddress.IPv4Address(name)
        return BUCKET_ALLOWED
    except ValueError:
        pass
    if name.startswith(_RESERVED_PREFIXES) or name.endswith(_RESERVED_SUFFIXES):
        return BUCKET_ALLOWED + f" (S3 reserves the prefixes {', '.join(_RESERVED_PREFIXES)} and the suffixes " \
                                f"{', '.join(_RESERVED_SUFFIXES)})"
    return None


def s3_uri_problem(uri: Any, *, need_key: bool = False) -> str | None:
    """None for ``s3://<valid bucket>[/<key>]`` (a key of plain segments), else what is allowed."""
    allowed = "an s3://bucket/prefix URI (a valid bucket name; key segments not empty, '.' or '..'; no spaces; " \
              f"at most {S3_URI_MAX} characters)"
    if not isinstance(uri, str) or not uri.startswith("s3://") or len(uri) > S3_URI_MAX or re.search(r"\s", uri):
        return allowed
    bucket, _, key = uri[len("s3://"):].partition("/")
    if bucket_problem(bucket) is not None:
        return allowed
    segments = key.rstrip("/").split("/") if key.rstrip("/") else []
    if any(s in ("", ".", "..") for s in segments) or (need_key and not segments):
        return allowed
    return None


def volume_problem(gb: Any) -> str | None:
    return (None if is_count(gb) and gb <= MAX_VOLUME_GB else f"an integer in 1..{MAX_VOLUME_GB} (GB; EBS gp2's "
            "largest volume)")


def runtime_problem(est_seconds: float, amount: int, unit: str, what: str) -> str | None:
    """None when a job's estimated time fits one SageMaker job, else the line that says what to change
    (``amount`` of ``unit``, tokens or steps: the job's length as it was asked for)."""
    if est_seconds <= MAX_RUNTIME_S:
        return None
    fit = int(amount * MAX_RUNTIME_S / est_seconds)
    fit -= fit % 10 ** max(0, len(str(fit)) - 3)  # rounded down to 3 digits: a number to type, and within the limit
    return (f"{what}: estimated {est_seconds / 3600:,.0f} h, beyond SageMaker's {MAX_RUNTIME_S // 3600} h (28-day) "
            f"limit for one training job; allowed: at most about {fit:,} {unit} per job at this estimate, or more "
            "instances per job (--instance-counts)")
