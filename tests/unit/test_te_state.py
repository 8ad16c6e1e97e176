"""fp8lab.train.te_state and the resume path: Transformer Engine's pickled FP8 state is decoded by fp8lab's
allowlisting unpickler before TE sees it; a crafted one is refused and nothing in it runs (CPU: TE's
recipe module and a TE module are stand-ins, tests/helpers/te_pickles.py)."""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import warnings
from types import SimpleNamespace

import pytest
import torch
from te_pickles import Payload, install_standin_te, shell_payload, tamper_in_place, te_shaped
from torch import nn

from fp8lab.train import checkpoint as fckpt
from fp8lab.train import te_state
from fp8lab.train.distributed import DistEnv

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), initialized_here=False)
KEY = "model.0._extra_state"


@pytest.fixture
def te(monkeypatch):
    return install_standin_te(monkeypatch)


def test_a_te_shaped_state_is_decoded_and_pickled_again_from_data(te):
    saved = te_shaped(te.recipe.DelayedScaling(amax_history_len=16, margin=1), local_recipes=(te.recipe.MMParams(),))
    value = torch.frombuffer(bytearray(pickle.dumps(saved)), dtype=torch.uint8)
    again = pickle.loads(te_state.reencoded(value).numpy().tobytes())  # what TE then unpickles
    for state in (te_state.decode(value.numpy().tobytes()), again):
        assert set(state) == set(saved)
        assert type(state["recipe"]) is te.recipe.DelayedScaling and state["recipe"] == saved["recipe"]
        assert state["recipe"].fp8_format is te.recipe.Format.HYBRID
        for k in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"):
            assert type(state[k]) is torch.Tensor and torch.equal(state[k], saved[k])
        assert state["extra_fp8_variables"] == saved["extra_fp8_variables"]
    empty = torch.empty(0, dtype=torch.uint8)
    assert te_state.reencoded(empty) is empty  # a stateless recipe's, or a module before its first FP8 step


def _crafted(te, marker):
    """name -> (pickle bytes, the global the refusal names)."""
    inner = pickle.dumps(shell_payload(marker), protocol=2)  # torch's storage bytes: a legacy torch.save
    gadget = te_shaped(te.recipe.DelayedScaling(), x=Payload(os.system, f"touch {marker}"))
    return {
        "os.system": (pickle.dumps(shell_payload(marker)), "posix.system"),
        "builtins.eval": (pickle.dumps(Payload(eval, f"open({str(marker)!r}, 'w')")), "builtins.eval"),
        "builtins.exec": (pickle.dumps(Payload(exec, f"open({str(marker)!r}, 'w')")), "builtins.exec"),
        "subprocess": (pickle.dumps(Payload(subprocess.check_call, ["touch", str(marker)])), "subprocess.check_call"),
        "unlisted module": (pickle.dumps(Payload(shutil.rmtree, str(marker.parent / "keep"))), "shutil.rmtree"),
        "nested in a valid state": (pickle.dumps(gadget), "posix.system"),
        "an unlisted recipe-module class": (pickle.dumps(Payload(te.recipe.Recipe)), "transformer_engine.common.recipe.Recipe"),
        # torch's own storage loader reads these bytes with weights_only=False
        "a tensor storage": (pickle.dumps(Payload(torch.storage._load_from_bytes, inner)), "posix.system"),
    }


@pytest.mark.parametrize("case", ["os.system", "builtins.eval", "builtins.exec", "subprocess", "unlisted module",
                                  "nested in a valid state", "an unlisted recipe-module class", "a tensor storage"])
def test_a_crafted_state_is_refused_and_nothing_runs(te, tmp_path, case):
    marker = tmp_path / "ran"
    (tmp_path / "keep").mkdir()
    data, name = _crafted(te, marker)[case]
    value = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    with pytest.raises(te_state.RefusedState, match=name.replace(".", r"\.")):
        te_state.reencoded(value)
    assert not marker.exists() and (tmp_path / "keep").is_dir()


