"""The web app in a real browser: headless Chromium driven by Selenium.

The app runs in a subprocess (``python -m lmsviz``) on a free port of 127.0.0.1 with its
own data directory. The tests run in file order on one browser window: they load the mlp
sample, read its peak, recompute a tensor by hand, upload a graph, toggle a hotspot, run
auto-tune, export, and check that bad uploads are refused, that a reload keeps the work
and that another tab does not see it. Screenshots of the main states go to
``test-output/screenshots/``.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
from browser_kit import CHROMEDRIVER, CHROMIUM, POINT_XY, chrome_options, text, wait
from dash_client import Server

from lmscore import samples
from lmsviz import figures

pytestmark = pytest.mark.browser

REPO = pathlib.Path(__file__).resolve().parent.parent
SHOTS = REPO / "test-output" / "screenshots"
UPLOAD_CAP = "1MiB"  # resnet50.pb (1.7 MB) is then over it


def _missing() -> str:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    return ""


if _missing():
    pytest.skip(_missing(), allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.actions.wheel_input import ScrollOrigin  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402


@pytest.fixture(scope="module")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("lms-data"), "mlp", "--upload-cap", UPLOAD_CAP)
    try:
        srv.start()
    except RuntimeError as e:
        pytest.fail(str(e))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def server(app_server: Server) -> str:
    return app_server.url + "/"


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(server: str, downloads: pathlib.Path) -> Iterator[Any]:
    profile = tempfile.mkdtemp(prefix="lms-chromium-")
    opts = chrome_options(profile)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                           {"behavior": "allow", "downloadPath": str(downloads)})
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.get(server)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def trace_len(driver: Any, k: int) -> int:
    """Points of trace ``k`` of the studio figure as plotted in the page."""
    return driver.execute_script(
        "var gd = document.querySelector('#studio .js-plotly-plot');"
        "var t = gd && gd._fullData && gd._fullData[arguments[0]];"  # decoded arrays
        "if (!t) return -1; return t.y ? t.y.length : 0;", k)


def shot(driver: Any, name: str) -> None:
    driver.save_screenshot(str(SHOTS / name))


def type_into(driver: Any, id_: str, value: str) -> None:
    """Replace a field's text and press Enter (debounced inputs send on Enter)."""
    field = driver.find_element(By.ID, id_)
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE, value, Keys.ENTER)
    wait(driver, lambda: field.get_attribute("value") == value, msg=f"{id_} = {value}")


def upload(driver: Any, upload_id: str, path: pathlib.Path) -> None:
    driver.find_element(By.CSS_SELECTOR, f"#{upload_id} input[type=file]").send_keys(str(path))


def messages(driver: Any) -> str:
    """What the two message areas say (above the views, next to the table)."""
    return " | ".join(t for t in (text(driver, "message"), text(driver, "edit-message")) if t)


def message_with(driver: Any, *words: str, timeout: float = 30, area: str | None = None
                 ) -> str:
    """Wait for a message holding ``words`` (in ``area`` if given, else in either area)."""
    def read() -> str:
        return text(driver, area) if area else messages(driver)
    return wait(driver, lambda: (t := read()) and all(w in t for w in words) and t,
                f"message with {words}: got {messages(driver)!r}", timeout)


def severe_logs(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "favicon" not in e["message"]]


def test_loads_the_sample_and_shows_its_peak(browser: Any) -> None:
    import lmscore
    from lmscore.units import format_bytes

    peak = wait(browser, lambda: "at level" in text(browser, "sum-before")
                and text(browser, "sum-before"), msg="the peak is shown")
    sim = lmscore.simulate(lmscore.load(samples.sample_dir() / "mlp.pb"), 32)
    assert peak == f"{format_bytes(sim.peak_bytes)} at level {sim.peak_level}"
    wait(browser, lambda: trace_len(browser, figures.T_BEFORE) == len(sim.device_curve),
         msg="the device curve is drawn")
    assert trace_len(browser, figures.T_AFTER) == 0
    assert len(browser.find_elements(By.CSS_SELECTOR, "#hotspots td")) > 0
    shot(browser, "01-loaded-mlp.png")
    assert not severe_logs(browser)


