"""fp8lab's layering, read from the source with ``ast`` (nothing is imported):

- the folders ("rooms") in one order, ``ROOMS``: each imports only the rooms below it, at module level and inside
  functions alike (``UPWARD`` lists the exceptions, each with its reason), so no circle between folders; at most 12
  modules at fp8lab's top level (the face) and none over 700 lines;

- no cycle among fp8lab modules in their module-level imports (what runs on ``import``), nor counting
  the imports inside functions (``KNOWN_CYCLES`` is empty; an entry would need its reason);
- no private name (``_x``) of one fp8lab module used by another, whether imported
  (``from fp8lab.m import _x``) or reached as an attribute (``m._x``). Modules of one package
  (``fp8lab.fp8.backends.*``) share that package's private pieces;
- the hardware facts have one home, ``fp8lab.core.hardware``, and the old names still import;
- no import a module never uses (``noqa`` marks a re-export).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fp8lab.core.paths import REPO_ROOT

PKG = REPO_ROOT / "fp8lab"

# A private name used across modules on purpose, with the reason. Keep this list short (empty: none).
ALLOWED_PRIVATE: set[tuple[str, str]] = set()

# fp8lab's folders in import order: a module imports only modules of its own folder or of folders before it.
# The face is fp8lab's top level (cli, env, notebooks, trainpair, ...).
ROOMS = ("core", "records", "model", "fp8", "plan", "data", "train", "analysis", "launch", "views", "face")

# Imports up the order that remain, and why (importer, imported). Nothing may join them.
UPWARD = {
    # a finished run's loss.png is the views' loss figure of the run's own table (matplotlib and pandas load only
    # then, inside components.plot_loss); drawing it in train/ would be a second loss figure
    ("fp8lab.train.components", "fp8lab.analysis"),
    ("fp8lab.train.components", "fp8lab.views.plots"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package(module).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, node: ast.AST) -> list[tuple[str, str | None, str]]:
    """(fp8lab module imported, name taken from it or None, the local name bound) per import."""
    out = []
    if isinstance(node, ast.Import):
        out = [(a.name, None, a.asname or a.name.split(".")[0]) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        src = _resolve(module, node)
        for a in node.names:
            sub = f"{src}.{a.name}"
            out.append((sub, None, a.asname or a.name) if sub in MODULES else (src, a.name, a.asname or a.name))
    return [t for t in out if t[0] in MODULES]


def _walk_module_level(tree: ast.AST, functions: bool = False):
    """Statements that run on import: skip function bodies (unless ``functions``) and ``if TYPE_CHECKING:`` blocks."""
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if not functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _trees() -> dict[str, ast.AST]:
    return {m: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for m, p in MODULES.items()}


def import_graph(trees: dict[str, ast.AST], functions: bool = False) -> dict[str, set[str]]:
    """module -> the fp8lab modules it imports (``functions``: also those imported inside functions)."""
    graph: dict[str, set[str]] = {m: set() for m in trees}
    for module, tree in trees.items():
        for node in _walk_module_level(tree, functions):
            for target, _, _ in _targets(module, node):
                # a package's own submodules, and the root package, are not edges worth a cycle:
                # importing fp8lab.x.y runs fp8lab/__init__ first by Python's rules
                if target != module and target != "fp8lab" and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _shares_package(importer: str, source: str) -> bool:
    """``source`` is ``importer``'s package or a module of it, not of a package inside it (below the root)."""
    pkg = _package(importer)
    return pkg != "fp8lab" and (source == pkg or _package(source) == pkg)


