"""Rules that were declared twice, now declared once and used by both callers (issue 26)."""
from __future__ import annotations

import pytest

from fp8lab.records import data_format
from fp8lab.model import checks as model_checks
from fp8lab.train.entry import TrainConfig


@pytest.mark.parametrize("value, why", [
    ("dynamic", "; allowed: auto | delayed | current | block | rowwise | rowwise_with_gw_hp | mxfp8, or kind:key=value,... with keys "),
    ("auto:margin=1", "; allowed: auto | delayed"),
    ("delayed:history=16", ": recipe 'delayed:history=16': 'history=16' is not key=value"),
])
def test_the_trainer_and_a_job_refuse_a_recipe_by_one_rule(value, why):
    pytest.importorskip("sagemaker.train")
    from fp8lab import launch as L

    with pytest.raises(ValueError) as trainer:
        TrainConfig(recipe=value)
    with pytest.raises(ValueError) as job:
        L.JobSpec(model="llama-1b", precision="fp8", recipe=value, role=L.PLACEHOLDER_ROLE,
                  bucket=L.PLACEHOLDER_BUCKET, steps=10)
    assert str(trainer.value).startswith(f"--recipe={value!r} is invalid{why}")
    assert str(job.value).startswith(f"JobSpec.recipe={value!r} is invalid{why}")
    assert str(trainer.value).split(" is invalid", 1)[1] == str(job.value).split(" is invalid", 1)[1]


def test_a_folders_weights_are_one_list_the_digest_extends(tmp_path):
    """What counts as weights (user_model builds with from_pretrained) and what the job name hashes."""
    assert set(model_checks.WEIGHTS) < set(model_checks.WEIGHT_GLOBS)
    assert not model_checks.has_weights(tmp_path) and model_checks.weights_digest(tmp_path) is None
    (tmp_path / "pytorch_model.bin").write_bytes(b"weights")
    assert model_checks.has_weights(tmp_path) and model_checks.weights_digest(tmp_path)


def test_whether_a_run_tokenizes_its_data_is_one_rule(tmp_path):
    """run_paths (the token cache must be writable) and ownership (the cache is claimed) ask the same question."""
    text = tmp_path / "a.txt"
    text.write_text("one\n\ntwo\n")
    prepared = tmp_path / "tokens"
    prepared.mkdir()
    (prepared / data_format.MANIFEST).write_text("{}")
    assert data_format.tokenized_here(None) and data_format.tokenized_here(str(text))
    assert not data_format.tokenized_here("hf:some/dataset") and not data_format.tokenized_here(str(prepared))
