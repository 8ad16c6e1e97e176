"""Run the tutorial notebooks with papermill, and pass values from a notebook back to Python.

Notebooks stay thin: each has one cell tagged ``parameters``; this module injects
values there (rejecting names the notebook does not declare, which papermill alone
only warns about), executes in order, and stops with the notebook, cell and error
that failed. ``glue``/``read_glued`` let tests assert on numbers a notebook computed.
"""
from __future__ import annotations

import argparse
import ast
import json
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from fp8lab.core.paths import ABSOLUTE_PLACEHOLDER, REPO_ROOT, shareable_path
from fp8lab.core.probes import check_writable_dir
from fp8lab.records import runlock
from fp8lab.core.validate import OneLineParser

GLUE_MIME = "application/x.fp8lab.glue+json"
NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "fp8lab"  # the Jupyter kernel scripts/setup.sh registers; every notebook's kernelspec names it
OUTPUTS = "outputs"  # beside notebooks/: each notebook works in outputs/<its name>/ (as `fp8lab notebooks run`)
# notebook parameters once named otherwise -> their one name across the notebooks (notebook 04's); the old name
# is refused with the new one, by the runner and by the notebook itself under plain papermill
RENAMED = {"token_budget": "tokens", "price_per_instance_hour": "price_per_hour"}


class NotebookError(RuntimeError):
    """A notebook failed; the message names the notebook, the cell and the error."""


@dataclass
class NotebookResult:
    name: str
    ok: bool
    seconds: float
    output: Path
    error: str | None = None


def default_kernel() -> str:
    """'fp8lab' where that kernel runs this environment's Python (set-up registered it), else 'python3'
    (ipykernel's kernel for this interpreter): either way the notebooks run on the Python that runs fp8lab."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        argv0 = KernelSpecManager().get_kernel_spec(KERNEL).argv[0]
    except (NoSuchKernel, IndexError):
        return "python3"
    return KERNEL if Path(argv0).absolute().parent.parent == Path(sys.prefix).absolute() else "python3"


def work_folder(name: str) -> Path:
    """Run the notebook ``name`` in ``outputs/<name>/`` beside the notebooks folder when it was opened
    from that folder (JupyterLab starts a kernel there), so its files land where ``fp8lab notebooks run``
    puts them and relative parameters (e.g. notebook 05's ``runs``) mean the same; elsewhere (the
    runner already chose the folder) the working folder stays. Returns the folder."""
    here = Path.cwd()
    if (here / f"{name}.ipynb").is_file():
        target = here.parent / OUTPUTS / name
        target.mkdir(parents=True, exist_ok=True)
        os.chdir(target)
        print(f"working folder: {OUTPUTS}/{name}/ (figures and runs go here)")
        return target
    return here


def glue(name: str, value: Any, display: bool = False) -> None:
    """Record a JSON-serialisable value in the executed notebook, for tests and reports."""
    from IPython.display import display as ipy_display

    data = {GLUE_MIME: {"name": name, "value": value}}
    if display:
        data["text/plain"] = f"{name} = {value!r}"
    ipy_display(data, raw=True)


def as_list(name: str, value: Any) -> list:
    """A list parameter as a list: plain papermill passes ``-p name "[1, 2, 4]"`` as the string "[1, 2, 4]"
    (``-y 'name: [1, 2, 4]'`` passes a list), so a string holding a Python or JSON list is read as that
    list; anything else is a clear error naming the parameter."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"{name}={value!r} is invalid; allowed: a list, e.g. -y '{name}: [...]' or "
                             f"-p {name} \"[...]\"") from None
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name}={value!r} is invalid; allowed: a list, e.g. [{value!r}]")
    return list(value)


def check_renamed(names: Iterable[str]) -> None:
    """Refuse a parameter under its old name (:data:`RENAMED`), naming the new one: plain papermill would
    inject it as an unused variable, and the run would silently use the default."""
    old = [n for n in names if n in RENAMED]
    if old:
        raise ValueError("; ".join(f"parameter {n} was renamed {RENAMED[n]} (one name per quantity across the "
                                   f"notebooks): pass -p {RENAMED[n]} <value>" for n in old))


