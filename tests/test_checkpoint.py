"""fp8lab.checkpoint with module state that changes size, as Transformer Engine's FP8 state does."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from fp8lab import checkpoint as fckpt
from fp8lab.distributed import DistEnv


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
