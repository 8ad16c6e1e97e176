"""FP8 health statistics from Transformer Engine's fused llama layers (skipped without a GPU, issue 31):
every sampled step records the activation, weight and gradient of each LayerNormLinear / Linear /
LayerNormMLP, with TE's own delayed-scaling scale; an injected weight outlier raises the warning."""
from __future__ import annotations

import pytest
from gpu_skips import te_or_skip as _te_or_skip
import torch

from fp8lab.fp8 import stats as fp8stats
from fp8lab.records import metrics as fmetrics
from fp8lab.train.entry import TrainConfig, train

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
    from fp8lab.fp8.convert import convert_model
    from fp8lab.model.models import build_model
    from fp8lab.fp8.recipe import Recipe

    model = convert_model(build_model("llama-tiny", seed=0, device="cuda", dtype=torch.bfloat16), backend="te",
                          recipe="current")
    stats = fp8stats.attach(model, "te", 1)
    with torch.no_grad():
        model.blocks[1].mlp.fc1_weight[0, 0] = 1e4
    from fp8lab.fp8.backends import get_backend

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


# --- --fp8-stats-source te-debug: Transformer Engine's own debug API (nvdlfw-inspect) reads the casts

def _te_debug_or_skip():
    _te_or_skip()
    from fp8lab.fp8.te_debug import unavailable

    why = unavailable()
    if why:
        pytest.skip(f"TE's debug API: {why}")


GEMMS = ("qkv", "proj", "mlp.fc1", "mlp.fc2")


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_te_debug_reads_every_gemm_and_agrees_with_the_hooks(prepared, tmp_path, recipe):
    """Every GEMM of the fused blocks, fc2's input and fc1's gradient included (the hooks cannot see those two);
    the operands both sources see read the same (one micro-batch a step, the same seed: the same weights)."""
    import json

    _te_debug_or_skip()
    runs = {}
    for source in ("te-debug", "fp8lab"):
        out = tmp_path / source
        s = train(TrainConfig(**TINY, precision="fp8", backend="te", recipe=recipe, steps=10, grad_accum=1,
                              fp8_stats_every=5, fp8_stats_source=source, data=str(prepared), output_dir=str(out)))
        assert s["status"] == "completed"
        assert json.loads((out / "config.json").read_text())["fp8_stats_source"] == source
        runs[source] = fmetrics.read_metrics(out / "metrics.jsonl", fp8stats.RECORD)
    dbg = runs["te-debug"]
    assert [r["step"] for r in dbg] == [5, 10] and {r.get("source") for r in dbg} == {"te-debug"}
    got = {(row["layer"], row["kind"]): row for row in dbg[-1]["layers"]}
    assert set(got) == {(f"blocks.{b}.{g}", k) for b in (0, 1) for g in GEMMS for k in ("activation", "weight", "gradient")}
    for row in got.values():
        assert row["amax"] > 0 and row["scale"] > 0 and 0 <= row["underflow"] <= 1, row
        assert (row["saturation"] is None) == (recipe == "current"), row  # only a history's scale can clip
        assert row["format"] == ("E5M2" if row["kind"] == "gradient" else "E4M3")
    hooks = {(row["layer"], row["kind"]): row for row in runs["fp8lab"][-1]["layers"]}
    assert (("blocks.0.mlp.fc2", "activation") not in hooks and ("blocks.0.mlp.fc1", "gradient") not in hooks)
    for key in [k for k in hooks if k[1] == "weight"]:
        assert got[key]["amax"] == pytest.approx(hooks[key]["amax"], rel=2e-2), key
        assert got[key]["scale"] == pytest.approx(hooks[key]["scale"], rel=2e-2), key
    if recipe == "current":  # one micro-batch: the scale maps that tensor's own amax onto the format's max
        for r in got.values():
            assert r["scale"] * r["amax"] == pytest.approx(448.0 if r["format"] == "E4M3" else 57344.0, rel=1e-2)


def test_te_debug_outlier_weight_warns(tmp_path):
    _te_debug_or_skip()
    from fp8lab.fp8 import te_debug
    from fp8lab.fp8.backends import get_backend
    from fp8lab.fp8.convert import convert_model
    from fp8lab.model.models import build_model
    from fp8lab.fp8.recipe import Recipe

    recipe = Recipe.parse("current")
    session = te_debug.start(1, recipe, tmp_path / "te-debug")  # before the first TE module is built
    try:
        model = convert_model(build_model("llama-tiny", seed=0, device="cuda", dtype=torch.bfloat16), backend="te",
                              recipe="current")
        stats = te_debug.attach(model, session)
        with torch.no_grad():
            model.blocks[1].mlp.fc1_weight[0, 0] = 1e4
        warned = []
        for step in range(1, 5):
            x = torch.randint(0, 512, (2, 128), device="cuda")
            assert stats.begin(step)
            with get_backend("te").autocast(recipe):
                loss = model(x).logits.float().logsumexp(-1).mean()
            loss.backward()
            rec = stats.end(step)
            assert rec is not None and rec["source"] == "te-debug"
            warned += rec.get("warnings", [])
        assert any("blocks.1.mlp.fc1 weight" in w and "underflow" in w for w in warned), warned
    finally:
        session.close()
