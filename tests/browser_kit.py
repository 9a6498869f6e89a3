"""What the browser tests and ``bench/bench_ui.py`` share: Chromium and page scripts."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

FIGURE = "var gd = document.querySelector('#studio .js-plotly-plot');"
#: Page offset, from the studio plot's centre, of level ``x`` on lane ``y`` of the ordering
#: view.
LANE_XY = FIGURE + """
var L = gd._fullLayout, r = gd.getBoundingClientRect();
return [L.xaxis._offset + L.xaxis.d2p(arguments[0]) - r.width / 2,
        L.yaxis._offset + L.yaxis.d2p(arguments[1]) - r.height / 2];
"""

#: Page coordinates, relative to the plot's centre, of point ``k`` of trace ``t`` of the
#: memory curves (the second axes), for ActionChains clicks.
POINT_XY = """
var gd = document.querySelector('#studio .js-plotly-plot');
var L = gd._fullLayout, t = gd._fullData[arguments[0]], k = arguments[1];
var r = gd.getBoundingClientRect();
return [L.xaxis2._offset + L.xaxis2.d2p(t.x[k]) - r.width / 2,
        L.yaxis2._offset + L.yaxis2.d2p(t.y[k]) - r.height / 2];
"""


def chrome_options(profile: str) -> Any:
    """Headless Chromium without network chatter, a fixed window, ``profile`` as its data."""
    from selenium import webdriver  # here: the browser tests skip when it is missing

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", "--window-size=1500,1300",
                "--enable-unsafe-swiftshader"):
        opts.add_argument(arg)
    return opts


@contextlib.contextmanager
def served_page(data_dir: pathlib.Path, sample: str, downloads: pathlib.Path | None = None
                ) -> Iterator[Any]:
    """``lms serve SAMPLE`` on a free port and a headless Chromium on its page.

    Raises
    ------
    RuntimeError
        If the server does not start.
    """
    from dash_client import Server
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    srv = Server(data_dir, sample)
    srv.start()
    profile = tempfile.mkdtemp(prefix="lms-chromium-")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=chrome_options(profile))
    try:
        if downloads is not None:
            driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                                   {"behavior": "allow", "downloadPath": str(downloads)})
        driver.get(srv.url + "/")
        yield driver
    finally:
        driver.quit()
        srv.stop()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: Any, what: Callable[[], Any], msg: str = "", timeout: float = 30) -> Any:
    """Poll ``what()`` until it returns something truthy (a re-drawn element is retried)."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2,
                         ignored_exceptions=(NoSuchElementException,
                                             StaleElementReferenceException)).until(
        lambda _d: what(), message=msg)


def text(driver: Any, id_: str) -> str:
    """The visible text of the element ``id_``."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, id_).text


def drag_lanes(driver: Any, start: tuple[float, float], end: tuple[float, float]) -> None:
    """Drag a zoom box over the ordering view from (level, lane) ``start`` to ``end``."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    plot = driver.find_element(By.CSS_SELECTOR, "#studio .js-plotly-plot")
    (ax, ay) = driver.execute_script(LANE_XY, *start)
    (bx, by) = driver.execute_script(LANE_XY, *end)
    step = (int((bx - ax) / 2), int((by - ay) / 2))
    (ActionChains(driver).move_to_element_with_offset(plot, int(ax), int(ay)).click_and_hold()
     .move_by_offset(*step).move_by_offset(*step).release().perform())
