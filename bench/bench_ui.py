"""Speed of the web app in a real browser (headless Chromium through Selenium).

    python bench/bench_ui.py              # ResNet-50 and the 28k-op DenseNet, 5 repeats
    python bench/bench_ui.py --repeats 9
    python bench/bench_ui.py --skip-large # ResNet-50 only

For each graph the app runs in its own subprocess (``python -m lmsviz FILE``) on a free
port of 127.0.0.1. Measured, as medians over the repeats:

- first paint: from the start of navigation (a new tab each time, so nothing is restored)
  to the moment the device curve of the figure is drawn (``performance.now()`` in the
  page, polled every 20 ms);
- knob change: a new threshold, then "apply knobs". *server* is the time the two Dash
  requests it causes (the control callback, which makes the plan, and the render
  callback, which rewrites, simulates and builds the figure patch) spend waiting for
  their responses (Resource Timing ``responseStart - requestStart``, localhost);
  *visible* is from the click, as the page receives it (the event's timestamp), to the
  redrawn figure; the time from the driver's click command is printed beside it (the
  command itself takes 20-40 ms to reach the page);
- level click: a click on the memory curve selects a level; time from Plotly's click
  event to the hotspot table's caption naming that level (the large graph's "usable"
  check);
- swap toggle and batch change: from the click (or Enter), as the page receives it, to the
  updated summary, and the requests' server time as for the knob change.

Where the server's time goes: the app runs with ``LMS_TIMING`` set, so it logs each
callback's stages (``lmsviz.state.timed``); each action's lines are read back from its log
and printed as medians per callback and stage.

The 28k-op graph is ``bench/out/densenet121.pb``, made with
``python sample_graphs/generate.py --densenet-27k bench/out/densenet121.pb`` when missing
(TensorFlow, about a minute).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from browser_kit import CHROMEDRIVER, POINT_XY, chrome_options  # noqa: E402
from dash_client import free_port  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

from lmsviz import figures  # noqa: E402

DENSENET = REPO / "bench" / "out" / "densenet121.pb"


#: A page with one two-point line plot: the floor of any first paint (loading Dash and
#: plotly.js, 4.8 MB, in this browser on this machine).
FLOOR_APP = """
import sys, dash
from dash import dcc, html
app = dash.Dash(__name__)
app.layout = html.Div([dcc.Graph(id="studio", figure={"data": [
    {"type": "scatter", "x": [0, 1], "y": [0, 1], "mode": "lines"}]})])