def read_glued(path: str | Path) -> dict[str, Any]:
    """Values recorded with :func:`glue` in an executed notebook, by name."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    out: dict[str, Any] = {}
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            payload = o.get("data", {}).get(GLUE_MIME)
            if payload is not None:
                if isinstance(payload, str):
                    payload = json.loads(payload)
                out[payload["name"]] = payload["value"]
    return out


def list_notebooks(directory: str | Path | None = None) -> list[Path]:
    """The numbered notebooks, in order."""
    d = Path(directory) if directory else NOTEBOOK_DIR
    return sorted(p for p in d.glob("[0-9][0-9]_*.ipynb"))


def resolve(names: Iterable[str] | None, directory: str | Path | None = None) -> list[Path]:
    """Map names ('01', '01_fp8_formats', a path) onto notebook files, with a clear error."""
    available = list_notebooks(directory)
    if not names:
        return available
    chosen = []
    for name in names:
        p = Path(name)
        if p.suffix == ".ipynb" and p.exists():
            chosen.append(p)
            continue
        stem = p.stem if p.suffix == ".ipynb" else name
        hits = [nb for nb in available if nb.stem == stem or nb.stem.startswith(stem + "_") or
                nb.stem.split("_")[0] == stem]
        if len(hits) != 1:
            valid = ", ".join(nb.stem for nb in available)
            raise ValueError(f"notebook {name!r} not found (or ambiguous); choose from: {valid}")
        chosen.append(hits[0])
    return chosen


def _parameters_source(path: str | Path) -> str:
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise NotebookError(f"{Path(path).name}: expected exactly one cell tagged 'parameters', found {len(cells)}")
    return cells[0].source


def declared_parameters(path: str | Path) -> dict[str, Any]:
    """Names and default values in the notebook's cell tagged ``parameters``."""
    params: dict[str, Any] = {}
    for node in ast.parse(_parameters_source(path)).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    try:
                        params[t.id] = ast.literal_eval(node.value)
                    except Exception:
                        params[t.id] = ast.unparse(node.value)
    return params


def check_parameters(path: str | Path, params: dict[str, Any]) -> None:
    """Reject parameter names the notebook does not declare, listing the valid ones."""
    valid = declared_parameters(path)
    check_renamed(set(params) - set(valid))
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(
            f"{Path(path).name}: unknown parameter(s) {', '.join(unknown)}; "
            f"valid parameters are: {', '.join(sorted(valid))}"
        )


