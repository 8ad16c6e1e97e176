"""The recipe table (fp8lab.fp8.recipe.TABLE) is the one statement of what a recipe kind is and can do, and the
GPU facts (fp8lab.core.hardware: generations, has_fp8) the one statement of what a GPU runs (issue 46).

Every kind has a full row; each place that used to restate a kind's abilities (TE's recipe and its availability
check, torchao, the emulator's quantizer, FP8 attention's generations, a job's GPU check, the figures' style) is
shown to follow its row: a row changed here changes that place's answer.
"""
from __future__ import annotations

import ast
import dataclasses
import enum
import re
import sys
import types

import pytest

from fp8lab.core import hardware as hw
from fp8lab.core.paths import REPO_ROOT
from fp8lab.fp8 import recipe as frecipe
from fp8lab.fp8.recipe import FORMATS, KINDS, TABLE, Recipe
from fp8lab.model.models import get_config
from fp8lab.plan import fp8attn


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_a_full_row(kind):
    row = TABLE[kind]
    assert row.te_class is None or re.fullmatch(r"[A-Z]\w+", row.te_class), row.te_class
    assert row.te_class is not None or row.torchao is not None  # every kind runs on some GPU backend
    assert row.te_check is None or row.te_check.startswith("is_")
    assert row.torchao is None or isinstance(row.torchao, str)
    assert row.formats and set(row.formats) <= set(FORMATS)
    assert row.needs in hw.GENERATIONS and hw.at_least(row.needs, hw.FP8_GENERATION)
    assert set(row.fp8_attention) <= set(hw.GENERATIONS)
    assert all(hw.at_least(g, row.needs) for g in row.fp8_attention)  # attention runs only where the kind does
    colour, hatch = row.style
    assert re.fullmatch(r"#[0-9a-f]{6}", colour) and isinstance(hatch, str)
    assert row.per_tensor == (row.blocks is None) and (row.history <= row.per_tensor)
    parsed = Recipe.parse(kind)
    assert parsed.row is row and parsed.format == row.formats[0]  # a kind's default format is its row's first


def test_kinds_are_the_table_and_each_style_is_its_own():
    assert KINDS == tuple(TABLE) and len(set(KINDS)) == len(KINDS)
    assert len({r.style[0] for r in TABLE.values()}) == len(TABLE) == len({r.style[1] for r in TABLE.values()})
    from fp8lab.plan.options import RECIPE_KINDS, RECIPES

    assert RECIPE_KINDS == KINDS and RECIPES[1:] == KINDS


def test_the_emulator_has_every_rows_quantizer():
    torch = pytest.importorskip("torch")
    from fp8lab.fp8 import formats
    from fp8lab.fp8.backends import emulated

    t = torch.randn(256, 256)
    for kind, row in TABLE.items():
        assert hasattr(formats, row.quantizer), (kind, row.quantizer)  # named as fp8lab.fp8.formats names it
        q = emulated.TensorQuantizers(Recipe.parse(kind))
        assert all(torch.isfinite(q(role, t)).all() for role in ("x", "w", "g")), kind


def test_the_emulator_quantizes_with_the_rows_blocks(monkeypatch):
    torch = pytest.importorskip("torch")
    from fp8lab.fp8 import formats
    from fp8lab.fp8.backends import emulated

    t = torch.randn(64, 64) * torch.logspace(-3, 3, 64)  # columns of very different sizes: blocks matter
    monkeypatch.setitem(TABLE, "block", dataclasses.replace(TABLE["block"], blocks=((1, 16), (32, 32))))
    q = emulated.TensorQuantizers(Recipe(kind="block", format="e4m3"))
    assert torch.equal(q("w", t), formats.quantize_blockwise(t, formats.E4M3, block=(32, 32)))
    assert torch.equal(q("x", t), formats.quantize_blockwise(t, formats.E4M3, block=(1, 16)))
    assert not torch.equal(q("w", t), formats.quantize_blockwise(t, formats.E4M3, block=(128, 128)))


def test_formats_and_settings_follow_the_row(monkeypatch):
    with pytest.raises(ValueError, match=r"Recipe\(kind='mxfp8'\) uses E4M3 for every tensor: pass format='e4m3'"):
        Recipe(kind="mxfp8")
    with pytest.raises(ValueError, match="amax_history_len and amax_compute_algo apply to 'delayed' only"):
        Recipe.parse("block:amax_history_len=16")
    assert "amax_history_len" in Recipe().describe() and "amax_history_len" not in Recipe(kind="current").describe()
    monkeypatch.setitem(TABLE, "block", dataclasses.replace(TABLE["block"], formats=("hybrid", "e4m3")))
    assert Recipe.parse("block").format == "hybrid" and Recipe(kind="block").format == "hybrid"


