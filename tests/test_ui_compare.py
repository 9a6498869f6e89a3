"""The compare panel and the zoomed window, in a real browser, clicked as a user would.

Plans side by side (the unplanned step, the current plan, a plan this tab saved), the
batch plot with the largest batch that fits, an op clicked in a zoomed window, a swap of
it drawn in the window at once, and the lifetime label of a tensor near the right end.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from browser_kit import (
    CHROMEDRIVER,
    CHROMIUM,
    FIGURE,
    LANE_XY,
    drag_lanes,
    served_page,
    text,
    wait,
)

import lmscore
from lmscore.compare import batch_sweep
from lmscore.samples import sample_dir
from lmscore.units import parse_bytes
from lmsviz import figures

pytestmark = pytest.mark.browser

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip("Chromium or chromedriver is missing", allow_module_level=True)
pytest.importorskip("selenium")

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

#: Names of the traces of a plot, by the plot's container id.
TRACE_NAMES = """
var gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
return gd && gd._fullData ? gd._fullData.map(t => t.name) : [];
"""
BUDGET = "64MiB"  # the mlp at batch 32 peaks at 12.9 MiB: the largest batch is in the thousands
#: mlp's first hidden layer's second Relu: produced at level 7, read again at level 22.
RELU = "mlp_1/dense_1_2/Relu"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    downloads = pathlib.Path(tempfile.mkdtemp(prefix="lms-downloads-"))
    try:
        with served_page(tmp_path_factory.mktemp("lms-data"), "mlp", downloads) as driver:
            yield driver
    except RuntimeError as e:
        pytest.fail(str(e))
    finally:
        shutil.rmtree(downloads, ignore_errors=True)


def type_into(driver: Any, id_: str, value: str) -> None:
    field = driver.find_element(By.ID, id_)
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE, value, Keys.ENTER)


def click(driver: Any, id_: str) -> None:
    el = driver.find_element(By.ID, id_)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", el)
    el.click()


def table(driver: Any) -> list[dict[str, str]]:
    """The comparison table's rows as shown."""
    rows = []
    for tr in driver.find_elements(By.CSS_SELECTOR, "#compare-table tr"):
        cells = tr.find_elements(By.CSS_SELECTOR, "td")
        if cells:
            rows.append({c.get_attribute("data-dash-column"): c.text for c in cells})
    return rows


def apply_knobs(driver: Any, threshold: int, swaps: int) -> None:
    type_into(driver, "knob-threshold", str(threshold))
    click(driver, "knobs-apply")
    wait(driver, lambda: f"knobs applied: {swaps} tensors swapped" in text(driver, "message"),
         f"knobs at threshold {threshold}")
    wait(driver, lambda: text(driver, "sum-swapped").startswith(f"{swaps} tensors"),
         f"{swaps} swaps in the summary")


def test_a_plan_file_is_compared_in_a_tab_that_kept_none(browser: Any,
                                                         tmp_path: pathlib.Path) -> None:
    """The picker got its value before it had the option for it, and dropped it: a tab's
    first plan loaded for comparison was announced and never compared."""
    from lmscore import load, tune
    from lmscore.samples import sample_dir
    from lmscore.units import parse_bytes

    graph = load(str(sample_dir() / "mlp.pb"))
    plan_file = tmp_path / "mlp_tuned.plan.json"
    plan_file.write_text(tune(graph, 32, parse_bytes("13MiB"), safety=1.0).plan.to_json())
    url = browser.current_url
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")  # a tab of its own: nothing kept for comparison
    try:
        browser.get(url)
        wait(browser, lambda: "at level" in text(browser, "sum-before"), "the page")
        click(browser, "compare-open")
        wait(browser, lambda: [r["plan"] for r in table(browser)] == ["no plan"], "no plan")
        browser.find_element(By.CSS_SELECTOR, "#compare-upload input[type=file]").send_keys(
            str(plan_file))
        wait(browser, lambda: [r["plan"] for r in table(browser)]
             == ["no plan", "mlp_tuned.plan.json"], "the loaded plan compared")
    finally:
        browser.close()
        browser.switch_to.window(first)