def test_a_build_on_an_allowed_global_changes_nothing_shared(te):
    """BUILD sets attributes on what is on the stack: here TE's DelayedScaling class itself, by slot state."""
    data = b"\x80\x04ctransformer_engine.common.recipe\nDelayedScaling\nN}X\x04\x00\x00\x00evilK\x01s\x86b."
    assert pickle.loads(data) is te.recipe.DelayedScaling and te.recipe.DelayedScaling.evil == 1  # plain pickle does
    del te.recipe.DelayedScaling.evil
    with pytest.raises(te_state.RefusedState, match="not a pickle of data"):
        te_state.decode(data)
    assert not hasattr(te.recipe.DelayedScaling, "evil")
    with pytest.raises(te_state.RefusedState, match="Format that does not exist"):
        te_state.decode(pickle.dumps(Payload(te.recipe.Format, te.recipe._FormatHelper(1, 2))))
    with pytest.raises(te_state.RefusedState, match="persistent id"):
        te_state.decode(b"\x80\x04X\x01\x00\x00\x00aQ.")


def test_what_is_not_plain_data_is_refused(te):
    recipe = te.recipe.DelayedScaling()
    recipe.__dict__["not_a_field"] = 1
    with warnings.catch_warnings():  # TypedStorage is deprecated: torch's tensor pickles still use it
        warnings.simplefilter("ignore", UserWarning)
        storage = torch.storage.TypedStorage(2, dtype=torch.float32)
    cases = {
        "DelayedScaling built in a way pickle never builds it":
            b"\x80\x04ctransformer_engine.common.recipe\nDelayedScaling\nK\x01\x85\x81}b.",  # NEWOBJ with an argument
        "a function, which is not data": b"\x80\x04}X\x01\x00\x00\x00actorch._utils\n_rebuild_tensor_v2\ns.",
        "a type, which is not data": b"\x80\x04ctransformer_engine.common.recipe\nDelayedScaling\n.",
        "a TypedStorage, which is not data": pickle.dumps({"s": storage}),
        "a tensor that is not a plain one": pickle.dumps({"t": torch.ones(2, requires_grad=True)}),
        "attributes this Transformer Engine does not have": pickle.dumps({"recipe": recipe}),
    }
    for reason, data in cases.items():
        with pytest.raises(te_state.RefusedState, match=reason):
            te_state.decode(data)
    with pytest.raises(te_state.RefusedState, match="where TE pickles a dict"):
        te_state.reencoded(torch.frombuffer(bytearray(pickle.dumps([1.0])), dtype=torch.uint8))


def test_only_te_modules_extra_state_is_checked(te):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = nn.Sequential(checkpoint_wrapper(te.pytorch.Linear(4, te.recipe.DelayedScaling())), nn.Linear(4, 4))
    owners = te_state.owners(model)  # by state-dict name: activation checkpointing's wrapper is not in it
    assert "0._extra_state" in model.state_dict()
    assert te_state.is_te(owners["0"]) and not te_state.is_te(owners["1"]) and te_state.is_te(None)


def _trained(te, steps=3):
    torch.manual_seed(0)
    model = nn.Sequential(te.pytorch.Linear(4, te.recipe.DelayedScaling(amax_history_len=8)), nn.ReLU(), nn.Linear(4, 4))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    return model, opt


def _fresh(te):
    model = nn.Sequential(te.pytorch.Linear(4, te.recipe.DelayedScaling(amax_history_len=8)), nn.ReLU(), nn.Linear(4, 4))
    return model, torch.optim.AdamW(model.parameters())


