"""A real local AWS endpoint for the launch tests: moto's HTTP server, and a strict request checker.

moto accepts almost any CreateTrainingJob, so it only plays the service; the judge is
botocore's SageMaker model (``validate_parameters``) plus the enum / min / max / pattern rules
that botocore does not enforce client-side (``strict_errors``).
"""
from __future__ import annotations

import re
import socket

import regex
from pathlib import Path
from typing import Any

import pytest

CONFIG_YAML = Path(__file__).resolve().parent / "config.yaml"
# Fake credentials that are easy to find if anything ever prints them. The key id has the shape of
# a real one on purpose (the leak checks look for that shape); it is assembled here so that secret
# scanners do not mistake this fake for a committed credential.
FAKE_KEY_ID = "AKIA" + "FP8LABTESTONLY00"
FAKE_SECRET = "fp8labFakeSecretThatMustNeverBePrinted00"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(endpoint: str, home: Path) -> dict[str, str]:
    """Everything the SDK and boto3 read, pinned: endpoint, fake credentials, region, SDK config."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": FAKE_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "aws-config-none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "aws-credentials-none"),
        # The SDK validates the role through IAM when building a ModelTrainer; moto has no such role.
        "SAGEMAKER_VALIDATE_ROLE": "false",
        "SAGEMAKER_ADMIN_CONFIG_OVERRIDE": str(CONFIG_YAML),
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(CONFIG_YAML),
    }


def strict_errors(shape, value: Any, path: str = "") -> list[str]:
    """Enum, length/range and pattern violations of ``value`` against a botocore shape."""
    errs: list[str] = []
    meta = shape.metadata
    t = shape.type_name
    if t == "structure":
        for key, v in value.items():
            if key not in shape.members:
                errs.append(f"{path}.{key}: not a member of {shape.name}")
                continue
            errs += strict_errors(shape.members[key], v, f"{path}.{key}")
    elif t == "list":
        if "min" in meta and len(value) < meta["min"]:
            errs.append(f"{path}: {len(value)} items < min {meta['min']}")
        if "max" in meta and len(value) > meta["max"]:
            errs.append(f"{path}: {len(value)} items > max {meta['max']}")
        for i, v in enumerate(value):
            errs += strict_errors(shape.member, v, f"{path}[{i}]")
    elif t == "map":
        if "max" in meta and len(value) > meta["max"]:
            errs.append(f"{path}: {len(value)} entries > max {meta['max']}")
        for k, v in value.items():
            errs += strict_errors(shape.key, k, f"{path}<key {k}>")
            errs += strict_errors(shape.value, v, f"{path}[{k}]")
    elif t == "string":
        if shape.enum and value not in shape.enum:
            errs.append(f"{path}: {value!r} not in enum of {shape.name}")
        if "min" in meta and len(value) < meta["min"]:
            errs.append(f"{path}: length {len(value)} < min {meta['min']}")
        if "max" in meta and len(value) > meta["max"]:
            errs.append(f"{path}: length {len(value)} > max {meta['max']}")
        # AWS patterns are Java regexes (\p{L}, \p{Alnum}); the `regex` module (a transformers
        # dependency) understands them, Python's `re` does not.
        if "pattern" in meta and not regex.fullmatch(meta["pattern"], value, flags=regex.DOTALL):
            errs.append(f"{path}: {value!r} does not match {meta['pattern']!r}")
    elif t in ("integer", "long", "float", "double"):
        if "min" in meta and value < meta["min"]:
            errs.append(f"{path}: {value} < min {meta['min']}")
        if "max" in meta and value > meta["max"]:
            errs.append(f"{path}: {value} > max {meta['max']}")
    return errs


def check_request(operation: str, params: dict[str, Any]) -> None:
    """Raise AssertionError unless ``params`` is a valid ``operation`` request for SageMaker."""
    import botocore.session
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model("sagemaker").operation_model(operation)
    validate_parameters(params, model.input_shape)  # raises ParamValidationError
    errs = strict_errors(model.input_shape, params)
    assert not errs, "\n".join(errs)


# ---- fixtures, imported by the test modules that talk to the endpoint (only they need moto) ----

BUCKET = "fp8lab-test-bucket"
ROLE = "arn:aws:iam::123456789012:role/fp8lab-test-role"  # moto's account; must never be printed


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    """moto's HTTP server on 127.0.0.1 (free port) with the environment pinned to it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    mp = pytest.MonkeyPatch()
    for k, v in env_for(url, tmp_path_factory.mktemp("awshome")).items():
        mp.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        mp.delenv(k, raising=False)
    yield url
    mp.undo()
    server.stop()


class Recorder:
    """Every API call made through one boto3 session: "service.Operation" -> list of params.

    Every SageMaker request is also judged as it is made (``check_request``): a request that
    breaks the service model fails the test even where the test does not look at it.
    """

    def __init__(self, boto):
        self.calls: dict[str, list[dict]] = {}
        self.checked = 0
        boto.events.register("before-parameter-build.*.*", self._record)

    def _record(self, params, model, **_):
        service = model.service_model.service_name
        self.calls.setdefault(f"{service}.{model.name}", []).append(dict(params))
        if service == "sagemaker":
            check_request(model.name, params)
            self.checked += 1

    def __getitem__(self, op):
        return self.calls.get(op, [])


@pytest.fixture
def aws(endpoint):
    """A clean moto, a bucket, and a SageMaker session whose calls are recorded: (session, recorder, boto3 session)."""
    import urllib.request

    import boto3
    from sagemaker.core.helper.session_helper import Session

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).read()
    boto = boto3.Session(region_name="us-east-1")
    boto.client("s3").create_bucket(Bucket=BUCKET)
    rec = Recorder(boto)
    return Session(boto_session=boto, default_bucket=BUCKET), rec, boto


ACCOUNT_CONTEXTS = (r"arn:aws[\w-]*:[\w-]*:[\w-]*:(\d{12})",  # any ARN
                    r"(\d{12})\.dkr\.ecr\.",  # an ECR registry host
                    r"sagemaker-[a-z]{2}(?:-[a-z]+)+-\d-(\d{12})")  # the SDK's default bucket name


def assert_clean(public_accounts: set[str], *texts: str) -> None:
    """No credential, secret or (non-public) account id in anything shown to the user."""
    for text in texts:
        assert FAKE_KEY_ID not in text and FAKE_SECRET not in text
        assert "123456789012" not in text  # moto's account, present in every ARN moto returns
        assert not re.search(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])", text), "access key id leaked"
        for pattern in ACCOUNT_CONTEXTS:
            for acct in re.findall(pattern, text):
                assert acct in public_accounts, f"account id {acct} leaked"