app.run(host="127.0.0.1", port=int(sys.argv[1]), debug=False)
"""


class ServerLog:
    """The stage timings the app logs (``LMS_TIMING``), read back action by action."""

    LINE = re.compile(r"timing (.+?) ([0-9.]+) ms: (.*)$")

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.offset = 0

    def take(self) -> dict[str, float]:
        """Milliseconds per callback and per ``callback/stage`` logged since the last call."""
        if not self.path.exists():
            return {}
        with self.path.open() as f:
            f.seek(self.offset)
            text = f.read()
            self.offset = f.tell()
        out: dict[str, float] = defaultdict(float)
        for line in text.splitlines():
            m = self.LINE.search(line)
            if not m:
                continue
            callback = m.group(1).split(" ")[0]  # "control knobs-apply" -> "control"
            out[callback] += float(m.group(2))
            for part in filter(None, m.group(3).split(", ")):
                name, _, ms = part.rpartition(" ")
                out[f"{callback}/{name}"] += float(ms)
        return dict(out)


def stages_line(takes: list[dict[str, float]]) -> str:
    """Median milliseconds per callback, its stages in brackets."""
    keys = sorted({k for t in takes for k in t})
    med = {k: statistics.median(t.get(k, 0.0) for t in takes) for k in keys}
    parts = []
    for cb in (k for k in keys if "/" not in k):
        inner = ", ".join(f"{k.split('/', 1)[1]} {med[k]:.0f}" for k in keys
                          if k.startswith(cb + "/") and med[k] >= 0.5)
        parts.append(f"{cb} {med[cb]:.0f}" + (f" ({inner})" if inner else ""))
    return "; ".join(parts) or "n/a"


def start(graph: str, batch: int | None, data: pathlib.Path,
          checkout: pathlib.Path = REPO) -> tuple[subprocess.Popen, str]:
    """``python -m lmsviz GRAPH`` of ``checkout`` on a free port, its log in ``data``."""
    port = free_port()
    cmd = [sys.executable, "-m", "lmsviz", graph, "--port", str(port), "--data-dir", str(data)]
    if graph == "floor":
        cmd = [sys.executable, "-c", FLOOR_APP, str(port)]
    if batch:
        cmd += ["--batch-size", str(batch)]
    with (data / "server.log").open("w") as log:  # the stage timings (ServerLog)
        env = {**os.environ, "LMS_TIMING": "1"}
        if checkout != REPO:  # another version of the app (bench_ui_pair.py)
            env["PYTHONPATH"] = str(checkout)
        proc = subprocess.Popen(cmd, cwd=checkout, stdout=subprocess.DEVNULL, stderr=log,
                                env=env)
    url = f"http://127.0.0.1:{port}/"
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 180:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the app for {graph} from {checkout} exited with "
                                 f"{proc.returncode} (see {data / 'server.log'})") from None
            time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"the app for {graph} did not start")


def browser() -> Any:
    opts = chrome_options(tempfile.mkdtemp(prefix="lms-bench-"))
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


CURVE_DRAWN = """
var gd = document.querySelector('#studio .js-plotly-plot');
var t = gd && gd._fullData && gd._fullData[arguments[0]];
var drawn = t && t.y && t.y.length > 0 && gd.querySelector('.scatterlayer .trace path.js-line');
return drawn ? performance.now() : null;
"""


def poll(driver: Any, script: str, *args: Any, timeout: float = 120) -> Any:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        value = driver.execute_script(script, *args)
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(script[:60])


def first_paint(driver: Any, url: str) -> float:
    """Milliseconds from navigation start to the drawn device curve, in a fresh tab."""
    driver.switch_to.new_window("tab")
    driver.get(url)
    ms = poll(driver, CURVE_DRAWN, figures.T_BEFORE)
    return float(ms)


def close_tab(driver: Any, keep: str) -> None:
    driver.close()
    driver.switch_to.window(keep)


def text(driver: Any, id_: str) -> str:
    return driver.find_element(By.ID, id_).text


#: Thresholds that give ResNet-50 plans of different sizes, applied in turn.
THRESHOLDS = (2, 20, 1, 50, 3, 100, 10, 200)

#: Records when the page receives the user's click or Enter (``window.__event``): what a
#: user waits for starts there. The driver's command reaches the page 20-40 ms after the
#: script sets ``__t0``; both are printed.
EVENT_HOOK = """
if (!window.__lmsEvents) {
    window.__lmsEvents = true;
    var mark = function (e) { if (!window.__event) { window.__event = e.timeStamp; } };
    document.addEventListener('click', mark, true);
    document.addEventListener('keydown', function (e) {
        if (e.key === 'Enter') { mark(e); } }, true);
}
window.__event = 0;
"""

HOOK = EVENT_HOOK + """
var gd = document.querySelector('#studio .js-plotly-plot');
if (!gd.__lmsHooked) {
    gd.__lmsHooked = true;
    gd.on('plotly_afterplot', function () { window.__plotted = performance.now(); });
}
window.__plotted = 0;
performance.clearResourceTimings();
window.__t0 = performance.now();
"""


def knob_change(driver: Any, threshold: int) -> tuple[float, float, float]:
    """(server ms, visible ms, ms from the driver's command) of applying a new threshold."""
    field = driver.find_element(By.ID, "knob-threshold")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE, str(threshold), Keys.TAB)
    time.sleep(0.3)
    driver.execute_script(HOOK)
    driver.find_element(By.ID, "knobs-apply").click()
    entries = poll(driver, """
        var e = performance.getEntriesByType('resource').filter(
            r => r.name.indexOf('_dash-update-component') >= 0 && r.responseEnd > 0);
        return e.length >= 2 && window.__plotted > 0 && window.__event > 0
            ? [window.__plotted - window.__event, window.__plotted - window.__t0].concat(
                  e.map(r => r.responseStart - r.requestStart)) : null;""")
    return float(sum(entries[2:])), float(entries[0]), float(entries[1])


def click_curve(driver: Any, level: int) -> None:
    """Click the device curve's point at ``level``."""
    dx, dy = driver.execute_script(POINT_XY, figures.T_BEFORE, level)
    plot = driver.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    webdriver.ActionChains(driver).move_to_element_with_offset(
        plot, int(dx), int(dy)).pause(0.2).click().perform()