def check_values(path: str | Path, params: dict[str, Any], declared: dict[str, Any] | None = None) -> None:
    """Values of declared parameters: the default's type (the cell's comment says what is allowed) and,
    for notebooks that train, the trainer's own checks (fp8lab.notebook_checks.NOTEBOOK_CHECKS). Before any
    cell runs, so a bad value never prepares data or starts a kernel."""
    import nbformat

    from fp8lab import notebook_checks as checks  # the planner's TrainConfig: loads only to check parameters

    path = Path(path)
    declared = declared_parameters(path) if declared is None else declared
    comments = checks.parameter_comments(_parameters_source(path))
    checks.check_notebook_values(path.stem, declared, comments, params)
    code = "\n".join(c.source for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code")
    checks.check_notebook_semantics(path.stem, declared, params, code)


def _shareable_metadata(executed: Path, source: Path) -> None:
    """papermill records where it read and wrote the notebook, and the parameters it injected: keep those
    paths relative (no machine paths); an absolute path given as a parameter becomes ``<abs>/<name>``
    unless it lies inside the notebook's working folder."""
    import nbformat

    if not executed.is_file():
        return
    nb = nbformat.read(str(executed), as_version=4)
    pm = nb.metadata.get("papermill")
    if not isinstance(pm, dict):
        return
    try:
        pm["input_path"] = source.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        pm["input_path"] = source.name
    pm["output_path"] = executed.name
    workdir = executed.parent / source.stem
    renamed: dict[str, str] = {}

    def share(v: Any) -> Any:
        if isinstance(v, str) and os.path.isabs(v):
            renamed[v] = str(shareable_path(v, workdir))
            return renamed[v]
        return [share(x) for x in v] if isinstance(v, list) else v

    if isinstance(pm.get("parameters"), dict):
        pm["parameters"] = {k: share(v) for k, v in pm["parameters"].items()}
    for cell in nb.cells:
        if "injected-parameters" in cell.metadata.get("tags", []):
            for old, new in sorted(renamed.items(), key=lambda kv: -len(kv[0])):
                cell.source = cell.source.replace(old, new)
        for o in cell.get("outputs", []):  # a cell that shows a path (PosixPath('/home/...')) shows it relative
            _share_output(o, workdir)
    nbformat.write(nb, str(executed))


def _share_output(output: dict, workdir: Path) -> None:
    """The text of one cell output with the absolute folders it names made shareable: the notebook's working folder
    as ``.``, the checkout and the home folder as ``<abs>`` (fp8lab.core.paths)."""
    bases = sorted({(str(workdir.resolve()), "."), (str(workdir.parent.resolve()), ".."),
                    (str(REPO_ROOT), ABSOLUTE_PLACEHOLDER), (str(Path.home()), ABSOLUTE_PLACEHOLDER)},
                   key=lambda b: -len(b[0]))

    def share(text: Any) -> Any:
        if isinstance(text, list):
            return [share(t) for t in text]
        if not isinstance(text, str):
            return text
        for base, shown in bases:
            if len(base) > 1:
                text = text.replace(base, shown)
        return text

    if "text" in output:
        output["text"] = share(output["text"])
    for key in ("text/plain", "text/html", "text/markdown"):
        if key in output.get("data", {}):
            output["data"][key] = share(output["data"][key])


def _executed_copy(path: Path) -> bool:
    """``path`` is a notebook this runner executed (papermill's record, made shareable by it), so a re-run may replace
    it."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
        return meta.get("papermill", {}).get("output_path") == path.name
    except (OSError, ValueError, AttributeError):
        return False


def _check_targets(paths: list[Path], out: Path) -> None:
    """Before any notebook runs: each executed copy goes to a new name or over one this runner wrote; never over a
    user's notebook of that name, nor over the tutorial's own source (``-o notebooks``)."""
    for path in paths:
        executed = out / path.name
        if not os.path.lexists(executed):
            continue
        if executed.resolve() == path.resolve():
            raise ValueError(f"--output-dir={str(out)!r} holds the notebook {path.name} itself; its executed copy "
                             "would replace it; allowed: another folder, e.g. outputs")
        if not _executed_copy(executed):
            raise ValueError(f"--output-dir={str(out)!r} holds {path.name}, which is not a copy fp8lab notebooks "
                             "executed; fp8lab never replaces it; allowed: another folder, or move that file away")


def _failure_message(nb_name: str, exc: Exception, executed: Path) -> str:
    """Find the failing cell in the executed copy and say which it was and why."""
    import nbformat

    detail = f"{type(exc).__name__}: {exc}".strip()
    try:
        nb = nbformat.read(str(executed), as_version=4)
        code_cells = [c for c in nb.cells if c.cell_type == "code"]
        for i, cell in enumerate(code_cells, start=1):
            for o in cell.get("outputs", []):
                if o.get("output_type") == "error":
                    first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
                    return (
                        f"notebook {nb_name} failed in code cell {i} ({first[:80]!r}): "
                        f"{o.get('ename')}: {o.get('evalue')}\n(executed copy: {executed})"
                    )
    except Exception:
        pass
    return f"notebook {nb_name} failed: {detail.splitlines()[0] if detail else ''}\n(executed copy: {executed})"


def coerce(value: str) -> Any:
    """Parse a CLI parameter value as a Python literal when it is one ('3', 'True', "['a']")."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def run(
    names: Iterable[str] | None = None,
    params: dict[str, Any] | None = None,
    output_dir: str | Path = OUTPUTS,
    kernel: str | None = None,
    stop_on_error: bool = True,
    progress: bool = True,
    directory: str | Path | None = None,
    timeout: int | None = 900,
    kernel_threads: int | None = 1,
    jobs: int = 1,
) -> list[NotebookResult]:
    """Execute notebooks in order with papermill; parameters go to every notebook that declares them.

    When several notebooks run, a parameter is injected only into those that declare it, and a
    name no chosen notebook declares is rejected. With a single notebook every name must be valid.

    ``timeout`` (seconds per cell) turns a hung kernel into a clear failure instead of a stall.
    ``kernel``: None is :func:`default_kernel` (this interpreter).
    ``kernel_threads``: torch's CPU threads in each kernel (``OMP_NUM_THREADS``; None: torch's own choice). One,
    because the notebooks' models are small: on the 2-core machine one thread took about half the CPU time of two
    (benchmarks/logs/notebooks-timing-one-story/result.md), and a GPU does the real work elsewhere.
    ``jobs``: notebooks executed at once, each kernel in its own process (the notebooks share no files: each works
    in its own folder); :func:`default_jobs` is what ``fp8lab notebooks run`` picks. Results come in notebook order;
    after a failure with ``stop_on_error`` no further notebook starts.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r} is invalid; allowed: a positive integer (notebooks executed at once)")
    if kernel_threads is not None and (isinstance(kernel_threads, bool) or not isinstance(kernel_threads, int)
                                       or kernel_threads < 1):
        raise ValueError(f"kernel_threads={kernel_threads!r} is invalid; allowed: a positive integer, or None "
                         "(torch's own choice)")
    params = dict(params or {})
    kernel = kernel or default_kernel()
    paths = resolve(names, directory)
    if not paths:
        raise NotebookError("no notebooks found")
    declared = {p: declared_parameters(p) for p in paths}
    if len(paths) == 1:
        check_parameters(paths[0], params)
    else:
        everything = set().union(*declared.values())
        check_renamed(set(params) - everything)
        unknown = sorted(set(params) - everything)
        if unknown:
            raise ValueError(
                f"unknown parameter(s) {', '.join(unknown)} for notebooks {', '.join(p.stem for p in paths)}; "
                f"valid parameters are: {', '.join(sorted(everything))}"
            )
    for p in paths:
        check_values(p, {k: v for k, v in params.items() if k in declared[p]}, declared[p])
    out = check_writable_dir("--output-dir", output_dir)
    _check_targets(paths, out)
    out.mkdir(parents=True, exist_ok=True)
    lock = runlock.acquire("--output-dir", out, user="notebooks run")  # one runner per folder: none replaces another's
    # a kernel inherits MPLBACKEND; 'Agg' (set by test runners) would hide every figure
    saved_backend = os.environ.pop("MPLBACKEND", None)
    saved_threads = os.environ.get("OMP_NUM_THREADS")
    if kernel_threads is not None:  # read by torch when the kernel imports it
        os.environ["OMP_NUM_THREADS"] = str(kernel_threads)
    try:
        with tempfile.TemporaryDirectory(prefix="fp8lab-kernel-") as sockets:
            return _run_all(paths, declared, params, out, kernel, stop_on_error, progress, timeout, Path(sockets),
                            min(jobs, len(paths)))
    finally:
        lock.release()
        if saved_backend is not None:
            os.environ["MPLBACKEND"] = saved_backend
        if saved_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved_threads


def _local_socket_kernel_manager(folder: Path):
    """A kernel manager whose kernel talks to papermill over Unix sockets in ``folder`` (private to
    this user), not over unencrypted TCP on localhost, which any local process could connect to and
    which makes ipykernel print a warning on every run."""
    from jupyter_client.manager import AsyncKernelManager

    class LocalSocketKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**{"transport": "ipc", "ip": str(folder / "kernel"), **kwargs})

    return LocalSocketKernelManager


def _execute(path: Path, out: Path, nb_params: dict, kernel: str, timeout: int | None,
             sockets: Path) -> NotebookResult:
    """Execute one notebook into ``out`` in its own working folder; a failure is returned, not raised (in a worker
    process papermill's exception need not survive pickling)."""
    import papermill as pm

    workdir = out / path.stem
    workdir.mkdir(parents=True, exist_ok=True)
    executed = out / path.name
    socket_dir = sockets / path.stem  # a folder per notebook: two kernels at once never pick the same socket
    socket_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        pm.execute_notebook(
            str(path), str(executed), parameters=nb_params, kernel_name=kernel,
            cwd=str(workdir), progress_bar=False, log_output=False, execution_timeout=timeout,
            kernel_manager_class=_local_socket_kernel_manager(socket_dir),
        )
        _shareable_metadata(executed, path)
        return NotebookResult(path.stem, True, time.perf_counter() - t0, executed)
    except Exception as exc:  # papermill raises PapermillExecutionError with the cell's error
        _shareable_metadata(executed, path)
        return NotebookResult(path.stem, False, time.perf_counter() - t0, executed,
                              _failure_message(path.name, exc, executed))


def _run_all(paths, declared, params, out, kernel, stop_on_error, progress, timeout, sockets,
             jobs) -> list[NotebookResult]:
    from tqdm.auto import tqdm

    params_of = {p: {k: v for k, v in params.items() if k in declared[p]} for p in paths}
    bar = tqdm(total=len(paths), desc="notebooks", unit="nb", disable=not progress)
    done: dict[Path, NotebookResult] = {}
    try:
        if jobs == 1:
            for path in paths:
                bar.set_postfix_str(path.stem)
                done[path] = _execute(path, out, params_of[path], kernel, timeout, sockets)
                bar.update()
                if stop_on_error and not done[path].ok:
                    break
        else:
            _run_parallel(paths, params_of, out, kernel, stop_on_error, timeout, sockets, jobs, bar, done)
    finally:
        bar.close()
    results = [done[p] for p in paths if p in done]
    failed = next((r for r in results if not r.ok), None)
    if stop_on_error and failed is not None:
        raise NotebookError(failed.error) from None
    return results


def _run_parallel(paths, params_of, out, kernel, stop_on_error, timeout, sockets, jobs, bar, done) -> None:
    """Up to ``jobs`` notebooks at once, in notebook order, each in a worker process of its own while it runs
    (papermill changes the working directory of the process that runs it, so threads would race)."""
    pending = list(paths)
    running = {}
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        while pending or running:
            stop = stop_on_error and any(not r.ok for r in done.values())
            while pending and len(running) < jobs and not stop:
                path = pending.pop(0)
                running[pool.submit(_execute, path, out, params_of[path], kernel, timeout, sockets)] = path
            if not running:
                break
            bar.set_postfix_str(", ".join(p.stem for p in running.values()))
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                path = running.pop(future)
                try:
                    done[path] = future.result()
                except Exception as exc:  # the worker itself failed (killed, out of memory): that notebook failed
                    done[path] = NotebookResult(path.stem, False, 0.0, out / path.name,
                                                f"notebook {path.name} failed: its worker process stopped: "
                                                f"{type(exc).__name__}: {exc}")
                bar.update()
    finally:  # an interrupt starts nothing new and does not wait for the notebooks still running
        pool.shutdown(wait=not pending and not running, cancel_futures=True)


def default_jobs(cpus: int | None, gpu: bool, count: int) -> int:
    """Notebooks to execute at once: one per CPU core on a machine without a GPU (each kernel trains on one torch
    thread and the notebooks share no files), one at a time on a GPU machine (notebook 02 times its kernels there,
    and two kernels would share the GPU)."""
    if gpu or not cpus:
        return 1
    return max(1, min(cpus, count))


def summary(results: list[NotebookResult]) -> str:
    lines = [f"{'notebook':<32} {'status':<7} {'seconds':>8}"]
    for r in results:
        lines.append(f"{r.name:<32} {'ok' if r.ok else 'FAILED':<7} {r.seconds:>8.1f}")
    ok = sum(r.ok for r in results)
    lines.append(f"{ok}/{len(results)} notebooks ok")
    return "\n".join(lines)


def _jobs_value(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: a positive integer, or auto")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="fp8lab notebooks", description="Execute tutorial notebooks with papermill.")
    sub = parser.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="execute notebooks in order (all by default)")
    r.add_argument("names", nargs="*", help="notebook names or numbers, e.g. 01 or 02_convert_to_te")
    r.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                   help="inject a parameter (value parsed as a Python literal when possible)")
    r.add_argument("-o", "--output-dir", default=OUTPUTS)
    r.add_argument("-k", "--kernel", default=None,
                   help=f"Jupyter kernel (default: {KERNEL!r} when it runs this Python, else 'python3')")
    r.add_argument("--keep-going", action="store_true", help="run the remaining notebooks after a failure")
    r.add_argument("-j", "--jobs", default="auto", type=_jobs_value,
                   help="notebooks executed at once: a positive integer, or auto (one per CPU core without a GPU, "
                        "one with a GPU)")
    sub.add_parser("list", help="list notebooks and their parameters")
    args = parser.parse_args(argv)
    if args.action == "list":
        for p in list_notebooks():
            print(f"{p.stem}: {declared_parameters(p)}")
        return 0
    params = {k: coerce(v) for k, v in args.parameter}
    try:
        jobs = args.jobs
        if jobs == "auto":
            import torch  # only here: whether a GPU would be shared is the one thing the runner needs torch for

            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
            jobs = default_jobs(cpus, torch.cuda.is_available(), len(resolve(args.names or None)))
        results = run(args.names or None, params, args.output_dir, args.kernel, stop_on_error=not args.keep_going,
                      jobs=jobs)
    except (NotebookError, ValueError) as exc:
        print(f"fp8lab notebooks: error: {exc}", file=sys.stderr)
        return 1
    print(summary(results))
    return 0 if all(r.ok for r in results) else 1