def test_torchao_runs_the_kinds_whose_row_names_its_recipe():
    for kind, row in TABLE.items():
        if row.torchao is None:
            with pytest.raises(ValueError, match=r"per tensor or per row \(Recipe\(kind='current' or 'rowwise' or "
                                                 r"'rowwise_with_gw_hp'\)\)"):
                Recipe.parse(kind).to_torchao()


def _stub_te(monkeypatch):
    """transformer_engine.common.recipe as far as Recipe.to_te uses it: each class records its keywords."""
    mod = types.ModuleType("transformer_engine.common.recipe")
    mod.Format = enum.Enum("Format", "HYBRID E4M3")
    for row in (r for r in TABLE.values() if r.te_class):
        setattr(mod, row.te_class, type(row.te_class, (), {"__init__": lambda self, **kw: setattr(self, "kw", kw)}))
    common = types.ModuleType("transformer_engine.common")
    common.recipe = mod
    te = types.ModuleType("transformer_engine")
    te.common = common
    for name, m in (("transformer_engine", te), ("transformer_engine.common", common),
                    ("transformer_engine.common.recipe", mod)):
        monkeypatch.setitem(sys.modules, name, m)
    return mod


def test_te_recipe_objects_come_from_the_rows_class_names(monkeypatch):
    mod = _stub_te(monkeypatch)
    for kind, row in TABLE.items():
        if row.te_class is None:  # torchao's rowwise recipes: TE refuses them, naming the kinds it has
            with pytest.raises(ValueError, match=rf"Transformer Engine has no '{kind}' recipe .*--backend torchao.*'block'"):
                Recipe.parse(kind).to_te()
            continue
        te = Recipe.parse(kind).to_te()
        assert type(te).__name__ == row.te_class
        assert te.kw["fp8_format"] is (mod.Format.HYBRID if row.formats[0] == "hybrid" else mod.Format.E4M3)
    delayed = Recipe.parse("delayed:amax_history_len=16,margin=1").to_te().kw
    assert (delayed["amax_history_len"], delayed["margin"], delayed["amax_compute_algo"]) == (16, 1, "max")
    assert Recipe(kind="mxfp8", format="e4m3", fp8_attention=True).to_te().kw["fp8_dpa"] is True
    with pytest.raises(ValueError, match=r"TE has no FP8 attention for block scaling \(Float8BlockScaling\); use kind='delayed'"):
        Recipe(kind="block", format="e4m3", fp8_attention=True).to_te()
    with pytest.raises(ValueError, match="TE's current recipe has no margin"):
        Recipe(kind="current", margin=1).to_te()