def test_apply_knobs_draws_the_after_curve(browser: Any) -> None:
    browser.find_element(By.ID, "knobs-apply").click()
    message_with(browser, "knobs applied")
    wait(browser, lambda: trace_len(browser, figures.T_AFTER) > 0, msg="after curve")
    assert "%" in text(browser, "sum-after")
    browser.find_element(By.ID, "plan-reset").click()
    message_with(browser, "plan reset")
    wait(browser, lambda: trace_len(browser, figures.T_AFTER) == 0, msg="after curve gone")


def cell(browser: Any, tensor: str, column: str) -> Any:
    """The hotspot table's cell of ``column`` in the row of ``tensor``."""
    return browser.find_element(By.XPATH, (
        f"//div[@id='hotspots']//tr[td[@data-dash-column='tensor']"
        f"[normalize-space(.)='{tensor}']]/td[@data-dash-column='{column}']"))


def click_level(browser: Any, level: int) -> None:
    """Click the device curve at ``level`` (the table then lists what is live there)."""
    browser.execute_script("window.scrollTo(0, 0)")
    dx, dy = browser.execute_script(POINT_XY, figures.T_BEFORE, level)
    plot = browser.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    ActionChains(browser).move_to_element_with_offset(plot, int(dx), int(dy)).pause(0.3) \
        .click().perform()
    wait(browser, lambda: f"level {level} (selected level)" in text(browser, "hotspot-caption"),
         msg=f"level {level} selected")


def test_recompute_a_tensor_by_hand_and_see_a_refusal(browser: Any) -> None:
    # mlp at batch 32, level 10: the first hidden layer's buffer (its MatMul, BiasAdd and
    # Relu in place) is recomputable, Adam's are not; its row names the Relu, read
    # farthest away, which edits act on and the decision is of
    relu, update = "mlp_1/dense_1/Relu:0", "adam/truediv:0"
    row = relu
    click_level(browser, 10)
    assert cell(browser, row, "decision").text == "kept"
    assert cell(browser, row, "recomputable").text == "yes"
    assert text(browser, "sum-recomputed") == "nothing"
    assert "Nothing is recomputed" in text(browser, "recompute-list")
    cell(browser, row, "recompute").click()
    message_with(browser, f"{relu} recomputed;", "1 recompute")
    wait(browser, lambda: cell(browser, row, "decision").text == "recomputed",
         msg="the row shows its decision")
    assert "☑" in cell(browser, row, "recompute").text
    wait(browser, lambda: trace_len(browser, figures.T_AFTER) > 0, msg="after curve")
    wait(browser, lambda: text(browser, "sum-recomputed") == "1 tensor, 1 op cloned",
         msg="the summary counts the recompute")
    assert "%" in text(browser, "sum-after") and text(browser, "sum-swapped") == "nothing"
    listed = text(browser, "recompute-list")
    assert relu in listed and "clones mlp_1/dense_1/Relu" in listed and "trigger" in listed
    shot(browser, "02-recomputed.png")
    # a tensor the plan cannot recompute: refused in the message area, nothing changes
    assert cell(browser, update, "recompute").text == "—"
    cell(browser, update, "recompute").click()
    t = message_with(browser, "edit refused", "cannot be recomputed: update op",
                     area="edit-message")  # next to the table, where the click was
    assert "error" in browser.find_element(By.ID, "edit-message").get_attribute("class"), t
    assert cell(browser, update, "recomputable").text == "cannot be recomputed: update op"
    assert cell(browser, row, "decision").text == "recomputed"
    assert text(browser, "sum-recomputed") == "1 tensor, 1 op cloned"
    shot(browser, "02-recompute-refused.png")
    # the server is still there: undo by the same cell, the after curve goes
    cell(browser, row, "recompute").click()
    message_with(browser, f"{relu} no longer recomputed")
    wait(browser, lambda: trace_len(browser, figures.T_AFTER) == 0, msg="after curve gone")
    wait(browser, lambda: cell(browser, row, "decision").text == "kept", msg="kept again")
    assert text(browser, "sum-recomputed") == "nothing"
    assert not severe_logs(browser)


