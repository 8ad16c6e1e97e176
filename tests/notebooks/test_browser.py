"""Notebook 01 and the HTML report in a real browser: JupyterLab, ipywidgets, headless Chromium.

papermill executes cells headless, where a widget is only a JSON blob. Here this environment's
JupyterLab serves a copy of notebook 01 on 127.0.0.1 (random port, random token); headless
Chromium, driven by Selenium and chromedriver, runs all cells, then moves the explorer's margin
slider (keyboard on the slider handle) and picks E5M2 in its format dropdown, as a person would,
and checks that the widget's figure and numbers change as the physics says they must. The
report that ``fp8lab report`` makes from the committed results (data/results) is opened from a
file, and every figure in it must load and show.

Nothing leaves 127.0.0.1: Chromium resolves no host name and sends whatever is not on loopback
to a dead proxy, and afterwards every request the pages made is checked. The server is stopped
(kernels too) whatever happens. Skipped, with the reason, where Chromium, chromedriver or
Selenium is missing (see conftest.py); ``.ci/run`` installs Debian's Chromium. Artifacts (the
widget after the change; a screenshot of any failure) land in outputs/browser/, ignored by git.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import chromium_paths

from fp8lab.notebooks import GLUE_MIME, KERNEL, NOTEBOOK_DIR
from fp8lab.core.paths import REPO_ROOT

pytestmark = pytest.mark.browser

REPO = REPO_ROOT
ARTIFACTS = REPO / "outputs" / "browser"
NOTEBOOK = "01_fp8_formats.ipynb"
E4M3_MAX, E5M2_MAX = 448.0, 57344.0

SERVER_START_S = 120  # a cold start on 2 cores is ~5 s
PAGE_S = 90  # JupyterLab loading the notebook and starting its kernel
RUN_ALL_S = 420  # notebook 01 takes ~20-40 s on 2 CPU cores
REDRAW_S = 90  # one widget redraw (one explorer_figure on the kernel) takes ~1 s

# JupyterLab user settings (in the test server's private settings dir): no news prompt and no
# update check (nothing to fetch, no toast over the widget), no autosave, and every cell rendered
# (no windowing), so the DOM holds every output whatever the scroll position
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces it lacks there
    "--disable-dev-shm-usage",  # containers give /dev/shm 64 MB
    "--window-size=1400,1000",
    "--force-device-scale-factor=1",
    # nothing but loopback: no host name resolves, and anything not on loopback goes to a dead proxy
    # (Chromium never proxies loopback)
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--no-default-browser-check",
    "--no-first-run",
]

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")

# the live notebook, read from JupyterLab's own models (window.jupyterapp: --expose-app-in-browser)
NOTEBOOK_STATE_JS = """
const glueMime = arguments[0];
const app = window.jupyterapp;
const panel = app && app.shell.currentWidget;
if (!panel || !panel.content || !panel.sessionContext || !panel.context || !panel.context.isReady) {
  return null;
}
const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
const cells = panel.content.widgets.map((cell, index) => {
  const code = cell.model.type === 'code';
  const outputs = code ? cell.model.outputs.toJSON() : [];
  return {
    index, type: cell.model.type, count: code ? cell.model.executionCount : null,
    outputs: outputs.map(o => ({
      type: o.output_type, name: o.name || null,
      text: o.output_type === 'error' ? `${o.ename}: ${o.evalue}` : (o.name === 'stderr' ? String(o.text) : null),
      glue: (o.data && o.data[glueMime]) || null,
    })),
  };
});
return {path: panel.context.path, kernel: kernel ? kernel.name : null,
        status: kernel ? kernel.status : null, cells};
