"""FP8 health statistics from Transformer Engine's fused llama layers (skipped without a GPU, issue 31):
every sampled step records the activation, weight and gradient of each LayerNormLinear / Linear /
LayerNormMLP, with TE's own delayed-scaling scale; an injected weight outlier raises the warning."""
from __future__ import annotations

import pytest
from gpu_skips import te_or_skip as _te_or_skip
import torch

from fp8lab import fp8stats
from fp8lab import metrics as fmetrics
from fp8lab.train import TrainConfig, train

pytestmark = pytest.mark.gpu
TINY = dict(model="llama-tiny", seq_len=128, micro_batch_size=8, lr=2e-3, progress="off", print_metrics=False,
            plot=False, device="cuda", save_model=False, checkpoint_every=-1, cuda_graphs="off")




@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_te_fused_layers_record_every_operand(prepared, tmp_path, recipe):
    _te_or_skip()
    out = tmp_path / recipe
    s = train(TrainConfig(**TINY, precision="fp8", backend="te", recipe=recipe, steps=20, fp8_stats_every=5,
                          data=str(prepared), output_dir=str(out)))
    assert s["status"] == "completed"
    recs = fmetrics.read_metrics(out / "metrics.jsonl", fp8stats.RECORD)
    assert [r["step"] for r in recs] == [5, 10, 15, 20]
    got = {(row["layer"], row["kind"]) for row in recs[-1]["layers"]}
    for b in (0, 1):  # llama-tiny: two blocks of LayerNormLinear (qkv), Linear (proj), LayerNormMLP (fc1, fc2)
        assert {(f"blocks.{b}.qkv", k) for k in ("activation", "weight", "gradient")} <= got
        assert {(f"blocks.{b}.proj", k) for k in ("activation", "weight", "gradient")} <= got
        assert {(f"blocks.{b}.mlp.fc1", "activation"), (f"blocks.{b}.mlp.fc1", "weight"),
                (f"blocks.{b}.mlp.fc2", "weight"), (f"blocks.{b}.mlp.fc2", "gradient")} <= got
    rows = recs[-1]["layers"]
    assert all(r["amax"] > 0 and r["scale"] > 0 and 0 <= r["underflow"] <= 1 for r in rows)
    assert {r["format"] for r in rows if r["kind"] == "gradient"} == {"E5M2"}  # TE's HYBRID default
    if recipe == "current":  # the scale maps the tensor's own amax onto the format's max
        for r in rows:
            assert r["scale"] * r["amax"] == pytest.approx(448.0 if r["format"] == "E4M3" else 57344.0, rel=1e-3)


def test_te_outlier_weight_warns(prepared, tmp_path, capsys):
    _te_or_skip()
    from fp8lab.convert import convert_model
    from fp8lab.models import build_model
    from fp8lab.recipe import Recipe

    model = convert_model(build_model("llama-tiny", seed=0, device="cuda", dtype=torch.bfloat16), backend="te",
                          recipe="current")
    stats = fp8stats.attach(model, "te", 1)
    with torch.no_grad():
        model.blocks[1].mlp.fc1_weight[0, 0] = 1e4
    from fp8lab.backends import get_backend

    warned = []
    for step in range(1, 5):
        x = torch.randint(0, 512, (2, 128), device="cuda")
        stats.begin(step)
        with get_backend("te").autocast(Recipe.parse("current")):
            loss = model(x).logits.float().logsumexp(-1).mean()
        loss.backward()
        rec = stats.end(step)
        warned += rec.get("warnings", [])
    assert any("blocks.1.mlp.fc1 weight" in w and "underflow" in w for w in warned), warned