def test_te_checks_the_kinds_whose_row_names_a_check(monkeypatch):
    torch = pytest.importorskip("torch")
    _stub_te(monkeypatch)
    from fp8lab.fp8.backends import te as te_backend

    asked = []

    def check(name):
        return lambda return_reason: asked.append(name) or (False, f"{name} says no")

    fake = types.SimpleNamespace(**{r.te_check: check(r.te_check) for r in TABLE.values() if r.te_check})
    monkeypatch.setattr(te_backend, "_te", lambda: fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    be = te_backend.TEBackend()
    for kind, row in TABLE.items():
        if row.te_class is None:  # torchao's rowwise kinds: TE has no recipe to make
            with pytest.raises(ValueError, match=rf"Transformer Engine has no '{kind}' recipe"):
                be.check_recipe(Recipe.parse(kind))
        elif row.te_check is None:
            be.check_recipe(Recipe.parse(kind))  # no availability check: TE's recipe object is made
        else:
            with pytest.raises(ValueError, match=rf"Recipe\(kind='{kind}'\) is not supported on NVIDIA H100 80GB HBM3 "
                                                 rf"\(compute capability 9.0\): {row.te_check} says no\. "
                                                 rf"Use kind='delayed' or 'current'"):
                be.check_recipe(Recipe.parse(kind))
    assert asked == [r.te_check for r in TABLE.values() if r.te_check]


def test_fp8_attention_follows_the_rows(monkeypatch):
    mcfg = get_config("llama-7b")
    assert mcfg.head_dim == 128  # what TE's FP8 attention runs on both generations
    setup = dict(precision="fp8", backend="te", fuse=True, mcfg=mcfg, gpu=True)
    for gen, gpu in (("hopper", "NVIDIA H200"), ("blackwell", "NVIDIA B200")):
        assert fp8attn.recipes(gen) == tuple(k for k, r in TABLE.items() if gen in r.fp8_attention)
        for kind in KINDS:
            why = fp8attn.problem(recipe_kind=kind, gpu_name=gpu, **setup)
            assert (why is None) == (gen in TABLE[kind].fp8_attention), (gen, kind, why)
    assert fp8attn.recipes("hopper") == ("delayed",) and fp8attn.recipes("blackwell") == ("delayed", "current", "mxfp8")
    monkeypatch.setitem(TABLE, "current", dataclasses.replace(TABLE["current"], fp8_attention=("hopper", "blackwell")))
    assert fp8attn.problem(recipe_kind="current", gpu_name="NVIDIA H200", **setup) is None
    assert fp8attn.generation("NVIDIA L4") is None and fp8attn.generation("NVIDIA H200") == "hopper"


def test_a_jobs_gpu_check_follows_the_rows_generation(monkeypatch):
    pytest.importorskip("sagemaker.train")
    from fp8lab import launch as L

    def job(recipe, instance="ml.p5.48xlarge"):
        return L.JobSpec(model="llama-1b", precision="fp8", recipe=recipe, instance_type=instance,
                         role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, steps=10)

    with pytest.raises(ValueError, match=r"JobSpec.recipe='mxfp8' needs Blackwell GPUs; ml.p5.48xlarge has H100 80GB"):
        job("mxfp8")
    job("block")
    monkeypatch.setitem(TABLE, "block", dataclasses.replace(TABLE["block"], needs="blackwell"))
    with pytest.raises(ValueError, match=r"JobSpec.recipe='block' needs Blackwell GPUs; ml.p5.48xlarge has H100 80GB"):
        job("block")


def test_the_headline_figure_styles_each_kind_by_its_row():
    pytest.importorskip("matplotlib")
    from fp8lab.views import plots

    assert plots._RECIPE_ORDER == list(KINDS)
    assert plots._RECIPE_STYLE == {k: r.style for k, r in TABLE.items()}


# the places that restated a kind's abilities before the table: none compares a kind or lists kinds any more (a
# kind's name as a key of saved state, the emulator's checkpointed "delayed" scaling state, is no restatement)
RESTATED_BEFORE = ("fp8lab/fp8/backends/te.py", "fp8lab/fp8/backends/emulated.py", "fp8lab/plan/fp8attn.py",
                   "fp8lab/launch/spec.py", "fp8lab/views/plots.py", "fp8lab/fp8/te_debug.py")


@pytest.mark.parametrize("path", RESTATED_BEFORE)
def test_no_kind_is_named_outside_the_table(path):
    tree = ast.parse((REPO_ROOT / path).read_text(encoding="utf-8"))

    def kinds_in(nodes):
        return [n.value for n in nodes if isinstance(n, ast.Constant) and n.value in KINDS]

    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):  # kind == "mxfp8", kind in ("delayed", "current")
            named |= set(kinds_in(ast.walk(node)))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(kinds_in(node.elts)) >= 2:
            named |= set(kinds_in(node.elts))  # a list of kinds
        elif isinstance(node, ast.Dict) and len(kinds_in(node.keys)) >= 2:
            named |= set(kinds_in(node.keys))  # a table keyed by kind
    named = sorted(named)
    assert named == [], f"{path} names recipe kinds {named}: read their rows of fp8lab.fp8.recipe.TABLE instead"


def test_has_fp8_is_stated_once():
    """FP8 tensor cores from compute capability 8.9 (Ada) on, for a GPU seen (capability) or planned (name)."""
    assert [hw.has_fp8(cc) for cc in ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))] == \
        [False, False, False, True, True, True, True]
    names = {"NVIDIA H100 80GB HBM3": True, "NVIDIA H200": True, "NVIDIA B200": True, "NVIDIA L4": True,
             "NVIDIA L40S": True, "NVIDIA H20": True, "NVIDIA A100-SXM4-80GB": False, "Tesla T4": False, "cpu": False}
    assert {n: hw.has_fp8(n) for n in names} == names
    assert hw.generation((9, 0)) == "hopper" and hw.generation((8, 9)) == "ada" and hw.generation((7, 5)) is None
    # the instances' facts as they were written per instance before they came from the GPU table
    fp8 = {k: (i.fp8, i.blackwell) for k, i in hw.INSTANCES.items()}
    assert fp8 == {"ml.p5.48xlarge": (True, False), "ml.p5.4xlarge": (True, False), "ml.p5e.48xlarge": (True, False), "ml.p5en.48xlarge": (True, False),
                   "ml.p6-b200.48xlarge": (True, True), "ml.p4d.24xlarge": (False, False),
                   "ml.p4de.24xlarge": (False, False)}
    capability = re.compile(r"\(\s*8\s*,\s*9\s*\)|\(\s*9\s*,\s*0\s*\)")
    restated = [str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "fp8lab").rglob("*.py")
                if p.name != "hardware.py" and capability.search(p.read_text(encoding="utf-8"))]
    assert restated == [], f"compute capabilities compared outside fp8lab.core.hardware: {restated}"


def test_the_table_imports_no_torch():
    import subprocess

    code = ("import sys, fp8lab.fp8.recipe, fp8lab.plan.fp8attn, fp8lab.core.hardware\n"
            "assert not {'torch', 'transformer_engine', 'torchao'} & set(sys.modules), 'the recipe table imported torch'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert frecipe.kinds_where(lambda r: r.torchao is not None) == ("current", "rowwise", "rowwise_with_gw_hp")