def test_upload_a_graph_and_toggle_a_hotspot(browser: Any) -> None:
    upload(browser, "graph-upload", samples.sample_dir() / "lstm.pb")
    message_with(browser, "loaded lstm.pb")
    wait(browser, lambda: "lstm.pb" in text(browser, "sum-graph"), msg="lstm shown")
    assert text(browser, "sum-after") == "no plan"
    before = trace_len(browser, figures.T_AFTER)
    # toggle the first hotspot whose swap the plan accepts
    toggle_a_hotspot(browser)
    wait(browser, lambda: trace_len(browser, figures.T_AFTER) > before, msg="after curve")
    wait(browser, lambda: text(browser, "sum-after") != "no plan", msg="peak after")
    assert text(browser, "sum-swapped").startswith("1 tensor,")
    wait(browser, lambda: any("☑" in c.text for c in browser.find_elements(
        By.CSS_SELECTOR, '#hotspots td[data-dash-column="swap"]')), msg="the row is ticked")
    shot(browser, "02-hotspot-toggled.png")


def toggle_a_hotspot(browser: Any) -> None:
    """Tick the first hotspot the app agrees to swap."""
    for k in range(20):
        cells = [c for c in browser.find_elements(
            By.CSS_SELECTOR, '#hotspots td[data-dash-column="swap"]') if "☐" in c.text]
        if k >= len(cells):
            break
        before_msg = messages(browser)
        cells[k].click()
        wait(browser, lambda old=before_msg: messages(browser) != old, msg="the toggle answers")
        if "swapped;" in messages(browser):
            break
    assert "swapped;" in messages(browser), (k, len(cells), messages(browser))


def test_click_a_level_on_the_curve_selects_it(browser: Any) -> None:
    browser.execute_script("window.scrollTo(0, 0)")
    dx, dy = browser.execute_script(POINT_XY, figures.T_BEFORE, 10)
    plot = browser.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    ActionChains(browser).move_to_element_with_offset(plot, int(dx), int(dy)).pause(0.3) \
        .click().perform()
    wait(browser, lambda: "level 10 (selected level)" in text(browser, "hotspot-caption"),
         msg="level 10 selected")
    wait(browser, lambda: browser.execute_script(
        "var gd = document.querySelector('#studio .js-plotly-plot');"
        "return (gd.layout.shapes || []).some(s => s.x0 === 10);"), msg="level line drawn")


def test_click_a_tensor_draws_its_lifetime(browser: Any) -> None:
    browser.find_elements(By.CSS_SELECTOR, '#hotspots td[data-dash-column="tensor"]')[0].click()
    shapes = wait(browser, lambda: browser.execute_script(
        "var gd = document.querySelector('#studio .js-plotly-plot');"
        "var s = gd._fullLayout.shapes || [];"
        "return s.some(x => x.xref === 'x2' && x.type === 'rect') ? s.map(x => x.type) : null;"),
        msg="lifetime drawn")
    assert "circle" in shapes and shapes.count("rect") >= 2  # producer, consumer, lifetime
    shot(browser, "03-tensor-lifetime.png")


def test_an_invalid_edit_is_refused_visibly(browser: Any) -> None:
    browser.find_element(By.ID, "edit-trigger").click()  # no op selected yet
    t = message_with(browser, "click an op", area="edit-message")
    assert "error" in browser.find_element(By.ID, "edit-message").get_attribute("class"), t
    # the next action that succeeds clears it
    browser.find_elements(By.CSS_SELECTOR, '#hotspots td[data-dash-column="tensor"]')[1].click()
    wait(browser, lambda: messages(browser) == "", msg="the refusal is cleared")


