"""fp8lab.train.checkpoint with module state that changes size, as Transformer Engine's FP8 state does."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from fp8lab.train import checkpoint as fckpt
from fp8lab.train.distributed import DistEnv


class SizedState(nn.Linear):
    """Keeps its scaling history in ``_extra_state`` as a uint8 tensor: empty until used, like TE's."""

    def __init__(self):
        super().__init__(4, 4)
        self.history: list[float] = []

    def forward(self, x):
        self.history.append(float(x.abs().max()))
        return super().forward(x)

    def get_extra_state(self):
        return torch.tensor(list(bytes(repr(self.history), "ascii")), dtype=torch.uint8) if self.history \
            else torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state):
        self.env_at_load = os.environ.get("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE")
        if isinstance(state, torch.Tensor) and state.numel():
            self.history = eval(bytes(state.tolist()).decode("ascii"))  # test data only: a list of floats


@pytest.mark.parametrize("before", [None, "0"])
def test_a_fresh_model_resumes_extra_state_of_another_size(tmp_path, monkeypatch, before):
    """Also: TE's opt-in for its pickled delayed-scaling state holds during this load only."""
    if before is None:
        monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)
    else:
        monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", before)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), initialized_here=False)
    torch.manual_seed(0)
    trained = SizedState()
    opt = torch.optim.AdamW(trained.parameters())
    for _ in range(3):
        trained(torch.randn(2, 4)).sum().backward()
        opt.step()
    fckpt.save(tmp_path, 3, trained, opt, {"step": 3}, env)

    fresh = SizedState()  # extra state of 0 bytes, the saved one has dozens
    fresh_opt = torch.optim.AdamW(fresh.parameters())
    state = fckpt.load(fckpt.step_dir(tmp_path, 3), fresh, fresh_opt, env)
    assert state["step"] == 3
    assert fresh.history == trained.history and len(fresh.history) == 3
    torch.testing.assert_close(fresh.weight, trained.weight, atol=0, rtol=0)
    assert fresh.env_at_load == "1" and os.environ.get("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE") == before


def test_a_load_parses_the_checkpoint_metadata_once(tmp_path, monkeypatch):
    """The check before anything changes, the extra states' read and the main read share one parsed metadata."""
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), initialized_here=False)
    trained = SizedState()
    opt = torch.optim.AdamW(trained.parameters())
    trained(torch.randn(2, 4)).sum().backward()
    opt.step()
    fckpt.save(tmp_path, 1, trained, opt, {"step": 1}, env)
    parsed = []
    real = fckpt._MetadataUnpickler.load
    monkeypatch.setattr(fckpt._MetadataUnpickler, "load", lambda self: parsed.append(1) or real(self))
    fresh = SizedState()
    fresh_opt = torch.optim.AdamW(fresh.parameters())
    assert fckpt.load(fckpt.step_dir(tmp_path, 1), fresh, fresh_opt, env)["step"] == 1
    assert len(parsed) == 1 and fresh.history == trained.history
    torch.testing.assert_close(fresh.weight, trained.weight, atol=0, rtol=0)


def test_train_state_is_one_entry_and_reads_checkpoints_written_before_it():
    """fp8lab.train.components.TrainState: step, tokens, counters and RNG; older checkpoints kept them at the top level."""
    from fp8lab.train.components import TrainState, as_current_layout

    cpu = torch.device("cpu")
    old = {"step": 4, "nonfinite_steps": 1, "rng": fckpt.rng_state(cpu), "scheduler": {}, "loader": {}}
    state = TrainState(tokens_per_step=128, device=cpu)
    state.load_state_dict(as_current_layout(old)["train_state"])
    assert (state.step, state.tokens, state.nonfinite_steps) == (4, 512, 1)
    saved = TrainState(step=2, tokens=256, tokens_per_step=128, device=cpu).state_dict()
    expected = torch.rand(3)
    state.load_state_dict(saved)
    assert (state.step, state.tokens) == (2, 256) and torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("every, step, last, stopping, healthy, saved", [
    (0, 3, False, False, True, False), (0, 5, True, False, True, True), (2, 4, False, False, True, True),
    (2, 4, False, False, False, False), (0, 3, False, True, False, True), (-1, 5, True, True, True, False),
])
def test_checkpointer_decides_when_to_save(every, step, last, stopping, healthy, saved):
    from types import SimpleNamespace

    from fp8lab.train.components import Checkpointer

    c = SimpleNamespace(checkpoint_every=every, keep_checkpoints=2)
    paths = SimpleNamespace(checkpoint_dir=None, output_dir=None)
    ck = Checkpointer(c, None, paths, None, None, {}, {}, print)
    calls = []
    ck.save = lambda s: calls.append(s)
    ck.maybe_save(step, last=last, stopping=stopping, healthy=healthy)
    assert calls == ([step] if saved else [])
