"""Real Transformer Engine (skipped without a GPU): the fused model's DelayedScaling state goes through
fp8lab.train.te_state on resume (amax histories and scales restored exactly), and a checkpoint whose extra
state was overwritten in place is refused before TE unpickles it, where TE itself would run it."""
from __future__ import annotations

import os
import pickle
import shutil

import pytest
import torch
from te_pickles import shell_payload, tamper_in_place

from fp8lab.train import checkpoint as fckpt
from fp8lab.train import te_state
from fp8lab.fp8.backends import available_backends
from fp8lab.fp8.convert import autocast, convert_model
from fp8lab.train.distributed import DistEnv
from fp8lab.model.models import build_model

pytestmark = pytest.mark.gpu
OPT_IN = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"


def _model():
    torch.manual_seed(0)
    conv = convert_model(build_model("llama-tiny", device="cuda", dtype=torch.bfloat16), backend="te",
                         recipe="delayed", fuse=True)
    return conv, torch.optim.AdamW(conv.parameters(), lr=1e-3)


def test_te_delayed_scaling_state_resumes_through_the_check_and_a_tampered_copy_is_refused(tmp_path, monkeypatch):
    reason = available_backends()["te"]
    if reason is not None:
        pytest.skip(f"te: {reason}")
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    monkeypatch.delenv(OPT_IN, raising=False)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cuda"), initialized_here=False)
    ids = torch.randint(0, 512, (2, 128), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    trained, opt = _model()
    for _ in range(3):
        with autocast("te", "delayed"):
            trained(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    folder = fckpt.save(tmp_path / "ck", 3, trained, opt, {"step": 3}, env)
    keys = [k for k, v in get_model_state_dict(trained).items() if k.endswith("_extra_state") and v.numel()]
    assert keys, "the fused model under DelayedScaling keeps its scaling state in _extra_state"

    fresh, fresh_opt = _model()
    assert fckpt.load(folder, fresh, fresh_opt, env)["step"] == 3
    assert os.environ.get(OPT_IN) is None
    compared = []
    for name in (k[: -len("._extra_state")] for k in keys):  # the modules whose FP8 state was saved
        saved, loaded = trained.get_submodule(name), fresh.get_submodule(name)
        assert loaded.fp8_meta["recipe"] == saved.fp8_meta["recipe"], name
        for role in ("scaling_fwd", "scaling_bwd"):
            if role in saved.fp8_meta:
                assert torch.equal(loaded.fp8_meta[role].amax_history, saved.fp8_meta[role].amax_history), (name, role)
                assert torch.equal(loaded.fp8_meta[role].scale, saved.fp8_meta[role].scale), (name, role)
                compared.append(float(saved.fp8_meta[role].amax_history.abs().sum()))
    assert len(compared) >= 6 and max(compared) > 0  # qkv, proj, mlp of each block, both directions; amaxes seen
    with autocast("te", "delayed"):
        assert torch.isfinite(fresh(input_ids=ids, labels=ids).loss)

    marker = tmp_path / "ran"
    crafted = pickle.dumps(shell_payload(marker))
    tampered = tmp_path / "tampered" / folder.name
    shutil.copytree(folder, tampered)
    tamper_in_place(tampered, f"model.{keys[0]}", crafted)
    fckpt.verify(tampered)  # the manifest's digest covers .metadata only: it still matches
    victim, victim_opt = _model()
    before = {k: v.detach().clone() for k, v in victim.state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(te_state.RefusedState, match=r"__0_0\.distcp: refused the Transformer Engine FP8 state .*posix\.system"):
        fckpt.load(tampered, victim, victim_opt, env)
    assert not marker.exists()
    after = victim.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())

    # the control: TE's own set_extra_state, with its opt-in, runs what these bytes say
    module = victim.get_submodule(keys[0][: -len("._extra_state")])
    monkeypatch.setenv(OPT_IN, "1")
    try:
        module.set_extra_state(torch.frombuffer(bytearray(crafted), dtype=torch.uint8))
    except Exception:  # the command ran before TE found no FP8 state in what it returned
        pass
    assert marker.exists()