#: Page coordinates, relative to the plot's centre, of point ``k`` of trace ``t`` of the
#: ordering view (the first axes).
OP_XY = POINT_XY.replace("xaxis2", "xaxis").replace("yaxis2", "yaxis")


def click_op(browser: Any, graph: Any, op: int) -> None:
    """Click op ``op``'s point in the ordering view, as a user would."""
    import lmscore

    cats = lmscore.order(graph).categories
    lane = figures.CATEGORIES.index(cats[op])
    point = [i for i, c in enumerate(cats) if c == cats[op]].index(op)
    browser.execute_script("window.scrollTo(0, 0)")
    dx, dy = browser.execute_script(OP_XY, lane, point)
    plot = browser.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    ActionChains(browser).move_to_element_with_offset(plot, int(dx), int(dy)).pause(0.3) \
        .click().perform()
    message_with(browser, f"selected op {graph.ops[op].name} ", area="edit-message")


def test_click_an_op_swap_it_move_its_trigger_regroup_undo_redo(browser: Any) -> None:
    import lmscore
    from lmscore.plan import DEFAULT_TRIGGER_WINDOW, add_swap, empty_plan, find_trigger

    g = lmscore.load(samples.sample_dir() / "lstm.pb")
    lv = lmscore.order(g).levels
    sim = lmscore.simulate(g, 32)
    swapped = set(browser.execute_script(
        "return Array.from(document.querySelectorAll('#hotspots tr')).filter(r =>"
        " (r.querySelector('td[data-dash-column=decision]') || {}).textContent === 'swapped')"
        ".map(r => r.querySelector('td[data-dash-column=tensor]').textContent);"))
    # an op's first output that a hand toggle swaps, with room for another trigger
    pick = None
    for level in range(0, len(sim.device_curve), 3):
        for row in lmscore.hotspots(g, sim, level):
            t = row.swap_tensor
            if not (row.swappable and t.endswith(":0") and t not in swapped):
                continue
            op = g.index[t[:-2]]
            plan = add_swap(g, empty_plan(g), t, threshold=1, ahead=1, groupby=5)
            group = plan.swaps[0].swap_ins[0]
            for ahead in range(2, 8):
                other = find_trigger(g, t, group.consumers, ahead, DEFAULT_TRIGGER_WINDOW)
                if other not in (None, group.trigger):
                    pick = (op, t, other)
                    break
            if pick:
                break
        if pick:
            break
    assert pick, "lstm has a tensor to swap with another trigger in reach"
    op, tensor, trigger = pick
    click_op(browser, g, op)
    browser.find_element(By.ID, "edit-swap-op").click()
    if "no longer swapped" in message_with(browser, tensor, area="edit-message"):
        browser.find_element(By.ID, "edit-swap-op").click()  # the toggle swapped it before
    message_with(browser, f"{tensor} swapped;", area="edit-message")
    wait(browser, lambda: tensor in text(browser, "swap-editor"), msg="the editor shows it")
    # move swap-in 0's trigger to another op, clicked in the view
    click_op(browser, g, g.index[trigger])
    browser.find_element(By.ID, "edit-trigger").click()
    message_with(browser, f"swap-in 0 of {tensor} is now triggered by {trigger}",
                 area="edit-message")
    wait(browser, lambda: f"trigger {trigger} (level {lv[g.index[trigger]]})"
         in text(browser, "swap-editor"), msg="the editor shows the new trigger")
    shot(browser, "03-trigger-moved.png")
    # undo brings the old trigger back, redo the new one
    browser.find_element(By.ID, "undo").click()
    message_with(browser, "undo done", area="edit-message")
    wait(browser, lambda: f"trigger {trigger} " not in text(browser, "swap-editor"),
         msg="the trigger is undone")
    browser.find_element(By.ID, "redo").click()
    message_with(browser, "redo done", area="edit-message")
    wait(browser, lambda: f"trigger {trigger} " in text(browser, "swap-editor"),
         msg="the trigger is redone")
    # one group, then a group per level: each has its own trigger or is synchronous
    browser.find_element(By.ID, "edit-onegroup").click()
    message_with(browser, f"{tensor}: 1 swap-in group(s)", area="edit-message")
    type_into(browser, "edit-groupby", "0")
    browser.find_element(By.ID, "edit-regroup").click()
    t = message_with(browser, f"{tensor}:", "swap-in group(s)", area="edit-message")
    assert "error" not in browser.find_element(By.ID, "edit-message").get_attribute("class"), t
    # the op's output is unswapped by the same button, and undo brings the swap back
    click_op(browser, g, op)
    browser.find_element(By.ID, "edit-swap-op").click()
    message_with(browser, f"{tensor} no longer swapped", area="edit-message")
    browser.find_element(By.ID, "undo").click()
    message_with(browser, "undo done", area="edit-message")
    assert not severe_logs(browser)


