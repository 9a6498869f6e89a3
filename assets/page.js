// Pointer and keyboard fixes of the page; nothing here talks to anything but the page.
(function () {
  "use strict";
  // Plotly reports a click for each press of a double click, and for a vertical drag on
  // the ordering view (its y axes are fixed, so nothing zooms). Only a lone click that did
  // not move selects an op: presses are recorded here, and the click waits for the double
  // click delay before it is passed on.
  var DOUBLE_MS = 300, MOVE_PX = 5;
  var presses = [];
  var pressedAt = null;
  document.addEventListener("mousedown", function (e) {
    if (!e.target.closest || !e.target.closest("#studio")) return;
    pressedAt = {t: Date.now(), x: e.clientX, y: e.clientY, moved: false};
    presses.push(pressedAt);
    if (presses.length > 8) presses.shift();
  }, true);
  document.addEventListener("mouseup", function (e) {
    if (pressedAt && Math.hypot(e.clientX - pressedAt.x, e.clientY - pressedAt.y) > MOVE_PX) {
      pressedAt.moved = true;
    }
  }, true);

  function loneClick(press) {
    return !press.moved && !presses.some(function (p) {
      return p !== press && Math.abs(p.t - press.t) < DOUBLE_MS;
    });
  }

  // Dash's DataTable keeps Tab for moving between its cells, so the focus never left its
  // filter row: Tab inside the table goes to the browser, which moves the focus on.
  window.addEventListener("keydown", function (e) {
    if (e.key === "Tab" && document.activeElement && document.activeElement.closest &&
        document.activeElement.closest(".dash-table-container")) {
      e.stopPropagation();
    }
  }, true);

  // The figures take the window's width when it changes (their height is their own).
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () {
      document.querySelectorAll(".js-plotly-plot").forEach(function (gd) {
        if (gd.offsetParent !== null && window.Plotly) window.Plotly.Plots.resize(gd);
      });
    }, 150);
  });

  window.dash_clientside = Object.assign({}, window.dash_clientside, {
    lms: {
      // studio.clickData -> st-click: the click, or nothing for a double click or a drag
      clickGate: function (click) {
        var nothing = window.dash_clientside.no_update;
        var press = pressedAt;
        if (!click || !press) return nothing;
        return new Promise(function (resolve) {
          setTimeout(function () {
            resolve(loneClick(press) ? click : nothing);
          }, DOUBLE_MS + 20);
        });
      },
    },
  });
})();