"""

# every rendered image under a root: loaded, with a real size in the file and on the page
IMAGES_JS = """
return Array.from(arguments[0].querySelectorAll('img')).map(img => {
  const r = img.getBoundingClientRect();
  return {complete: img.complete, natural: [img.naturalWidth, img.naturalHeight],
          shown: [r.width, r.height], src_len: img.src.length, src_tail: img.src.slice(-64),
          alt: img.alt || ''};
});
"""


# ------------------------------------------------------------------------------- helpers


def _wait_for(what: str, probe, timeout: float, interval: float = 0.2, on_timeout=lambda: ""):
    """Poll ``probe()`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{on_timeout()}")
        time.sleep(interval)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _loopback_opener():
    # never through a proxy from the environment: the only host these tests talk to is 127.0.0.1
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_ok(url: str, token: str) -> bool:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with _loopback_opener().open(req, timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet, or half written
        return None


def _pids_naming(needle: str) -> list[int]:
    """Processes whose command line contains ``needle`` (a path only our server's kernels use)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if needle.encode() in (d / "cmdline").read_bytes() and int(d.name) != os.getpid():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _stop_server(proc: subprocess.Popen, runtime_dir: Path) -> None:
    """SIGTERM to the server's process group (the server then shuts its kernels down), SIGKILL if
    it lingers; then SIGKILL any of its kernels still alive. Kernels run in sessions of their own,
    but their command line names a connection file in this server's private runtime dir."""
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # the group is ours while proc is not yet reaped
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    for pid in _pids_naming(str(runtime_dir)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Lab:
    """A running JupyterLab: its base URL, token, the folder it serves and its log."""

    url: str
    token: str
    root: Path
    log: Path

    def tree(self, name: str) -> str:
        return f"{self.url}lab/tree/{name}?token={self.token}"

    def api(self, path: str):
        req = urllib.request.Request(f"{self.url}api/{path}", headers={"Authorization": f"token {self.token}"})
        with _loopback_opener().open(req, timeout=10) as r:
            return json.loads(r.read())


class Browser:
    """The Selenium driver plus what the page logged and requested since the last ``drain``."""

    def __init__(self, driver):
        self.driver = driver

    def drain(self) -> tuple[list[dict], list[str]]:
        """(console entries, request URLs) since the last call."""
        console = self.driver.get_log("browser")
        urls = []
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg["method"] == "Network.requestWillBeSent":
                urls.append(msg["params"]["request"]["url"])
            elif msg["method"] == "Network.webSocketCreated":
                urls.append(msg["params"]["url"])
        return console, urls

    def screenshot_on_failure(self, name: str):
        """A context manager: on any failure inside, keep outputs/browser/<name>-failure.png."""
        return _screenshot_on_failure(self.driver, name)


@contextlib.contextmanager
def _screenshot_on_failure(driver, name: str):
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / f"{name}-failure.png"))
        raise


def _off_loopback(urls: list[str], allowed_schemes: set[str]) -> list[str]:
    bad = []
    for u in urls:
        parts = urlsplit(u)
        if parts.scheme in allowed_schemes:
            continue
        if parts.scheme in ("http", "ws") and parts.hostname == "127.0.0.1":
            continue
        bad.append(u[:120])
    return bad


def _errors(console: list[dict]) -> list[str]:
    return [e["message"] for e in console if e.get("level") == "SEVERE"]


# ------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def no_proxy_env():
    """Proxy variables cleared for this module: Selenium's client, the server and its kernels
    talk to 127.0.0.1 only, and must never route that through a proxy."""
    with pytest.MonkeyPatch.context() as mp:
        for name in PROXY_VARS:
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def lab(tmp_path_factory, no_proxy_env):
    """JupyterLab from this interpreter's environment on 127.0.0.1, random port and token,
    private config/data/runtime/settings dirs, serving a copy of notebook 01 (the committed
    notebook stays output-free). Stopped, kernels included, however the tests end."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "notebooks"
    root.mkdir()
    shutil.copy(NOTEBOOK_DIR / NOTEBOOK, root / NOTEBOOK)
    dirs = {k: base / k for k in ("config", "data", "runtime", "settings", "workspaces")}
    for d in dirs.values():
        d.mkdir()
    for plugin, values in LAB_SETTINGS.items():
        f = dirs["settings"] / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    token = secrets.token_hex(24)
    # the user's Jupyter dirs stay out (a python3 kernel in ~/.local would shadow this venv's);
    # MPLBACKEND is dropped so the kernel draws inline as it does for a person
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER") and k != "MPLBACKEND"}
    env.update(JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTER_DATA_DIR=str(dirs["data"]),
               JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
               JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
               JUPYTER_TOKEN=token)  # through the environment, not argv: no token in `ps`
    # the kernel `fp8lab` in the user's Jupyter folder, registered as scripts/setup.sh does (--user:
    # where SageMaker Studio's JupyterLab finds it); JUPYTER_DATA_DIR keeps it in this test's folder
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name", KERNEL,
                    "--display-name", "fp8lab (Python 3)"], env=env, check=True, capture_output=True, timeout=120)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
           "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0",  # port 0: the server binds a free one
           "--ServerApp.port_retries=0", "--ServerApp.terminals_enabled=False",
           "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: run all, read the models
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly"]  # no PyPI queries
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = base / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        def why():
            state = f"exited with {proc.returncode}" if proc.poll() is not None else "still running"
            return f"; server {state}; its log ends:\n{_tail(log)}"

        info_file = dirs["runtime"] / f"jpserver-{proc.pid}.json"  # written once it listens

        def server_info():
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab did not start{why()}")
            return _read_json(info_file)

        info = _wait_for("JupyterLab's server info file", server_info, SERVER_START_S, on_timeout=why)
        url = f"http://127.0.0.1:{info['port']}/"
        _wait_for("JupyterLab's API", lambda: _http_ok(url + "api/status", token), SERVER_START_S, on_timeout=why)
        yield Lab(url=url, token=token, root=root, log=log)
    finally:
        _stop_server(proc, dirs["runtime"])


@pytest.fixture(scope="module")
def browser(no_proxy_env):
    """Headless Chromium through chromedriver (both Debian's), logging console and network."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = chromium_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in CHROMIUM_ARGS:
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # a driver path given: Selenium Manager (which would download drivers) is never run
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=chromedriver))
    try:
        driver.set_page_load_timeout(PAGE_S)
        driver.set_script_timeout(30)
        yield Browser(driver)
    finally:
        driver.quit()


# ------------------------------------------------------------------------------- notebook 01

SUMMARY = re.compile(
    r"(?P<fmt>E4M3|E5M2), margin (?P<margin>\d+), history (?P<history>\d+): "
    r"scale (?P<scale_before>\S+) before the spike, (?P<scale_after>\S+) after; "
    r"then underflow (?P<underflow>\S+)%, SNR (?P<snr_after>\S+) dB \(before (?P<snr_before>\S+) dB\); "
    r"SNR (?:back within 1 dB in (?P<recover>\d+) steps?|not back within 1 dB)")


def _widget_state(driver) -> dict | None:
    """What the explorer shows: its numbers line, slider readout, format and figure."""
    return driver.execute_script("""
      const box = document.querySelector('.fp8lab-explorer');
      if (!box) return null;
      const q = s => box.querySelector(s);
      const img = q('.fp8lab-explorer-figure img');
      const select = q('.fp8lab-explorer-fmt select');
      const readout = q('.fp8lab-explorer-margin .widget-readout');
      return {
        stats: q('.fp8lab-explorer-stats') ? q('.fp8lab-explorer-stats').textContent.trim() : null,
        fmt: select ? select.value : null,
        margin: readout ? readout.textContent.trim() : null,
        handle: !!q('.fp8lab-explorer-margin .noUi-handle'),
        img: img ? {complete: img.complete, natural: [img.naturalWidth, img.naturalHeight], src: img.src} : null,
      };
    """)


def _brief(state: dict | None) -> str:
    """A widget state for a failure message: the figure's data URL shortened to its length."""
    if state and state.get("img"):
        state = {**state, "img": {**state["img"], "src": f"<{len(state['img']['src'])} chars>"}}
    return repr(state)


def _wait_for_drawn(driver, prefix: str, previous_src: str | None) -> tuple[dict, dict]:
    """Wait until the widget's numbers start with ``prefix`` and a new figure has loaded."""
    def drawn():
        s = _widget_state(driver)
        if not s or not s["stats"] or not s["stats"].startswith(prefix) or not s["img"]:
            return None
        img = s["img"]
        if not img["complete"] or min(img["natural"]) <= 0 or img["src"] == previous_src:
            return None
        return s

    s = _wait_for(f"the explorer to redraw for {prefix!r}", drawn, REDRAW_S,
                  on_timeout=lambda: f"; the widget shows {_brief(_widget_state(driver))}")
    m = SUMMARY.fullmatch(s["stats"])
    assert m, f"the explorer's numbers line has an unexpected form: {s['stats']!r}"
    nums = {k: (v if k == "fmt" else None if v is None else float(v)) for k, v in m.groupdict().items()}
    return s, nums


def test_notebook_01_runs_in_jupyterlab_and_the_explorer_responds(lab, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    d = browser.driver
    browser.drain()
    with browser.screenshot_on_failure("01_fp8_formats"):
        d.get(lab.tree(NOTEBOOK))
        state = lambda: d.execute_script(NOTEBOOK_STATE_JS, GLUE_MIME)  # noqa: E731
        _wait_for("the notebook and an idle kernel", lambda: (s := state()) and s["status"] == "idle" and s,
                  PAGE_S, on_timeout=lambda: f"; state {state()!r:.300}; server log:\n{_tail(lab.log)}")
        st = state()
        assert st["path"] == NOTEBOOK and st["kernel"] == KERNEL  # the notebook's kernelspec names it
        # the fp8lab kernel is this environment's interpreter (setup.sh installs that kernelspec)
        argv0 = lab.api("kernelspecs")["kernelspecs"][KERNEL]["spec"]["argv"][0]
        prefix = subprocess.run([argv0, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                                check=True, timeout=60).stdout.strip()
        assert prefix == sys.prefix, f"the {KERNEL} kernel runs {argv0} (prefix {prefix}), not {sys.prefix}"
        code_cells = [c for c in st["cells"] if c["type"] == "code"]
        assert len(code_cells) >= 10 and all(c["count"] is None and not c["outputs"] for c in code_cells)

        d.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells'); return true;")

        def finished():
            s = state()
            codes = [c for c in s["cells"] if c["type"] == "code"]
            return s if s["status"] == "idle" and all(c["count"] is not None for c in codes) else None

        def counts():
            return f"; execution counts: {[c['count'] for c in state()['cells'] if c['type'] == 'code']}"

        st = _wait_for("Run All to finish", finished, RUN_ALL_S, interval=0.5, on_timeout=counts)
        code_cells = [c for c in st["cells"] if c["type"] == "code"]
        # in order, one run each, and nothing a reader would see as an error
        assert [c["count"] for c in code_cells] == list(range(1, len(code_cells) + 1))
        problems = [(c["index"], o["text"]) for c in code_cells for o in c["outputs"]
                    if o["type"] == "error" or o["name"] == "stderr"]
        assert not problems, f"cells show errors or stderr: {problems}"
        shown = d.execute_script("""return Array.from(document.querySelectorAll(
            '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')).map(e => e.textContent)""")
        assert not shown, f"error outputs on the page: {shown}"
        # every figure the notebook drew is an image the browser decoded and shows
        notebook_node = d.find_element(By.CSS_SELECTOR, ".jp-Notebook")
        images = d.execute_script(IMAGES_JS, notebook_node)
        assert len(images) >= 7, images  # bits, value grid, rel. error, histograms, recipes, spike, explorer
        assert all(i["complete"] and min(i["natural"]) > 0 and min(i["shown"]) > 0 for i in images), images
        glued = {o["glue"]["name"]: o["glue"]["value"] for c in code_cells for o in c["outputs"] if o["glue"]}
        default = glued["explorer"]  # the static figure's numbers: the notebook's defaults
        assert (default["fmt"], default["margin"]) == ("E4M3", 0)

        # the widget: rendered by the ipywidgets extension, nothing drawn until a control moves
        w0 = _wait_for("the explorer widget", lambda: (s := _widget_state(d)) and s["handle"] and s["fmt"] and s,
                       REDRAW_S, on_timeout=lambda: f"; widget {_brief(_widget_state(d))}")
        assert (w0["fmt"], w0["margin"], w0["img"]) == ("E4M3", "0", None)
        assert w0["stats"].startswith("Move a control")
        box = d.find_element(By.CSS_SELECTOR, ".fp8lab-explorer")

        # margin 0 -> 1 with the keyboard on the slider's handle
        handle = box.find_element(By.CSS_SELECTOR, ".fp8lab-explorer-margin .noUi-handle")
        d.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].focus();", handle)
        handle.send_keys(Keys.ARROW_RIGHT)
        w1, n1 = _wait_for_drawn(d, "E4M3, margin 1,", None)
        assert w1["margin"] == "1" and n1["history"] == default["history_len"]
        # scale = max / amax / 2**margin: one more margin bit halves the scale of the same tensors
        assert n1["scale_before"] == pytest.approx(default["scale_before_spike"] / 2, rel=1e-5)
        assert n1["scale_after"] == pytest.approx(default["scale_after_spike"] / 2, rel=1e-5)

        # format E4M3 -> E5M2 in the dropdown
        Select(box.find_element(By.CSS_SELECTOR, ".fp8lab-explorer-fmt select")).select_by_visible_text("E5M2")
        w2, n2 = _wait_for_drawn(d, "E5M2, margin 1,", w1["img"]["src"])
        assert w2["fmt"] == "E5M2" and w2["margin"] == "1"
        # same tensors and margin, other format: the scales differ by 57344 / 448 = 128
        assert n2["scale_before"] / n1["scale_before"] == pytest.approx(E5M2_MAX / E4M3_MAX, rel=1e-5)
        # E5M2's range absorbs the post-spike scale that costs E4M3 its small values
        assert n2["underflow"] < n1["underflow"]
        assert n2["recover"] is not None and n1["recover"] is not None and n2["recover"] < n1["recover"]
        assert n2 != n1 and w2["img"]["src"] != w1["img"]["src"]

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "01_explorer_after_change.png"
        d.execute_script("arguments[0].scrollIntoView({block: 'start'});", box)
        box.screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        console, urls = browser.drain()
        assert not _errors(console), f"console errors in JupyterLab: {_errors(console)}"
        elsewhere = _off_loopback(urls, {"data", "blob", "about"})
        assert urls and not elsewhere, f"requests off 127.0.0.1: {elsewhere}"


# ------------------------------------------------------------------------------- the HTML report


class _ImgCount(HTMLParser):
    def __init__(self):
        super().__init__()
        self.n = 0

    def handle_starttag(self, tag, attrs):
        self.n += tag == "img"


def test_report_of_committed_results_renders_in_chromium(browser, tmp_path):
    out = tmp_path / "site" / "report.html"
    res = subprocess.run([sys.executable, "-m", "fp8lab", "report", str(REPO / "data" / "results"), "--out", str(out)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    parser = _ImgCount()
    parser.feed(out.read_text())
    assert parser.n >= 6  # the report's figures (throughput, MFU, loss, ...), each an embedded PNG

    d = browser.driver
    browser.drain()
    with browser.screenshot_on_failure("report"):
        d.get(out.as_uri())

        def loaded():
            imgs = d.execute_script("return document.readyState === 'complete' ? true : null") and \
                d.execute_script(IMAGES_JS, d.find_element("tag name", "body"))
            return imgs if imgs and all(i["complete"] for i in imgs) else None

        images = _wait_for("the report's images to load", loaded, PAGE_S)
        assert len(images) == parser.n
        broken = [i for i in images if min(i["natural"]) <= 0 or min(i["shown"]) <= 0]
        assert not broken, f"figures that did not render: {broken}"
        assert all(i["alt"] for i in images)  # each figure says what it shows
        # made for a screen: no figure wider than ~1600 px or longer than 3:1 either way, and the page
        # never scrolls sideways in a 1400 px window (wide tables scroll inside their own box)
        for i in images:
            w, h = i["natural"]
            assert w <= 1600 and max(w / h, h / w) <= 3.0, f"figure {i['alt']!r} is {w} x {h} px"
        assert len({i["alt"] for i in images}) == len(images)  # each figure named apart
        width = d.execute_script("return [window.innerWidth, document.documentElement.scrollWidth]")
        assert width[0] == 1400 and width[1] <= width[0], f"the page scrolls sideways: {width}"
        # the long tables show what a reader needs first; the rest waits behind <details>
        details = d.execute_script("return document.querySelectorAll('details').length")
        assert details >= 3
        first_tables = d.execute_script(
            "return [...document.querySelectorAll('body > div.wide > table')]"
            ".map(t => [t.rows.length, t.rows[0].cells.length])")
        assert first_tables and all(rows <= 13 and cols <= 12 for rows, cols in first_tables), first_tables
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        d.save_screenshot(str(ARTIFACTS / "report_top.png"))

        console, urls = browser.drain()
        assert not _errors(console), f"console errors in the report: {_errors(console)}"
        elsewhere = _off_loopback(urls, {"data", "file"})
        assert urls and not elsewhere, f"requests off this machine: {elsewhere}"