LEVEL_HOOK = """
var gd = document.querySelector('#studio .js-plotly-plot');
if (!gd.__lmsClick) {
    gd.__lmsClick = true;
    gd.on('plotly_click', function () { window.__clicked = performance.now(); });
    new MutationObserver(function () { window.__shown = performance.now(); }).observe(
        document.getElementById('hotspot-caption'), {childList: true, subtree: true,
                                                     characterData: true});
}
window.__clicked = 0; window.__shown = 0;
"""


def level_click(driver: Any, level: int) -> float:
    """Milliseconds from Plotly's click on the memory curve to the table caption update."""
    driver.execute_script(LEVEL_HOOK)
    click_curve(driver, level)
    return float(poll(driver, "return window.__shown > window.__clicked && window.__clicked > 0"
                              " ? window.__shown - window.__clicked : null", timeout=60))


SUMMARY_HOOK = EVENT_HOOK + """
if (!window.__lmsSummary) {
    window.__lmsSummary = true;
    new MutationObserver(function () { window.__changed = performance.now(); }).observe(
        document.getElementById('summary'), {childList: true, subtree: true,
                                             characterData: true});
}
window.__changed = 0;
performance.clearResourceTimings();
window.__t0 = performance.now();
"""

SERVER_WAIT = """
return performance.getEntriesByType('resource').filter(
    r => r.name.indexOf('_dash-update-component') >= 0 && r.responseEnd > 0).map(
    r => r.responseStart - r.requestStart);
"""


def toggle(driver: Any) -> tuple[float, float, float]:
    """(server ms, visible ms, ms from the driver's command) from a click on a hotspot's swap
    cell to the summary's update."""
    # a tick or an untick: both change the plan (the knobs' plan may have ticked them all)
    cell = next(c for c in driver.find_elements(
        By.CSS_SELECTOR, '#hotspots td[data-dash-column="swap"]') if c.text.strip() != "\u2014")
    before = text(driver, "sum-swapped")
    driver.execute_script(SUMMARY_HOOK)
    cell.click()
    poll(driver, "return document.getElementById('sum-swapped').textContent !== arguments[0]"
                 " && window.__changed > 0 ? 1 : null", before, timeout=120)
    return (float(sum(driver.execute_script(SERVER_WAIT))), *_visible(driver))


def _visible(driver: Any) -> tuple[float, float]:
    """Milliseconds to the summary's change from the user's event and from the command."""
    since = driver.execute_script("return [window.__changed - window.__event,"
                                  " window.__changed - window.__t0]")
    return float(since[0]), float(since[1])


def batch_change(driver: Any, batch: int) -> tuple[float, float, float]:
    """(server ms, visible ms, ms from the driver's command) from Enter in the batch field
    to the summary naming it."""
    field = driver.find_element(By.ID, "batch")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE, str(batch))
    driver.execute_script(SUMMARY_HOOK)
    field.send_keys(Keys.ENTER)
    poll(driver, "return document.getElementById('sum-graph').textContent.indexOf("
                 "'batch ' + arguments[0]) >= 0 ? 1 : null", batch, timeout=300)
    return (float(sum(driver.execute_script(SERVER_WAIT))), *_visible(driver))


def floor(repeats: int) -> list[float]:
    """First paints of the one-plot page."""
    proc, url = start("floor", None, pathlib.Path(tempfile.mkdtemp()))
    driver = browser()
    try:
        driver.get(url)
        home = driver.current_window_handle
        poll(driver, CURVE_DRAWN, 0)
        paints = []
        for _ in range(repeats):
            driver.switch_to.new_window("tab")
            driver.get(url)
            paints.append(float(poll(driver, CURVE_DRAWN, 0)))
            close_tab(driver, home)
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=20)
    print(f"\nfloor: a Dash page with one 2-point line plot\n  first paint             "
          f"{median(paints)}   (n={len(paints)})")
    return paints


def median(xs: list[float]) -> str:
    return f"{statistics.median(xs):8.0f} ms" if xs else "      n/a"


