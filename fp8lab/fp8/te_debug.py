"""FP8 health read through Transformer Engine's own debug API: ``--fp8-stats-source te-debug``.

TE's debug features (``transformer_engine.debug``, built on NVIDIA's ``nvdlfw-inspect`` package) see every
FP8 cast inside TE's fused modules, including the two that fp8lab's hooks cannot reach in LayerNormMLP (fc2's
input and fc1's output gradient). On a sampled step fp8lab asks for, per GEMM and operand (activation, weight,
gradient):

* ``LogFp8TensorStats``: ``underflows%`` (non-zero values that became 0 in FP8), ``scale_inv_min`` (the
  per-tensor scale's inverse: fp8lab's ``scale`` is its reciprocal) and, under delayed scaling only (the one
  recipe whose scale can clip), ``overflows%`` (values clipped at the format's max);
* ``LogTensorStats``: ``cur_amax`` (the tensor's largest magnitude).

TE accumulates them over all micro-batches of the sampled step (weights: the first), where the hooks
(``--fp8-stats-source hooks``) look at the first micro-batch only. The values arrive through a statistics
logger of nvdlfw-inspect's ``BaseLogger`` interface (:class:`Collected`) and become the same
``{"record": "fp8_stats", ...}`` records as every other source (fp8lab.fp8.stats), so the heatmap, the report and
the early warning read them unchanged.

Order matters: :func:`start` must run before the first TE module is built (TE reads whether the debug API is
on when a module is constructed), which is why the trainer calls it before converting the model, and the plan
(fp8lab.plan.fp8_stats.fp8_stats_source) checks only that the packages are installed, without importing them.
One process per debug session: the plan picks this source for single-process runs only.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from fp8lab.fp8 import stats as fp8stats
from fp8lab.records import ownership

PACKAGE = "nvdlfw-inspect"  # pip name (fp8lab/constraints-gpu.txt pins it); imported as nvdlfw_inspect
TENSORS = {"activation": "x", "weight": "w", "gradient": "g"}  # TE's tensor names -> fp8lab's roles (fp8stats.KINDS)
FP8_STATS = ("underflows%", "scale_inv_min")
DELAYED_ONLY = ("overflows%",)  # TE computes overflows only where the scale comes from a history
AMAX_STATS = ("cur_amax",)
LOG_DIR = ownership.TE_DEBUG_DIR  # in the run's output folder: nvdlfw-inspect's own log (which layers, which features)
NEVER = -1  # the debug API's iteration between steps: not a multiple of any interval >= 2 (validation stays out)
_NAME = re.compile(r"^(?P<layer>.+)_(?P<tensor>" + "|".join(TENSORS) + r")_(?P<stat>[a-z_%]+)$")


def unavailable() -> str | None:
    """None when TE's debug API can be used here, else why not (nothing is imported: see the module's note)."""
    if importlib.util.find_spec("nvdlfw_inspect") is None:
        return (f"{PACKAGE} is not installed (pip install {PACKAGE}; scripts/setup.sh installs it beside "
                "Transformer Engine)")
    try:
        if importlib.util.find_spec("transformer_engine.debug") is None:
            return "this Transformer Engine has no debug API (transformer_engine.debug)"
    except (ImportError, ValueError):
        return "Transformer Engine is not installed"
    return None


def untested_te(checked: str | None, here: str | None) -> str | None:
    """None when Transformer Engine ``here`` is the release (major.minor) that the committed GPU check ran on
    (``checked``: the plan's evidence), else why auto does not rely on the check there: TE's debug features and
    their statistics' names change between releases."""
    release = lambda v: ".".join(re.findall(r"\d+", v or "")[:2])  # noqa: E731
    if checked and here and release(here) == release(checked):
        return None
    return (f"TE's debug API was checked on Transformer Engine {checked or 'of an unrecorded version'}, "
            f"this machine has {here or 'an unknown version'}")


def config(every: int, delayed: bool) -> dict[str, Any]:
    """The debug API's config (the YAML's content, as a dict): the two statistics features on every TE GEMM module
    (fp8lab names them after their module paths in :func:`attach`; LayerNormMLP's GEMMs are ``<name>.fc1`` and
    ``<name>.fc2``), every ``every`` iterations."""
    tensors = list(TENSORS)
    return {"fp8lab_health": {
        "enabled": True,
        "layers": {"layer_name_regex_pattern": ".*"},
        "transformer_engine": {
            "LogFp8TensorStats": {"enabled": True, "tensors": tensors, "freq": every,
                                  "stats": list(FP8_STATS + (DELAYED_ONLY if delayed else ()))},
            "LogTensorStats": {"enabled": True, "tensors": tensors, "freq": every, "stats": list(AMAX_STATS)},
        }}}


def parse_name(name: str) -> tuple[str, str, str] | None:
    """(layer, role x/w/g, stat) of a logged scalar's name ``<layer>_<tensor>_<stat>``; None for other names."""
    m = _NAME.match(name)
    return (m["layer"], TENSORS[m["tensor"]], m["stat"]) if m else None


def _base_logger():
    from nvdlfw_inspect.logging import BaseLogger

    return BaseLogger


def make_collector():
    """A statistics logger for the debug API that keeps what it is given (device scalars: no host copy here)."""

    class Collected(_base_logger()):
        def __init__(self) -> None:
            self.values: list[tuple[str, Any, int]] = []

        def log_scalar(self, name: str, value, iteration: int, **kwargs) -> None:
            self.values.append((name, value, iteration))

        def take(self) -> list[tuple[str, Any, int]]:
            out, self.values = self.values, []
            return out

    return Collected()


def rows(values: list[tuple[str, Any, int]], step: int, formats: dict[str, str],
         per_tensor: bool = True) -> list[dict[str, Any]]:
    """fp8stats' layer rows from the scalars logged for ``step`` (one host copy of all of them). ``formats``:
    role -> FP8 format name (the recipe's). Percentages become fractions, ``scale_inv_min`` the scale; with block
    scales (``per_tensor`` False: one scale per block) there is no one scale to show, as the hooks show none."""
    import torch

    picked = [(parse_name(n), v) for n, v, it in values if it == step]
    picked = [(key, v) for key, v in picked if key is not None]
    if not picked:
        return []
    device = next((v.device for _, v in picked if isinstance(v, torch.Tensor)), "cpu")
    host = torch.stack([torch.as_tensor(v, dtype=torch.float32, device=device).reshape(()) for _, v in picked]).tolist()
    by_site: dict[tuple[str, str], dict[str, float]] = {}
    for ((layer, role, stat), _), value in zip(picked, host):
        by_site.setdefault((layer, role), {})[stat] = value
    out = []
    for (layer, role), s in by_site.items():
        inv = s.get("scale_inv_min")
        sat = s.get("overflows%")
        out.append(fp8stats.row(layer, fp8stats.KINDS[role], formats[role], amax=s.get("cur_amax"),
                                scale=(1.0 / inv) if inv and per_tensor else None,
                                underflow=s.get("underflows%", 0.0) / 100,
                                saturation=sat / 100 if sat is not None else None))
    order = {r: i for i, r in enumerate(fp8stats.KINDS.values())}
    return sorted(out, key=lambda r: (r["layer"], order[r["kind"]]))


class Session:
    """The process's debug API session: started before the model's TE modules exist (:func:`start`)."""

    def __init__(self, every: int, recipe, log_dir: Path) -> None:
        self.every, self.recipe, self.log_dir = every, recipe, Path(log_dir)
        self.collector = None
        self.active = False

    def open(self) -> "Session":
        import nvdlfw_inspect.api as debug_api
        from transformer_engine.debug.pytorch.debug_state import TEDebugState

        # False: TE modules were built in this process while the package was imported but not started (an earlier
        # model, e.g. a notebook's previous run). They are not this run's: the model this run trains is built after
        # this, and TE would otherwise refuse to build it (it takes False for "modules exist without the API").
        if getattr(TEDebugState, "debug_enabled", None) is False:
            TEDebugState.debug_enabled = None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.collector = make_collector()
        features = Path(importlib.util.find_spec("transformer_engine.debug").submodule_search_locations[0]) / "features"
        debug_api.initialize(config_file=config(self.every, self.recipe.row.history), feature_dirs=[str(features)],
                             statistics_logger=self.collector, log_dir=str(self.log_dir), init_training_step=NEVER)
        self.active = True
        return self

    def close(self) -> None:
        if self.active:
            import nvdlfw_inspect.api as debug_api

            debug_api.end_debug()
            self.active = False


def start(every: int, recipe, log_dir: Path) -> Session:
    """Start TE's debug API for this process (before any TE module is built)."""
    return Session(every, recipe, log_dir).open()


class DebugHealth(fp8stats.HealthStats):
    """fp8stats.HealthStats fed by TE's debug API instead of :func:`fp8lab.fp8.stats.observe`."""

    def __init__(self, session: Session, sites: list[str]) -> None:
        super().__init__(session.every)
        self.session, self.sites = session, sites
        self.formats = {"x": "E4M3", "w": "E4M3", "g": session.recipe.grad_format_name}
        self._sampled: int | None = None

    def begin(self, step: int) -> bool:
        import nvdlfw_inspect.api as debug_api

        if step % self.every:
            self._sampled = None
            return False
        debug_api.step()  # flush whatever ran since the last step (a validation forward): not this step's
        self.session.collector.take()
        debug_api.initialize_training_step(step)
        self._sampled = step
        return True

    def end(self, step: int) -> dict[str, Any] | None:
        import nvdlfw_inspect.api as debug_api

        if self._sampled != step:
            return None
        debug_api.step()  # TE reduces its buffers and logs them to the collector
        debug_api.initialize_training_step(NEVER)
        self._sampled = None
        layers = rows(self.session.collector.take(), step, self.formats,
                      per_tensor=self.session.recipe.row.per_tensor)
        if not layers:
            return None
        return self.with_warnings({"record": fp8stats.RECORD, "step": step, "layers": layers,
                                   "source": fp8stats.TE_DEBUG})


def attach(model, session: Session) -> DebugHealth | None:
    """Name ``model``'s TE GEMM modules after their module paths (the debug API's layer names), before the first
    forward; None when it has none."""
    import transformer_engine.pytorch as te

    sites = []
    for name, m in model.named_modules():
        if isinstance(m, (te.LayerNormLinear, te.Linear, te.LayerNormMLP)):
            m.name = name  # LayerNormMLP's two GEMMs report as <name>.fc1 and <name>.fc2
            sites.append(name)
    return DebugHealth(session, sites) if sites else None