def test_nothing_on_the_page_links_or_posts_outside_this_machine(browser: Any, server: str
                                                                 ) -> None:
    from urllib.parse import urljoin, urlparse

    plot = browser.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    ActionChains(browser).move_to_element(plot).pause(0.3).perform()  # shows the modebar
    config = browser.execute_script(
        "var c = document.querySelector('#studio .js-plotly-plot')._context;"
        "return [!!c.scrollZoom, !!c.showSendToCloud, !!c.showEditInChartStudio,"
        " !!c.displaylogo, c.plotlyServerURL || '', !!c.showLink];")
    assert config == [False, False, False, False, "", False]  # (unknown keys: undefined)
    buttons = [b.get_attribute("data-title") for b in browser.find_elements(
        By.CSS_SELECTOR, "#studio .modebar-btn")]
    assert buttons and not any("cloud" in (b or "").lower() or "studio" in (b or "").lower()
                               for b in buttons), buttons
    urls = browser.execute_script(
        "var out = [];"
        "document.querySelectorAll('[href],[src],[action],[formaction]').forEach(e => {"
        " ['href','src','action','formaction'].forEach(a => {"
        "  var v = e.getAttribute(a); if (v) out.push(v); }); });"
        "return out;")
    here = urlparse(server)
    for url in urls:
        full = urlparse(urljoin(server, url))
        assert full.scheme in ("http", "https", "data", "blob", "javascript", "") and (
            full.scheme in ("data", "blob", "javascript") or full.hostname == here.hostname
        ), url
    # the wheel scrolls the page and does not zoom
    x_range = "return document.querySelector('#studio .js-plotly-plot')._fullLayout.xaxis.range"
    before = browser.execute_script(x_range)
    ActionChains(browser).scroll_from_origin(ScrollOrigin.from_element(plot), 0, 200).perform()
    time.sleep(0.5)  # a zoom would have been drawn by now
    assert browser.execute_script(x_range) == before


def test_auto_tune(browser: Any) -> None:
    from lmsviz import tuning

    browser.find_element(By.ID, "tune-run").click()
    t = message_with(browser, "auto-tune", timeout=90)
    if tuning.tuner_module() is None:
        assert "tuner unavailable" in t
        return
    wait(browser, lambda: "(tuner)" in text(browser, "sum-overhead"), msg="tuner prediction")
    assert browser.find_element(By.ID, "tune-run").is_enabled()
    shot(browser, "04-auto-tuned.png")
    # put a hand-made plan back for the export test
    type_into(browser, "knob-threshold", "2")
    browser.find_element(By.ID, "knobs-apply").click()
    message_with(browser, "knobs applied")


