"""Shared test set-up: the ``gpu`` marker skips, with a reason, where no CUDA GPU exists; the
``browser`` marker skips where no Chromium (and its driver) or no Selenium is installed; the
``prepared`` fixture is the shipped corpus tokenized once per test module."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

# Helpers shared across the test folders import by module name: tests/helpers/fake_runs.py (fake trainer
# runs and result files) and tests/sagemaker/moto_env.py (moto's endpoint and the request checker). The
# folders are no packages, so ``sagemaker`` never shadows the real SDK
for _d in ("helpers", "sagemaker"):
    sys.path.insert(0, str(Path(__file__).resolve().parent / _d))

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _gpu_reason() -> str | None:
    try:
        import torch
    except Exception as exc:  # pragma: no cover - torch is a hard dependency
        return f"torch does not import: {exc}"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (none on this machine; run on the H200 through the device tool)"
    return None


def chromium_paths() -> tuple[str | None, str | None]:
    """(browser, driver): $FP8LAB_CHROMIUM / $FP8LAB_CHROMEDRIVER, else Debian's on the PATH."""
    browser = shutil.which(os.environ.get("FP8LAB_CHROMIUM") or "chromium") or shutil.which("chromium-browser")
    driver = shutil.which(os.environ.get("FP8LAB_CHROMEDRIVER") or "chromedriver")
    return browser, driver


def _browser_reason() -> str | None:
    for module, what in (("selenium", "the selenium package"), ("jupyterlab", "JupyterLab")):
        if importlib.util.find_spec(module) is None:
            return f"needs {what} (bash scripts/setup.sh installs it)"
    browser, driver = chromium_paths()
    if not browser or not driver:
        missing = " and ".join(n for n, p in (("chromium", browser), ("chromedriver", driver)) if not p)
        return (f"needs Chromium and its driver ({missing} not found; on Debian, as root: apt-get install "
                "chromium chromium-driver, which .ci/run does; or set FP8LAB_CHROMIUM / FP8LAB_CHROMEDRIVER)")
    return None


def pytest_collection_modifyitems(config, items):
    reasons = {"gpu": _gpu_reason(), "browser": _browser_reason()}
    for marker, reason in reasons.items():
        if reason is None:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The shipped corpus tokenized with the 512-token tokenizer (one copy per test module)."""
    from fp8lab.data import tokens as fdata

    out = tmp_path_factory.mktemp("tokens")
    fdata.prepare_data(None, out, None, vocab_size=512)
    return out


@pytest.fixture
def capture_trained(monkeypatch):
    """The converted model as it finished training (what fp8lab.train.export.save_hf_model exported), by key "inner"."""
    from fp8lab.train import export as fexport

    seen = {}
    real = fexport.save_hf_model

    def spy(model, inner, conversion, *a, **k):
        seen["inner"] = inner
        return real(model, inner, conversion, *a, **k)

    monkeypatch.setattr(fexport, "save_hf_model", spy)
    return seen


@pytest.fixture
def gpu_record(request):
    """record(**fields): one JSON line per call into $FP8LAB_GPU_RESULTS/<test module>.jsonl (when set), so a
    GPU run's measured figures come back as a result file with the test that produced them."""
    import json

    folder = os.environ.get("FP8LAB_GPU_RESULTS")

    def record(**fields):
        if folder:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{request.module.__name__.rpartition('.')[2]}.jsonl"), "a") as f:
                f.write(json.dumps({"test": request.node.nodeid, **fields}) + "\n")

    return record
