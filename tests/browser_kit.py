"""What the browser tests and ``bench/bench_ui.py`` share: Chromium and page scripts."""

from __future__ import annotations

from typing import Any

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

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
