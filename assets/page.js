// Pointer and keyboard fixes of the page; nothing here talks to anything but the page.
(function () {
  "use strict";
  // Plotly reports a click for each press of a double click, and for a vertical drag on
  // the ordering view (its y axes are fixed, so nothing zooms). Only a lone click that did
  // not move selects an op: presses are recorded here, and a click on the ops waits for
  // the double click delay before it is passed on (a click on the memory curves, which
  // selects a level, does not wait).
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

  // An action the server did not answer said so on the page (Dash writes it only to the
  // browser's console); the next answer clears it.
  var OFFLINE = "the server did not answer, so your last action was not done: " +
    "start lms serve again (with the same --data-dir) and repeat it; this page keeps its state";
  function offline(text) {
    var el = document.getElementById("offline");
    if (!el) return;
    el.textContent = text || "";
    el.hidden = !text;
  }
  var fetch0 = window.fetch;
  window.fetch = function (resource, init) {
    var url = typeof resource === "string" ? resource : (resource && resource.url) || "";
    var update = url.indexOf("_dash-update-component") >= 0;
    return fetch0.apply(this, arguments).then(function (response) {
      if (update) {
        offline(response.ok || response.status === 204 ? "" :
          "the server answered HTTP " + response.status + ": your last action was not done");
      }
      return response;
    }, function (error) {
      if (update) offline(OFFLINE);
      throw error;
    });
  };

  // Names for a screen reader where Dash's components give none: the file inputs (all
  // "Choose File"), the table's pager and filter row, the groupby field.
  var NAMES = {
    "#graph-upload input[type=file]": "upload a graph (.pb, .pbtxt or a zipped SavedModel)",
    "#plan-upload input[type=file]": "load a plan (.json)",
    "#compare-upload input[type=file]": "load a plan to compare (.json)",
    "#edit-groupby": "levels per swap-in group, for regroup by levels",
    "#hotspots button.first-page": "first page of the table",
    "#hotspots button.previous-page": "previous page of the table",
    "#hotspots button.next-page": "next page of the table",
    "#hotspots button.last-page": "last page of the table",
  };
  function name() {
    Object.keys(NAMES).forEach(function (sel) {
      document.querySelectorAll(sel).forEach(function (el) {
        if (el.getAttribute("aria-label") !== NAMES[sel]) el.setAttribute("aria-label", NAMES[sel]);
      });
    });
    document.querySelectorAll("#hotspots th.dash-filter").forEach(function (th) {
      var id = th.getAttribute("data-dash-column") || "";
      var head = id && document.querySelector(
        '#hotspots th.dash-header[data-dash-column="' + id + '"]');
      var col = (head && head.textContent.trim()) || id;
      th.querySelectorAll("input").forEach(function (el) {
        var label = (el.type === "button" ? "case-sensitive filter of " : "filter ") + col;
        if (col && el.getAttribute("aria-label") !== label) el.setAttribute("aria-label", label);
      });
    });
  }
  var naming = false;
  new MutationObserver(function () {
    if (naming) return;
    naming = true;
    requestAnimationFrame(function () { naming = false; name(); });
  }).observe(document.documentElement, {childList: true, subtree: true});

  // The figures take the window's width when it changes (their height is their own).
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () {
      document.querySelectorAll(".js-plotly-plot").forEach(function (gd) {
        // only a figure whose box changed width: a redraw of ResNet-50's 9,208 points
        // on a resize event while the page loads delayed its first paint by 0.5 s
        var drawn = gd._fullLayout && gd._fullLayout.width;
        if (gd.offsetParent !== null && window.Plotly && drawn &&
            Math.abs(gd.clientWidth - drawn) > 1) {
          window.Plotly.Plots.resize(gd);
        }
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
        // a level clicked on the memory curves (the lower axes) selects no op: at once
        var gd = document.querySelector("#studio .js-plotly-plot");
        var point = click.points && click.points[0];
        var trace = gd && gd._fullData && point && gd._fullData[point.curveNumber];
        if (trace && trace.yaxis === "y2") return press.moved ? nothing : click;
        return new Promise(function (resolve) {
          setTimeout(function () {
            resolve(loneClick(press) ? click : nothing);
          }, DOUBLE_MS + 20);
        });
      },
    },
  });
})();