def room(module: str) -> str:
    """The folder of ``fp8lab.<room>.x`` (or the package ``fp8lab.<room>``); 'face' for fp8lab's top level."""
    parts = module.split(".")
    if len(parts) > 1 and (len(parts) > 2 or MODULES[module].name == "__init__.py"):
        return parts[1]
    return "face"


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) where the imported module's room comes after the importer's in ``ROOMS``."""
    return {(m, t) for m, targets in graph.items() for t in targets if ROOMS.index(room(t)) > ROOMS.index(room(m))}


def private_uses(trees: dict[str, ast.AST]) -> list[str]:
    found = []
    for module, tree in trees.items():
        aliases: dict[str, str] = {}  # local name -> fp8lab module it names
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target, name, local in _targets(module, node):
                if target == module:
                    continue
                private_module = any(_private(p) for p in target.split("."))
                if (private_module or (name and _private(name))) and not _shares_package(module, target) \
                        and (module, target) not in ALLOWED_PRIVATE:
                    found.append(f"{module}:{node.lineno} imports {name or target} from {target}")
                if name is None and "." not in local:
                    aliases[local] = target
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                target = aliases.get(node.value.id)
                if target and not _shares_package(module, target) and (module, target) not in ALLOWED_PRIVATE:
                    found.append(f"{module}:{node.lineno} uses {node.value.id}.{node.attr}")
    return sorted(found)


def test_no_import_cycle_at_module_level():
    cycle = find_cycle(import_graph(_trees()))
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The groups of modules that import each other, directly or around a circle (Tarjan; groups of 2+)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(frozenset(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


# Cycles that remain when imports inside functions count, and why. Nothing may join them and no new
# one may appear; remove an entry when its cycle is broken. Empty: fp8lab has no import cycle at all.
KNOWN_CYCLES: set[frozenset[str]] = set()


def test_no_import_cycle_counting_imports_inside_functions():
    found = set(strongly_connected(import_graph(_trees(), functions=True)))
    new = [sorted(g) for g in found - KNOWN_CYCLES]
    assert not new, "import cycles (imports inside functions count): " + "; ".join(" <-> ".join(g) for g in new)
    assert found == KNOWN_CYCLES, f"broken cycles still listed in KNOWN_CYCLES: {KNOWN_CYCLES - found}"


def test_the_trainer_never_imports_the_command_line_module():
    graph = import_graph(_trees(), functions=True)
    for module in ("fp8lab.train.trainer", "fp8lab.plan.runplan", "fp8lab.train.optim", "fp8lab.train.export", "fp8lab.train.run_paths"):
        assert "fp8lab.train.entry" not in graph[module], module


def test_strongly_connected_finds_circles():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a"}}) is None


def test_analysis_report_plots_are_layered():
    graph = import_graph(_trees())
    assert "fp8lab.views.report" not in graph["fp8lab.analysis"] and "fp8lab.views.plots" not in graph["fp8lab.analysis"]
    assert "fp8lab.views.report" not in graph["fp8lab.views.plots"]
    assert "fp8lab.launch" not in graph["fp8lab.analysis"]  # a price constant is a hardware fact
    assert graph["fp8lab.core.hardware"] == set()  # every module may import it


def test_no_private_names_across_modules():
    assert private_uses(_trees()) == []


def test_private_use_checker_sees_both_forms(tmp_path):
    src = "from fp8lab.analysis import _hidden\nfrom fp8lab.model import models\nmodels._secret()\n"
    uses = private_uses({"fp8lab.views.report": ast.parse(src)})
    assert uses == ["fp8lab.views.report:1 imports _hidden from fp8lab.analysis", "fp8lab.views.report:3 uses models._secret"]


@pytest.mark.parametrize("module, names", [
    ("fp8lab.records.metrics", ["PEAK_BF16_DENSE", "peak_bf16_flops"]),
    ("fp8lab.launch", ["InstanceInfo", "INSTANCES", "DEFAULT_PRICES_USD_PER_HOUR", "PRICE_SOURCE",
                       "CHECKPOINT_LOCAL_PATH", "PLACEHOLDER_ROLE", "PLACEHOLDER_BUCKET"]),
])
def test_hardware_facts_have_one_home_and_old_names_import(module, names):
    import importlib

    from fp8lab.core import hardware

    mod = importlib.import_module(module)
    for name in names:
        home = "SAGEMAKER_CHECKPOINT_DIR" if name == "CHECKPOINT_LOCAL_PATH" else name
        assert getattr(mod, name) is getattr(hardware, home), f"{module}.{name} is not fp8lab.core.hardware.{home}"


@pytest.mark.parametrize("module, home, names", [
    ("fp8lab.model.models", "fp8lab.model.config", ["ModelConfig", "MODEL_CONFIGS", "FAMILIES", "config_from_hf",
                                              "validate_config", "to_hf_config", "init_from_config", "default_dtype"]),
    ("fp8lab.data.tokens", "fp8lab.records.data_format", ["MANIFEST", "FORMAT", "FORMAT_VERSION", "TEXT_SUFFIXES", "CORPUS_DIR",
                                           "default_corpus", "text_files", "is_prepared"]),
])
def test_names_moved_to_break_a_cycle_still_import_from_where_they_were(module, home, names):
    import importlib

    mod, src = importlib.import_module(module), importlib.import_module(home)
    for name in names:
        assert getattr(mod, name) is getattr(src, name), f"{module}.{name} is not {home}.{name}"


@pytest.mark.parametrize("module, absent", [
    ("fp8lab.core.hardware", {"fp8lab.launch", "fp8lab.train.entry", "fp8lab.records.metrics", "fp8lab.analysis"}),
    ("fp8lab.analysis", {"fp8lab.launch", "fp8lab.views.report", "fp8lab.views.plots"}),
    ("fp8lab.views.plots", {"fp8lab.views.report", "fp8lab.launch"}),
    ("fp8lab.launch", {"fp8lab.analysis"}),  # the analysis package pulls pandas: not on `fp8lab launch`'s import
    ("fp8lab.model.config", {"fp8lab.model.models", "fp8lab.model.user"}),
    ("fp8lab.records.data_format", {"fp8lab.data.tokens", "fp8lab.data.checks", "fp8lab.records.ownership"}),
])
def test_a_fresh_import_loads_no_module_above_it(module, absent):
    import subprocess
    import sys

    code = f"import sys, {module}; print(' '.join(m for m in sys.modules if m.startswith('fp8lab')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert module in loaded and not loaded & absent, f"importing {module} loaded {sorted(loaded & absent)}"



def unused_imports(sources: dict[str, str]) -> list[str]:
    """``module:line name`` for each name an import binds that the module never uses (read with ``ast``: names,
    annotations, quoted annotations and ``__all__`` count as uses; an import marked ``noqa`` is a re-export)."""
    import re

    found = []
    for module, text in sources.items():
        tree, lines = ast.parse(text), text.splitlines()
        bound: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", None) != "__future__":
                if "noqa" not in "\n".join(lines[node.lineno - 1:node.end_lineno]):
                    for a in node.names:
                        bound.setdefault((a.asname or a.name).split(".")[0], node.lineno)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        quoted = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        used |= {w for q in quoted if len(q) < 200 for w in re.findall(r"[A-Za-z_]\w*", q)}  # "TrainConfig", __all__
        found += [f"{module}:{line} {name}" for name, line in bound.items() if name not in used]
    return sorted(found)


def test_no_unused_imports():
    assert unused_imports({m: p.read_text(encoding="utf-8") for m, p in MODULES.items()}) == []


def test_unused_import_checker_sees_one():
    src = "from __future__ import annotations\nimport os\nimport re  # noqa: F401\nfrom typing import Any\n\n" \
          "def f(x: 'Any') -> None:\n    pass\n"
    assert unused_imports({"m": src}) == ["m:2 os"]


def test_every_module_is_in_a_room():
    assert {room(m) for m in MODULES} <= set(ROOMS), sorted({room(m) for m in MODULES} - set(ROOMS))
    assert room("fp8lab.train.trainer") == "train" and room("fp8lab.analysis") == "analysis" and room("fp8lab.cli") == "face"


def test_each_folder_imports_only_the_folders_below_it():
    trees = _trees()
    at_import = upward_imports(import_graph(trees))
    anywhere = upward_imports(import_graph(trees, functions=True))
    assert not at_import - UPWARD, "imports up the order at module level: " + "; ".join(
        f"{m} -> {t}" for m, t in sorted(at_import - UPWARD))
    assert not anywhere - UPWARD, "imports up the order (inside functions too): " + "; ".join(
        f"{m} -> {t}" for m, t in sorted(anywhere - UPWARD))
    assert anywhere >= UPWARD, f"UPWARD lists imports that are gone: {sorted(UPWARD - anywhere)}"


def test_no_circle_between_folders():
    graph = import_graph(_trees(), functions=True)
    rooms: dict[str, set[str]] = {r: set() for r in ROOMS}
    for m, targets in graph.items():
        rooms[room(m)] |= {room(t) for t in targets} - {room(m)}
    assert strongly_connected(rooms) == [], f"folders that import each other: {strongly_connected(rooms)}"


def test_upward_import_checker_sees_one():
    assert upward_imports({"fp8lab.core.paths": {"fp8lab.train.trainer", "fp8lab.core.validate"}}) == \
        {("fp8lab.core.paths", "fp8lab.train.trainer")}


def test_the_face_is_small_and_no_module_is_long():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 12, f"{len(top)} modules at fp8lab's top level: {top}"
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 700}
    assert not long, f"modules over 700 lines: {long}"


MAX_IMPORTS_IN_FUNCTIONS = 60  # issue 46's ceiling (141 when it was filed)


def imports_in_functions(trees: dict[str, ast.AST]) -> list[tuple[str, int, str]]:
    """(module, line, the comment on that line or the one above it) of each fp8lab import inside a function."""
    out = []
    for module, tree in trees.items():
        lines = MODULES[module].read_text(encoding="utf-8").splitlines()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in fn.body:
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)) and _targets(module, inner):
                        here, above = lines[inner.lineno - 1], lines[inner.lineno - 2].strip()
                        why = here.partition("#")[2] or (above[1:] if above.startswith("#") else "")
                        out.append((module, inner.lineno, why.strip()))
    return sorted(set(out))


def test_imports_inside_functions_are_few_and_each_says_why():
    """An fp8lab import inside a function keeps torch, TE, pandas, matplotlib or the SageMaker SDK off an import
    path, or runs before fp8lab is importable; its line (or the one above) says which."""
    found = imports_in_functions(_trees())
    assert len(found) <= MAX_IMPORTS_IN_FUNCTIONS, f"{len(found)} fp8lab imports inside functions"
    unexplained = [f"{m}:{n}" for m, n, why in found if not why]
    assert not unexplained, f"imports inside functions without a comment saying why: {unexplained}"