def test_compare_the_current_plan_with_a_saved_one(browser: Any) -> None:
    wait(browser, lambda: "at level" in text(browser, "sum-before"), "the page")
    type_into(browser, "budget", BUDGET)
    wait(browser, lambda: "fits (" in text(browser, "sum-fits"), "the budget")
    apply_knobs(browser, 3, 4)
    click(browser, "plan-save")  # the tab keeps it for comparison (and downloads it)
    # said where the user looks, not only in the closed comparison panel
    wait(browser, lambda: "downloaded mlp.plan.json: 4 swapped, made for batch 32; kept for "
         "comparison" in text(browser, "message"), "the save's answer")
    apply_knobs(browser, 1, 5)
    click(browser, "compare-open")
    wait(browser, lambda: [r["plan"] for r in table(browser)] == ["no plan", "current"],
         "the unplanned step and the current plan")
    # pick the saved plan, as a user does in the dropdown
    click(browser, "compare-pick")
    option = wait(browser, lambda: [o for o in browser.find_elements(
        By.CSS_SELECTOR, "#compare-pick [role=option], .dash-dropdown-option, "
        "#compare-pick .Select-option") if o.text.startswith("saved 1:")],
        "the saved plan in the picker")
    option[0].click()
    rows = wait(browser, lambda: len(t := table(browser)) == 3 and t, "three rows")
    none, cur, old = rows
    assert old["plan"].startswith("saved 1:") and "swapped" in old["plan"]
    assert none["swapped"].startswith("0 ·") and none["overhead"] == "0.0%"
    # (the mlp's peak is its weights and Adam's slots: the knobs move only what they swap)
    assert cur["swapped"].startswith("5 ·") and old["swapped"].startswith("4 ·")
    assert cur["overhead"] != old["overhead"] and cur["host"] != old["host"]
    # every plan gets the tuner's predicted overhead, knob plans too
    assert all(r["overhead"].endswith("%") for r in rows) and all(r["step"].endswith("ms")
                                                                  for r in rows)
    names = wait(browser, lambda: len(n := browser.execute_script(TRACE_NAMES, "compare-figure"))
                 == 4 and n, "the overlaid curves")
    assert names[:2] == ["no plan", "current"] and names[2].startswith("saved 1:")
    assert names[3].startswith("budget")
    # the current plan's row agrees with the summary above the views
    assert text(browser, "sum-after").split(" (")[0] in cur["peak"]


def test_the_batch_plot_marks_the_largest_batch_that_fits(browser: Any) -> None:
    g = lmscore.load(str(sample_dir() / "mlp.pb"))
    sw = batch_sweep(g, parse_bytes(BUDGET))  # the tuner's safety, as the page
    assert "press the button" in text(browser, "batch-note")
    click(browser, "batch-run")
    note = wait(browser, lambda: "largest batch that fits" in (t := text(browser, "batch-note"))
                and t, "the batch sweep", timeout=120)
    assert f"without a plan: {sw.max_without};" in note
    assert f"batch {sw.max_without + 0}" in note or "with the current plan" in note
    names = browser.execute_script(TRACE_NAMES, "batch-figure")
    assert f"fits up to batch {sw.max_without}" in names
    assert "peak, current plan" in names and any(n.startswith("host limit") for n in names)
    assert any(n.startswith("budget 64") for n in names)
    # the tuner was asked about the batch after the largest the plan fits
    assert "auto-tune finds a plan" in note or "memory stops it" in note
    assert browser.find_element(By.ID, "batch-run").is_enabled()


def detail(driver: Any, trace: int) -> list[Any]:
    return driver.execute_script(
        FIGURE + "var t = gd && gd._fullData && gd._fullData[arguments[0]];"
        "return t && t.customdata ? Array.from(t.customdata) : [];", trace)


def test_click_an_op_in_a_zoomed_window_and_swap_it(browser: Any) -> None:
    g = lmscore.load(str(sample_dir() / "mlp.pb"))
    levels = lmscore.order(g).levels
    op = g.index[RELU]
    wait(browser, lambda: "at level" in text(browser, "sum-before"), "the page")
    click(browser, "plan-reset")
    wait(browser, lambda: "plan reset" in text(browser, "message"), "no plan")
    browser.execute_script("window.scrollTo(0, 0)")
    browser.execute_script("document.getElementById('studio').scrollIntoView()")
    drag_lanes(browser, (3.6, 2.3), (10.4, 1.7))
    plot = browser.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    wait(browser, lambda: op in detail(browser, figures.T_DETAIL_OPS), "the window's ops")
    assert detail(browser, figures.T_DETAIL_MARKS) == []
    # click the op where the window draws it
    k = detail(browser, figures.T_DETAIL_OPS).index(op)
    (px, py) = browser.execute_script(
        FIGURE + "var L = gd._fullLayout, t = gd._fullData[arguments[0]], k = arguments[1];"
        "var r = gd.getBoundingClientRect();"
        "return [L.xaxis._offset + L.xaxis.d2p(t.x[k]) - r.width / 2,"
        "        L.yaxis._offset + L.yaxis.d2p(t.y[k]) - r.height / 2];",
        figures.T_DETAIL_OPS, k)
    ActionChains(browser).move_to_element_with_offset(plot, int(px), int(py)).pause(0.3) \
        .click().perform()
    # the op is ringed where the window draws it (a click on the lane under it would
    # select it too, and say so; the window's trace selects it by the index it carries)
    y_op = browser.execute_script(FIGURE + "return gd._fullData[arguments[0]].y[arguments[1]];",
                                  figures.T_DETAIL_OPS, k)
    wait(browser, lambda: browser.execute_script(
        FIGURE + "return (gd._fullLayout.shapes || []).some(s => s.type === 'circle' &&"
        " s.xanchor === arguments[0] && Math.abs(s.yanchor - arguments[1]) < 1e-9);",
        levels[op], y_op), "its ring")
    # swap its output: the window draws the swap-out at once, without another zoom
    click(browser, "edit-swap-op")
    wait(browser, lambda: f"{RELU}:0 swapped;" in text(browser, "edit-message"), "the swap")
    wait(browser, lambda: f"{RELU}:0" in detail(browser, figures.T_DETAIL_MARKS),
         "the swap-out drawn in the window")
    labels = browser.execute_script(
        FIGURE + "return Array.from(gd._fullData[arguments[0]].text);", figures.T_DETAIL_MARKS)
    assert any(t.startswith("out ") for t in labels), labels
    # and undone: it goes again
    click(browser, "undo")
    wait(browser, lambda: detail(browser, figures.T_DETAIL_MARKS) == [], "the swap-out gone")