def _download(folder: pathlib.Path, suffix: str, timeout: float = 30) -> pathlib.Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [p for p in folder.iterdir() if p.name.endswith(suffix)]
        if done and not any(p.name.endswith(".crdownload") for p in folder.iterdir()):
            return done[0]
        time.sleep(0.2)
    raise AssertionError(f"no {suffix} download in {sorted(folder.iterdir())}")


def test_export_matches_the_cli(browser: Any, downloads: pathlib.Path, tmp_path: pathlib.Path
                                ) -> None:
    browser.find_element(By.ID, "plan-save").click()
    plan = _download(downloads, ".plan.json")
    browser.find_element(By.ID, "export").click()
    bundle = _download(downloads, ".lms.zip")
    message_with(browser, "exported")
    with zipfile.ZipFile(io.BytesIO(bundle.read_bytes())) as zf:
        pb = zf.read("lstm.lms.pb")
    out = tmp_path / "cli.pb"
    proc = subprocess.run(
        [sys.executable, "-m", "lmscore.cli", "rewrite", str(samples.sample_dir() / "lstm.pb"),
         "--plan", str(plan), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == pb


def test_bad_uploads_are_refused_and_the_app_keeps_working(browser: Any, tmp_path: pathlib.Path
                                                           ) -> None:
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(bytes(range(256)) * 40)
    upload(browser, "graph-upload", garbage)
    message_with(browser, "upload refused", "garbage.pb")
    shot(browser, "05-bad-upload.png")
    upload(browser, "graph-upload", samples.sample_dir() / "resnet50.pb")
    message_with(browser, "resnet50.pb", "over the upload limit")
    bad_plan = tmp_path / "plan.json"
    bad_plan.write_text('{"version": 1, "graph": "0000000000000000", "swaps": []}')
    upload(browser, "plan-upload", bad_plan)
    message_with(browser, "plan refused", "another graph")
    # still working: a new batch size re-simulates
    type_into(browser, "batch", "8")
    wait(browser, lambda: "batch 8" in text(browser, "sum-graph"), msg="batch 8 applied")
    assert "lstm.pb" in text(browser, "sum-graph")


def test_a_reload_keeps_the_work_and_another_tab_does_not_see_it(browser: Any, server: str
                                                                 ) -> None:
    swapped = text(browser, "sum-swapped")
    browser.refresh()
    wait(browser, lambda: "lstm.pb" in text(browser, "sum-graph")
         and "batch 8" in text(browser, "sum-graph"), msg="graph restored after reload")
    wait(browser, lambda: text(browser, "sum-swapped") == swapped, msg="plan restored")
    wait(browser, lambda: browser.find_element(By.ID, "batch").get_attribute("value") == "8",
         msg="form restored")
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get(server)
    wait(browser, lambda: "mlp.pb" in text(browser, "sum-graph"), msg="a new tab starts fresh")
    assert text(browser, "sum-after") == "no plan"
    assert text(browser, "sum-source") == "empty"  # nobody's plan "restored"
    shot(browser, "06-second-tab.png")
    browser.close()
    browser.switch_to.window(first)
    assert "lstm.pb" in text(browser, "sum-graph")
    assert not severe_logs(browser)


def session_storage(driver: Any) -> dict[str, str]:
    """Everything in the page's session storage (what a duplicated tab starts with)."""
    return driver.execute_script(
        "const o = {}; for (let i = 0; i < sessionStorage.length; i++) {"
        " const k = sessionStorage.key(i); o[k] = sessionStorage.getItem(k); } return o;")


def test_a_duplicated_tab_takes_its_own_id_and_a_copy_of_the_plans(
        browser: Any, server: str, app_server: Server) -> None:
    first = browser.current_window_handle
    original = session_storage(browser)
    tab = json.loads(original["st-tab"])
    swapped = text(browser, "sum-swapped")
    plans = app_server.data / "plans" / tab
    saved = {p.name: p.read_bytes() for p in plans.glob("*.json")}
    assert saved, "the original tab saved its plan"
    # what the browser's "duplicate tab" does: a new tab with the other's session storage
    browser.switch_to.new_window("tab")
    browser.get(server)
    wait(browser, lambda: "mlp.pb" in text(browser, "sum-graph"), msg="a new tab")
    browser.execute_script("sessionStorage.clear(); for (const [k, v] of Object.entries("
                           "arguments[0])) { sessionStorage.setItem(k, v); }", original)
    browser.refresh()
    wait(browser, lambda: "lstm.pb" in text(browser, "sum-graph")
         and text(browser, "sum-swapped") == swapped, msg="the duplicate shows the original")
    wait(browser, lambda: json.loads(session_storage(browser)["st-tab"]) != tab,
         msg="the duplicate takes an id of its own")
    own = json.loads(session_storage(browser)["st-tab"])
    wait(browser, lambda: (app_server.data / "plans" / own).is_dir(),
         msg="the server copies the original's plans for the duplicate")
    apply_knobs(browser, 3, 7)  # an edit in the duplicate...
    wait(browser, lambda: any(p.read_bytes() not in saved.values()
                              for p in (app_server.data / "plans" / own).glob("*.json")),
         msg="the duplicate saves its own plan")
    # ...leaves the original's saved plans as they were
    assert {p.name: p.read_bytes() for p in plans.glob("*.json")} == saved
    browser.close()
    browser.switch_to.window(first)
    browser.refresh()
    wait(browser, lambda: "lstm.pb" in text(browser, "sum-graph")
         and text(browser, "sum-swapped") == swapped, msg="the original keeps its plan")
    assert json.loads(session_storage(browser)["st-tab"]) == tab
    assert not severe_logs(browser)


def apply_knobs(browser: Any, threshold: int, swaps: int) -> str:
    """Set the threshold knob, apply, wait for ``swaps`` swapped tensors in the summary."""
    type_into(browser, "knob-threshold", str(threshold))
    browser.find_element(By.ID, "knobs-apply").click()
    message_with(browser, f"knobs applied: {swaps} tensors swapped")
    wait(browser, lambda: text(browser, "sum-swapped").startswith(f"{swaps} tensors"),
         msg=f"{swaps} swaps drawn")
    return text(browser, "sum-swapped")


def test_the_server_killed_mid_edit_comes_back_with_the_edits(browser: Any, app_server: Server
                                                              ) -> None:
    # lstm at batch 8: threshold 3 swaps 7 tensors (not Keras' first cell step outside the
    # loop, which only tells shapes: the step prunes it)
    swapped = apply_knobs(browser, 3, 7)
    after = text(browser, "sum-after")
    app_server.kill()  # SIGKILL right after the edit
    # an action while the server is down says so (it went to the browser's console only)
    browser.find_element(By.ID, "undo").click()
    banner = browser.find_element(By.ID, "offline")
    wait(browser, lambda: banner.is_displayed() and "the server did not answer" in banner.text,
         msg="the server's silence said")
    app_server.start()
    browser.find_element(By.ID, "knobs-apply").click()  # answered again: the line goes
    wait(browser, lambda: not banner.is_displayed(), msg="the line cleared")
    browser.refresh()
    wait(browser, lambda: "lstm.pb" in text(browser, "sum-graph")
         and "batch 8" in text(browser, "sum-graph"), msg="graph back after the restart")
    wait(browser, lambda: text(browser, "sum-swapped") == swapped, msg="the edits are back")
    assert text(browser, "sum-after") == after
    assert browser.find_element(By.ID, "knob-threshold").get_attribute("value") == "3"
    shot(browser, "07-after-restart.png")
    type_into(browser, "batch", "4")  # and editing goes on
    wait(browser, lambda: "batch 4" in text(browser, "sum-graph"), msg="batch 4 applied")
