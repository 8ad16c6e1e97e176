"""Redaction: nothing printed may carry an account id or a key.

``redact`` replaces account ids (in ARNs, ECR hosts, the SDK's default bucket names) and access
key ids by placeholders; ``redacted_sdk_logs`` applies it to the SDK's log records while it works.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
from typing import Iterator

from fp8lab.launch.spec import sdk_config_file


@functools.lru_cache(maxsize=None)
def _public_registry_accounts() -> frozenset[str]:
    """Account ids of AWS's public Deep Learning Container registries (part of every image URI)."""
    path = sdk_config_file("pytorch.json")
    if path is None:
        raise FileNotFoundError("the SageMaker SDK's image_uri_config/pytorch.json is missing: reinstall sagemaker")
    data = json.loads(path.read_text())
    out: set[str] = set()
    for scope in data.values():
        for v in scope.get("versions", {}).values():
            out.update(v.get("registries", {}).values())
    return frozenset(out)


# Where account ids appear in what the SDK and fp8lab print: ARNs, ECR hosts, the SDK's default
# bucket name, and any name a 12-digit run is part of (a bucket "acme-123456789012-ml": joined to a
# letter, '-' or '_', or to '.' and a letter). Plain numbers (a token count of 288000000000, the
# digits of 0.000300000000) are left alone.
_ACCOUNT = re.compile(r"(?P<pre>arn:aws[\w-]*:[\w-]*:[\w-]*:)(?P<id>\d{12})(?!\d)"
                      r"|(?<![\w-])(?P<id2>\d{12})(?P<post>\.dkr\.ecr\.)"
                      r"|(?P<pre3>sagemaker-[a-z]{2}(?:-[a-z]+)+-\d-)(?P<id3>\d{12})(?!\d)"
                      r"|(?<!\d)(?:(?<=[A-Za-z_-])|(?<=[A-Za-z]\.))(?P<id4>\d{12})(?!\d)"
                      r"|(?<![\d.])(?P<id5>\d{12})(?=[A-Za-z_-]|\.[A-Za-z])")
_KEY = re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")


def redact(text: str) -> str:
    """Replace account ids in ARNs, ECR hosts, bucket and other names (except AWS's public image
    registries, part of every image URI) and access key ids by placeholders."""
    public = _public_registry_accounts()

    def sub(m: re.Match) -> str:
        if m.group("id"):
            return m.group("pre") + "<account-id>"
        if m.group("id2"):
            return m.group(0) if m.group("id2") in public else "<account-id>" + m.group("post")
        if m.group("id3"):
            return m.group("pre3") + "<account-id>"
        return m.group(0) if m.group(0) in public else "<account-id>"  # a name holding an account id

    return _KEY.sub("<access-key-id>", _ACCOUNT.sub(sub, text))


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), ()
        return True


@contextlib.contextmanager
def redacted_sdk_logs() -> Iterator[None]:
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