def whole_graph(browser: Any) -> None:
    """Double-click the ordering view in the middle of what it shows: the whole graph."""
    wait(browser, lambda: browser.execute_script(FIGURE + "return !!(gd && gd._fullData);"),
         "the figure")
    browser.execute_script("document.getElementById('studio').scrollIntoView()")
    plot = browser.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    lo, hi = browser.execute_script(FIGURE + "return gd._fullLayout.xaxis.range;")
    (x, y) = browser.execute_script(LANE_XY, (lo + hi) / 2, 0.5)
    ActionChains(browser).move_to_element_with_offset(plot, int(x), int(y)).double_click() \
        .perform()
    wait(browser, lambda: browser.execute_script(FIGURE + "return gd._fullLayout.xaxis.range;"
                                                 )[1] > 30, "the whole graph")


def test_the_lifetime_label_of_a_tensor_near_the_right_end_stays_inside(browser: Any) -> None:
    # back to the whole graph in a narrow window, then a tensor of Adam's, levels 32-34 of
    # 0-37: a label running rightwards from level 32 would end past the plot's right edge
    browser.set_window_size(900, 1300)
    whole_graph(browser)
    wait(browser, lambda: browser.execute_script(
        FIGURE + "return gd._fullLayout.xaxis2._length;") < 800, "the narrow plot")
    n_levels = browser.execute_script(FIGURE + "return gd._fullData[arguments[0]].x.length;",
                                      figures.T_BEFORE)
    type_into(browser, "find", "adam/Sqrt_1:0")
    wait(browser, lambda: "found" in text(browser, "message"), "the tensor found")
    whole_graph(browser)  # the search zoomed in to it
    box = wait(browser, lambda: browser.execute_script(
        FIGURE + "var t = Array.from(gd.querySelectorAll('text')).find(e =>"
        " e.textContent.startsWith('adam/Sqrt_1:0 ·'));"
        "if (!t) return null; var b = t.getBoundingClientRect(),"
        " r = gd.getBoundingClientRect(), L = gd._fullLayout;"
        "return [b.left - r.left, b.right - r.left, b.top - r.top,"
        " L.xaxis2._offset, L.xaxis2._offset + L.xaxis2._length,"
        " L.yaxis2._offset];"), "the label drawn")
    left, right, top, plot_left, plot_right, plot_top = box
    assert n_levels > 30 and plot_left <= left and right <= plot_right + 1, box
    assert top >= plot_top - 1, box
    browser.set_window_size(1500, 1300)


def test_in_an_800_pixel_window_the_table_toggles_are_in_sight(browser: Any) -> None:
    """The table stood beside the swap editor, 446 px for a 1,259 px table: its toggles
    were off to the right, behind a sideways scroll, and long names widened the page."""
    size = browser.get_window_size()
    browser.set_window_size(800, 1000)
    browser.refresh()  # (the figures take their width when drawn: a page opened narrow)
    try:
        wait(browser, lambda: "at level" in text(browser, "sum-before"), "the page")
        cell = wait(browser, lambda: browser.find_elements(
            By.CSS_SELECTOR, "#hotspots td[data-dash-column='swap']"), "a swap cell")[0]
        # scrolled down to it, not sideways: what the user sees without a sideways scroll
        browser.execute_script("window.scrollTo(0, arguments[0].getBoundingClientRect().top"
                               " + window.scrollY - 300);", cell)
        left, right = browser.execute_script(
            "var r = arguments[0].getBoundingClientRect(); return [r.left, r.right];", cell)
        width = browser.execute_script("return document.documentElement.clientWidth;")
        assert 0 <= left and right <= width, (left, right, width)
        page = browser.execute_script("return document.documentElement.scrollWidth;")
        wide = browser.execute_script("""
          var w = document.documentElement.clientWidth, out = [];
          function clipped(e) { for (var p = e.parentElement; p; p = p.parentElement) {
            var o = getComputedStyle(p).overflowX;
            if (o === 'auto' || o === 'hidden' || o === 'scroll') return true; } return false; }
          document.querySelectorAll('body *').forEach(e => { var r = e.getBoundingClientRect();
            if (r.right > w + 1 && r.width > 0 && !clipped(e)) out.push([e.tagName, e.id,
              e.className.toString().slice(0, 30), Math.round(r.right)]); });
          return out.slice(0, 6);""")
        assert page <= width + 1, (page, width, wide)  # no page-wide sideways scroll
    finally:
        browser.set_window_size(size["width"], size["height"])
        browser.refresh()
        wait(browser, lambda: "at level" in text(browser, "sum-before"), "the page again")