def bench(name: str, graph: str, batch: int | None, repeats: int) -> dict[str, Any]:
    data = pathlib.Path(tempfile.mkdtemp(prefix="lms-bench-data-"))
    proc, url = start(graph, batch, data)
    driver = browser()
    try:
        driver.get(url)
        home = driver.current_window_handle
        poll(driver, CURVE_DRAWN, figures.T_BEFORE)  # warm up the server caches
        paints = []
        for _ in range(repeats):
            paints.append(first_paint(driver, url))
            close_tab(driver, home)
        note = text(driver, "ordering-note")
        points = driver.execute_script(
            "var gd = document.querySelector('#studio .js-plotly-plot');"
            "return [0,1,2,3,4].reduce((s, k) => s + gd._fullData[k].x.length, 0);")
        log = ServerLog(data / "server.log")
        log.take()
        servers, visibles, commands, knob_stages = [], [], [], []
        for k in range(repeats):
            s, v, c = knob_change(driver, THRESHOLDS[k % len(THRESHOLDS)])
            servers.append(s)
            visibles.append(v)
            commands.append(c)
            time.sleep(0.2)  # the log line of the last request
            knob_stages.append(log.take())
        n_levels = len(driver.execute_script(
            "return document.querySelector('#studio .js-plotly-plot')._fullData[arguments[0]].x",
            figures.T_BEFORE))
        clicks = [level_click(driver, n_levels * (k + 1) // (repeats + 2))
                  for k in range(max(2, repeats // 2))]
        log.take()

        def logged(measure: Any, *args: Any) -> tuple[float, float, dict[str, float], float]:
            server, visible, command = measure(*args)
            time.sleep(0.2)
            return server, visible, log.take(), command

        toggled = [logged(toggle, driver) for _ in range(repeats)]
        batched = [logged(batch_change, driver, b) for b in (4, 8, 6, 12, 2, 16, 3)[:repeats]]
        toggles = [v for _, v, _, _ in toggled]
        batches = [v for _, v, _, _ in batched]
        ops = text(driver, "sum-graph")
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=20)
    print(f"\n{name}: {ops}")
    print(f"  ordering points drawn   {points:,}" + (f"  ({note})" if note else ""))
    print(f"  first paint             {median(paints)}   (n={len(paints)}: "
          + ", ".join(f"{p:.0f}" for p in paints) + ")")
    print(f"  knob change, server     {median(servers)}   (n={len(servers)}: "
          + ", ".join(f"{p:.0f}" for p in servers) + ")")
    print(f"  knob change, visible    {median(visibles)}   (from the driver's command: "
          f"{median(commands).strip()})")
    print(f"    server stages: {stages_line(knob_stages)}")
    print(f"  level click -> table    {median(clicks)}")
    print(f"  swap toggle -> summary  {median(toggles)}   (n={len(toggles)}: "
          + ", ".join(f"{p:.0f}" for p in toggles) + ")")
    print(f"    server {median([s for s, _, _, _ in toggled])}; from the driver's command "
          f"{median([c for _, _, _, c in toggled]).strip()}; stages: "
          + stages_line([t for _, _, t, _ in toggled]))
    print(f"  batch change -> summary {median(batches)}   (n={len(batches)}: "
          + ", ".join(f"{p:.0f}" for p in batches) + ")")
    print(f"    server {median([s for s, _, _, _ in batched])}; from the driver's command "
          f"{median([c for _, _, _, c in batched]).strip()}; stages: "
          + stages_line([t for _, _, t, _ in batched]))
    return {"paint": paints, "server": servers, "visible": visibles, "clicks": clicks,
            "toggles": toggles, "batches": batches}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-large", action="store_true")
    args = p.parse_args()
    base = floor(args.repeats)
    res = bench("ResNet-50 (sample, batch 8)", "resnet50", None, args.repeats)
    large = None
    if not args.skip_large:
        if not DENSENET.exists():
            print(f"generating {DENSENET} ...", flush=True)
            subprocess.run([sys.executable, "sample_graphs/generate.py", "--densenet-27k",
                            str(DENSENET)], cwd=REPO, check=True)
        large = bench("DenseNet-121 (28k ops, batch 32)", str(DENSENET), 32,
                      max(3, args.repeats // 2 + 1))
    print("\nsummary (visible, targets: < 300 ms on ResNet-50, < 1 s on the 28k-op graph)")
    print(f"  ResNet-50 first paint        {statistics.median(res['paint']):.0f} ms "
          f"(floor {statistics.median(base):.0f} ms)")
    for label, r, target in (("ResNet-50", res, 300), ("28k graph", large, 1000)):
        if not r:
            continue
        for what, key in (("knob change", "visible"), ("swap toggle", "toggles"),
                          ("batch change", "batches")):
            ms = statistics.median(r[key])
            print(f"  {label} {what:<13} {ms:6.0f} ms "
                  f"({'PASS' if ms < target else 'MISS'}: < {target} ms)")
    if large:
        print(f"  28k graph first paint        {statistics.median(large['paint']):.0f} ms; "
              f"level click {statistics.median(large['clicks']):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