def test_a_te_checkpoint_resumes_through_the_check(te, tmp_path, monkeypatch):
    monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)
    trained, opt = _trained(te)
    fckpt.save(tmp_path, 3, trained, opt, {"step": 3}, ENV)
    fresh, fresh_opt = _fresh(te)
    assert fresh[0].get_extra_state().numel() == 0  # as TE's: empty before the first FP8 forward
    assert fckpt.load(fckpt.step_dir(tmp_path, 3), fresh, fresh_opt, ENV)["step"] == 3
    assert torch.equal(fresh[0].amax, trained[0].amax) and torch.equal(fresh[0].scale, trained[0].scale)
    assert fresh[0].recipe == trained[0].recipe
    torch.testing.assert_close(fresh[2].weight, trained[2].weight, atol=0, rtol=0)
    assert "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE" not in os.environ


def test_a_checkpoint_tampered_in_place_is_refused_before_anything_loads(te, tmp_path):
    """The digest in fp8lab's manifest covers DCP's .metadata, not the tensors: it still matches."""
    marker = tmp_path / "ran"
    trained, opt = _trained(te)
    folder = fckpt.save(tmp_path / "ck", 3, trained, opt, {"step": 3}, ENV)
    crafted = pickle.dumps(shell_payload(marker))
    tamper_in_place(folder, KEY, crafted)
    fckpt.verify(folder)
    files = sorted(p.name for p in folder.iterdir())

    # what TE itself would do with these bytes (the old path): the command runs
    control, _ = _fresh(te)
    os.environ["NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"] = "1"
    try:
        control[0].set_extra_state(torch.frombuffer(bytearray(crafted), dtype=torch.uint8))
    except Exception:
        pass
    finally:
        del os.environ["NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"]
    assert marker.exists()
    marker.unlink()

    fresh, fresh_opt = _fresh(te)
    before = {k: v.clone() for k, v in fresh.state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(te_state.RefusedState) as err:
        fckpt.load(folder, fresh, fresh_opt, ENV)
    message = str(err.value)
    assert message.startswith("step_00000003/__0_0.distcp: refused the Transformer Engine FP8 state of '0'")
    assert "posix.system" in message and "nothing loaded or deleted: delete step_00000003" in message
    assert not marker.exists()
    after = fresh.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items()) and not fresh[0].used
    assert not fresh_opt.state  # AdamW's moments not filled either
    assert sorted(p.name for p in folder.iterdir()) == files


def _checkpointer(te, root, model, opt, logged):
    from fp8lab.train.components import Checkpointer

    c = SimpleNamespace(resume=True, resume_with_new_settings=False, checkpoint_every=2, keep_checkpoints=5)
    paths = SimpleNamespace(checkpoint_dir=root, output_dir=root.parent)
    return Checkpointer(c, ENV, paths, model, opt, {}, {}, logged.append)


def test_resume_skips_a_tampered_checkpoint_with_its_reason_and_stops_when_none_loads(te, tmp_path):
    marker, root = tmp_path / "ran", tmp_path / "checkpoints"
    trained, opt = _trained(te)
    for step in (2, 4):
        fckpt.save(root, step, trained, opt, {"train_state": {"step": step}, "fingerprint": {}}, ENV, keep=5)
    tamper_in_place(fckpt.step_dir(root, 4), KEY, pickle.dumps(shell_payload(marker)))

    logged: list[str] = []
    fresh, fresh_opt = _fresh(te)
    assert _checkpointer(te, root, fresh, fresh_opt, logged).resume() == (2, {})
    assert torch.equal(fresh[0].amax, trained[0].amax)
    assert len(logged) == 1 and "checkpoint step_00000004 does not load (RefusedState: step_00000004/__0_0.distcp" in logged[0]
    assert "posix.system" in logged[0]

    tamper_in_place(fckpt.step_dir(root, 2), KEY, pickle.dumps(Payload(eval, "1")))
    fresh, fresh_opt = _fresh(te)
    with pytest.raises(ValueError, match=r"no checkpoint in 'checkpoints' loads .*builtins\.eval.*start afresh"):
        _checkpointer(te, root, fresh, fresh_opt, []).resume()
    assert not marker.exists() and {p.name for p in root.iterdir()} == {"step_00000002", "step_00000004"}
