"""The studio zoomed in, in a real browser: a drag draws the window op by op, a name search
selects an op and zooms to it, a double click goes back to the whole graph (and selects
nothing); then the keyboard, the window's width, and fields sent with a click."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from browser_kit import CHROMEDRIVER, CHROMIUM, FIGURE, LANE_XY, drag_lanes, served_page, wait

import lmscore
from lmscore.samples import sample_dir
from lmsviz import figures, rendering

pytestmark = pytest.mark.browser

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip("Chromium or chromedriver is missing", allow_module_level=True)
pytest.importorskip("selenium")

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        with served_page(tmp_path_factory.mktemp("lms-data"), "mlp") as driver:
            yield driver
    except RuntimeError as e:
        pytest.fail(str(e))


def detail_ops(driver: Any) -> list[int]:
    return driver.execute_script(
        FIGURE + "var t = gd && gd._fullData && gd._fullData[arguments[0]];"
        "return t && t.customdata ? Array.from(t.customdata) : [];", figures.T_DETAIL_OPS)


def x_range(driver: Any) -> list[float]:
    return driver.execute_script(FIGURE + "return gd._fullLayout.xaxis.range;")


def mlp() -> tuple[lmscore.Graph, tuple[int, ...]]:
    g = lmscore.load(str(sample_dir() / "mlp.pb"))
    return g, lmscore.order(g).levels


def test_a_drag_over_a_few_levels_draws_their_ops_one_by_one(browser: Any) -> None:
    wait(browser, lambda: browser.execute_script(FIGURE + "return !!(gd && gd._fullData);"),
         "the figure")
    assert detail_ops(browser) == []  # the whole graph: lanes only
    ticks = browser.execute_script(FIGURE + "return gd._fullLayout.yaxis2.ticktext;")
    assert any(t.endswith(("KiB", "MiB", "GiB")) for t in ticks), ticks
    drag_lanes(browser, (8.6, 2.3), (14.4, 1.7))
    g, levels = mlp()
    # levels partly in view count: 8.6-14.4 shows levels 8 to 15
    wanted = sorted(i for i, lv in enumerate(levels) if 8 <= lv <= 15)
    wait(browser, lambda: sorted(detail_ops(browser)) == wanted, "the window's ops")
    lo, hi = x_range(browser)
    assert 8 < lo < 9 and 14 < hi < 15
    note = browser.find_element(By.ID, "window-note").text
    assert f"levels 8–15: {len(wanted)} ops drawn one by one" in note
    # each label names one op, and no two of those drawn cover each other on the page
    drawn = browser.execute_script(
        FIGURE + "var t = gd._fullData[arguments[0]];"
        "return Array.from(t.customdata).map((i, k) => [i, t.text[k]]);", figures.T_DETAIL_OPS)
    names = dict(zip((i for i, _ in drawn),
                     figures.window_names([g.ops[i].name for i, _ in drawn]), strict=True))
    shown = [label for i, label in drawn if label]
    assert shown and all(label == names[i] for i, label in drawn if label)
    assert len(set(shown)) == len(shown)
    boxes = browser.execute_script(
        FIGURE + "var want = new Set(arguments[0]);"
        "return Array.from(gd.querySelectorAll('.textpoint text'))"
        ".filter(e => want.has(e.textContent)).map(e => {"
        "var r = e.getBoundingClientRect(); return [r.left, r.right, r.top, r.bottom];});",
        shown)
    assert len(boxes) == len(shown)
    covered = [(a, b) for k, a in enumerate(boxes) for b in boxes[k + 1:]
               if a[0] < b[1] - 1 and b[0] < a[1] - 1 and a[2] < b[3] - 1 and b[2] < a[3] - 1]
    assert not covered, covered


def test_find_selects_the_op_and_zooms_to_it(browser: Any) -> None:
    g, levels = mlp()
    name = "sparse_categorical_crossentropy/Sum"
    i = g.index[name]
    field = browser.find_element(By.ID, "find")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE, name, Keys.ENTER)
    wait(browser, lambda: f"found {name} at level {levels[i]}" in
         browser.find_element(By.ID, "message").text, "the search's message")
    wait(browser, lambda: i in detail_ops(browser), "the found op drawn")
    lo, hi = x_range(browser)
    assert lo < levels[i] < hi and hi - lo <= 2 * rendering.FIND_SPAN + 1
    # selected: the op is ringed where it is drawn
    wait(browser, lambda: browser.execute_script(
        FIGURE + "return (gd._fullLayout.shapes || []).some(s => s.type === 'circle' &&"
        " Math.abs(s.xanchor - arguments[0]) < 1e-9);", levels[i]), "the ring")


def test_a_name_that_matches_nothing_says_so(browser: Any) -> None:
    field = browser.find_element(By.ID, "find")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE, "no-such-op-anywhere", Keys.ENTER)
    wait(browser, lambda: "no op or tensor named like" in
         browser.find_element(By.ID, "message").text, "the refusal")


def test_a_double_click_goes_back_to_the_whole_graph(browser: Any) -> None:
    plot = browser.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    (x, y) = browser.execute_script(LANE_XY, 10, 0.5)
    ActionChains(browser).move_to_element_with_offset(plot, int(x), int(y)).double_click() \
        .perform()
    wait(browser, lambda: detail_ops(browser) == [], "the window cleared")
    assert x_range(browser)[1] > 30


def pick_sample(driver: Any, name: str) -> None:
    """Choose a bundled sample in the graph list, as a user does."""
    driver.find_element(By.ID, "graph-picker").click()
    option = wait(driver, lambda: [o for o in driver.find_elements(
        By.CSS_SELECTOR, ".dash-options-list-option") if o.text.startswith(f"{name} ")],
        f"the {name} sample listed")[0]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", option)
    wait(driver, lambda: option.is_displayed(), "the option in view")
    driver.execute_script("arguments[0].click();", option)


def trace_len(driver: Any, k: int) -> int:
    return driver.execute_script(
        FIGURE + "var t = gd._fullData[arguments[0]]; return t && t.x ? t.x.length : 0;", k)


def edit_message(driver: Any) -> str:
    return driver.find_element(By.ID, "edit-message").text


def op_point_xy(driver: Any, trace: int, k: int) -> tuple[int, int]:
    """Page offset, from the plot's centre, of point ``k`` of trace ``trace`` (lanes' axes)."""
    x, y = driver.execute_script(
        FIGURE + "var L = gd._fullLayout, t = gd._fullData[arguments[0]], k = arguments[1];"
        "var r = gd.getBoundingClientRect();"
        "return [L.xaxis._offset + L.xaxis.d2p(t.x[k]) - r.width / 2,"
        "        L.yaxis._offset + L.yaxis.d2p(t.y[k]) - r.height / 2];", trace, k)
    return int(x), int(y)


def test_a_double_click_or_a_vertical_drag_selects_no_op(browser: Any) -> None:
    import time

    plot = browser.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    drag_lanes(browser, (8.6, 2.3), (14.4, 1.7))
    wait(browser, lambda: detail_ops(browser) != [], "the window's ops")
    ops = detail_ops(browser)
    g, _ = mlp()
    # a double click on an op resets the zoom and selects nothing
    k = browser.execute_script(
        FIGURE + "var t = gd._fullData[arguments[0]], r = gd._fullLayout.xaxis.range;"
        "var mid = (r[0] + r[1]) / 2, best = 0;"
        "for (var i = 0; i < t.x.length; i++)"
        "  if (Math.abs(t.x[i] - mid) < Math.abs(t.x[best] - mid)) best = i;"
        "return best;", figures.T_DETAIL_OPS)
    x, y = op_point_xy(browser, figures.T_DETAIL_OPS, k)
    ActionChains(browser).move_to_element_with_offset(plot, x, y).double_click().perform()
    wait(browser, lambda: detail_ops(browser) == [], "the window cleared")
    time.sleep(1.0)  # a click waits out the double click's delay before it selects
    assert f"selected op {g.ops[ops[k]].name} " not in edit_message(browser)
    assert "selected op" not in edit_message(browser), edit_message(browser)
    # a vertical drag from an op towards the middle of the plot zooms and selects nothing
    x, y = max((op_point_xy(browser, lane, 0) for lane in range(len(figures.CATEGORIES))
                if trace_len(browser, lane) > 0), key=lambda p: abs(p[1]))
    assert abs(y) > 30
    ActionChains(browser).move_to_element_with_offset(plot, x, y).click_and_hold() \
        .move_by_offset(0, -y // 2).move_by_offset(0, -y // 2).release().perform()
    time.sleep(1.0)
    assert "selected op" not in edit_message(browser), edit_message(browser)
    # a lone click on the same op selects it
    ActionChains(browser).move_to_element_with_offset(plot, x, y).click().perform()
    wait(browser, lambda: "selected op" in edit_message(browser), "the op selected")


def test_tab_walks_past_the_table_to_undo(browser: Any) -> None:
    browser.find_element(By.ID, "find").click()
    seen = []
    for _ in range(80):
        ActionChains(browser).send_keys(Keys.TAB).perform()
        seen.append(browser.execute_script(
            "var e = document.activeElement; return e.id || e.className || e.tagName;"))
        if seen[-1] == "undo":
            break
    assert seen[-1] == "undo", seen[-12:]


def test_the_figure_follows_the_window_width(browser: Any) -> None:
    def width() -> float:
        return browser.execute_script(FIGURE + "return gd._fullLayout.width;")

    before = browser.get_window_size()
    try:
        browser.set_window_size(1400, 1000)
        wide = width()
        wait(browser, lambda: width() == wide, "the figure settled")
        browser.set_window_size(1000, 1000)
        wait(browser, lambda: width() < wide - 200, "the figure narrowed with the window")
    finally:
        browser.set_window_size(before["width"], before["height"])


def test_a_batch_typed_then_apply_knobs_clicked_applies_them(browser: Any) -> None:
    """The batch field sends its value when it loses the focus, in the same request as the
    click that took the focus: only the first was answered, and the knobs were not applied
    (after a graph switch, the batch retyped as it was)."""

    def type_batch(value: str) -> None:
        field = browser.find_element(By.ID, "batch")
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.BACKSPACE, value, Keys.ENTER)

    def message() -> str:
        return browser.find_element(By.ID, "message").text

    wait(browser, lambda: browser.execute_script(FIGURE + "return !!(gd && gd._fullData);"),
         "the figure")
    type_batch("16")
    pick_sample(browser, "lstm")
    wait(browser, lambda: message().startswith("loaded lstm.pb"), "lstm loaded")
    type_batch("16")
    wait(browser, lambda: not message(), "the loaded message cleared")
    browser.find_element(By.ID, "knobs-apply").click()
    wait(browser, lambda: message().startswith("knobs applied:"), "the knobs applied")


def test_the_same_name_found_again_on_another_graph(browser: Any) -> None:
    """"find" sent nothing when the text typed was the one already searched on the graph
    before: the field is cleared when another graph comes."""

    def message() -> str:
        return browser.find_element(By.ID, "message").text

    def find(name: str) -> None:
        field = browser.find_element(By.ID, "find")
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.BACKSPACE, name, Keys.ENTER)

    wait(browser, lambda: browser.execute_script(FIGURE + "return !!(gd && gd._fullData);"),
         "the figure")
    pick_sample(browser, "vgg16")
    wait(browser, lambda: message().startswith("loaded vgg16.pb"), "vgg16 loaded")
    find("MatMul")
    wait(browser, lambda: message().startswith("found "), "found on the first graph")
    pick_sample(browser, "mlp")
    wait(browser, lambda: message().startswith("loaded mlp.pb"), "mlp loaded")
    assert browser.find_element(By.ID, "find").get_attribute("value") == ""
    find("MatMul")
    wait(browser, lambda: message().startswith("found "), "found on the second graph")


def test_every_control_has_a_name_for_a_screen_reader(browser: Any) -> None:
    """Both file inputs read "Choose File"; the table's pager, its filter row (twelve
    "filter data..." and twelve "Aa") and the groupby field had no name of their own."""
    wait(browser, lambda: browser.execute_script(FIGURE + "return !!(gd && gd._fullData);"),
         "the figure")
    pick_sample(browser, "resnet50")  # its table has pages
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#hotspots button.next-page"),
         "the pager", timeout=60)

    def controls() -> list[tuple[str, str]]:
        nodes = browser.execute_cdp_cmd("Accessibility.getFullAXTree", {})["nodes"]
        return [(n.get("role", {}).get("value", ""), n.get("name", {}).get("value", ""))
                for n in nodes if not n.get("ignored") and n.get("role", {}).get("value")
                in ("button", "textbox", "combobox", "checkbox", "spinbutton", "searchbox")]

    wait(browser, lambda: all(name.strip() for _, name in controls()),
         "every control named", timeout=10)
    names = [name for _, name in controls()]
    assert "Choose File" not in names
    filters = [n for n in names if n.startswith("filter ")]
    assert len(filters) == len(set(filters)) >= 10, filters


def test_recompute_and_swap_from_the_keyboard(browser: Any) -> None:
    """The table's toggles are cells a keyboard cannot press: an op found by name has its
    output recomputed, then swapped, by keys alone."""
    wait(browser, lambda: browser.execute_script(FIGURE + "return !!(gd && gd._fullData);"),
         "the figure")
    if "mlp.pb" not in browser.find_element(By.ID, "sum-graph").text:
        pick_sample(browser, "mlp")
    wait(browser, lambda: "mlp.pb" in browser.find_element(By.ID, "sum-graph").text, "mlp")

    def edit_said(*words: str) -> bool:
        return all(w in edit_message(browser) for w in words)

    field = browser.find_element(By.ID, "find")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE, "mlp_1/dense_1/Relu", Keys.ENTER)
    wait(browser, lambda: "found mlp_1/dense_1/Relu " in browser.find_element(
        By.ID, "message").text, "the op found")
    browser.find_element(By.ID, "edit-recompute-op").send_keys(Keys.ENTER)
    wait(browser, lambda: edit_said("mlp_1/dense_1/Relu:0 recomputed"), "recomputed")
    browser.find_element(By.ID, "edit-swap-op").send_keys(Keys.SPACE)
    wait(browser, lambda: edit_said("mlp_1/dense_1/Relu:0 swapped"), "swapped instead")


def test_the_find_field_shows_its_whole_hint(browser: Any) -> None:
    """The field's box was 100 px (Dash's input wrapper), its hint cut to "find op or ter"."""
    hint, room = browser.execute_script(
        "var e = document.getElementById('find'), s = getComputedStyle(e);"
        "var c = document.createElement('canvas').getContext('2d');"
        "c.font = s.fontStyle + ' ' + s.fontWeight + ' ' + s.fontSize + ' ' + s.fontFamily;"
        "return [c.measureText(e.placeholder).width, e.clientWidth"
        " - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight)];")
    assert hint <= room, (hint, room)
