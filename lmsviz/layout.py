"""Layout of the single page: controls, summary, the linked views, the hotspot table.

The page is built per visit (:func:`build` is called by the app's layout function) with
the initial session's figure already in it, so the first paint needs no callback round
trip. Component ids are the contract with :mod:`lmsviz.callbacks`.
"""

from __future__ import annotations

import warnings
from typing import Any

from dash import dash_table, dcc, html
from dash.dash_table.Format import Format, Scheme

from . import compare_panel, figures
from .state import AppContext, presets

#: Labels of the sync modes (TFLMS v2).
SYNC_LABELS = {0: "0: none", 1: "1: swap-outs", 2: "2: swap-ins", 3: "3: both"}

#: The toggles and what the plan does come right after the tensor: in a narrow window the
#: columns after them need a sideways scroll, the toggles did.
HOTSPOT_COLUMNS = [
    {"name": "tensor", "id": "tensor"},
    {"name": "MiB", "id": "mib", "type": "numeric",
     "format": Format(precision=2, scheme=Scheme.fixed)},
    {"name": "swap", "id": "swap"},
    {"name": "recompute", "id": "recompute"},
    {"name": "decision", "id": "decision"},
    {"name": "on the device as", "id": "held"},
    {"name": "from level", "id": "producer_level", "type": "numeric"},
    {"name": "last use", "id": "last_use_level", "type": "numeric"},
    {"name": "distance", "id": "distance", "type": "numeric"},
    {"name": "category", "id": "category"},
    {"name": "swappable", "id": "swappable"},
    {"name": "recomputable", "id": "recomputable"},
]


def _table(**props: Any) -> dash_table.DataTable:
    """A DataTable, without Dash 4's notice that it will move out of the core package."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return dash_table.DataTable(**props)


def _field(label: str, control: Any, hint: str = "") -> html.Label:
    return html.Label([html.Span(label, className="label"), control], className="field",
                      title=hint)


def _number(id_: str, value: Any, minimum: int, hint: str, label: str) -> html.Label:
    # text, not type="number": the browser sends an out-of-range or fractional number as
    # None, and the refusal could not say what was typed
    return _field(label, dcc.Input(id=id_, type="text", inputMode="numeric", value=value,
                                   debounce=True, className="num"), hint)


#: The graph's config: no logo, cloud or chart-studio button, no wheel zoom (the wheel
#: scrolls the page; zoom by dragging or with the buttons). Only keys the plotly.js that
#: Dash serves knows (its "showLink" and "showEditInChartStudio" are gone; the page test
#: checks that neither is on). A figure follows the window's width through
#: ``assets/page.js``, not through Dash's "responsive", which gives the figure's box no
#: height (clicks then land on the table below it).
GRAPH_CONFIG = {
    "displaylogo": False, "scrollZoom": False, "showSendToCloud": False,
    "plotlyServerURL": "", "sendData": False, "showTips": False,
    "modeBarButtonsToRemove": ["lasso2d", "select2d", "sendDataToCloud", "editInChartStudio"],
}


def preset_options(table: dict[str, Any]) -> list[dict[str, str]]:
    """Dropdown options of tuner presets, labelled with their memory or link name."""
    out = []
    for key, preset in table.items():
        memory = getattr(preset, "memory_bytes", None)
        label = f"{key} ({memory / 2**30:g} GiB)" if memory else key
        out.append({"label": label, "value": key, "title": str(getattr(preset, "name", key))})
    return out


def controls(session: dict[str, Any], picker: tuple[list[dict[str, str]], str]) -> html.Div:
    """The graph, batch, budget and preset controls, the knobs and auto-tune."""
    s = session["settings"]
    devices, links = presets()
    knobs = s["knobs"]
    options, value = picker
    return html.Div([
        html.Div([
            _field("graph", dcc.Dropdown(id="graph-picker", options=options, value=value,
                                         clearable=False, className="picker")),
            # no accept filter: a file of another type must get a message, not be dropped
            dcc.Upload(id="graph-upload", children=html.Div(["upload .pb / .pbtxt / .zip"]),
                       className="upload"),
            _number("batch", s["batch"], 1, "fills the unknown batch dimension (a graph "
                    "whose inputs fix the batch keeps it)", "batch size"),
            _field("budget", dcc.Input(id="budget", type="text", value=s["budget"],
                                       debounce=True, className="text"),
                   "device memory budget, e.g. 16GiB or 15.5GB"),
            _field("device", dcc.Dropdown(id="device", options=preset_options(devices),
                                          value=s["device"], clearable=False,
                                          className="preset"), "accelerator preset (tuner)"),
            _field("link", dcc.Dropdown(id="link", options=preset_options(links), value=s["link"],
                                        clearable=False, className="preset"),
                   "host link preset (tuner)"),
            _field("workspace", dcc.Dropdown(
                id="workspace", value=s.get("workspace", "accelerator"), clearable=False,
                className="preset", options=[
                    {"label": "accelerator", "value": "accelerator"},
                    {"label": "this CPU's kernels", "value": "cpu"}]),
                   "kernel workspace the simulator counts: none on an accelerator (cuDNN "
                   "falls back to workspace-free algorithms), or TensorFlow's kernels on "
                   "this CPU (what lms validate measures)"),
        ], className="row"),
        html.Div([
            _number("knob-threshold", knobs["threshold"], 1,
                    "consumers more than this many levels away read from the host", "threshold"),
            _number("knob-ahead", knobs["ahead"], 1,
                    "swap-ins start about this many levels early", "ahead"),
            _number("knob-groupby", knobs["groupby"], 0,
                    "consumers within this many levels share a swap-in", "groupby"),
            _field("sync mode", dcc.Dropdown(
                id="knob-sync", options=[{"label": v, "value": k} for k, v in SYNC_LABELS.items()],
                value=knobs["sync_mode"], clearable=False, className="preset")),
            html.Button("apply knobs", id="knobs-apply", className="primary"),
            html.Span(className="sep"),
            html.Button("auto-tune", id="tune-run", className="primary"),
            html.Button("cancel", id="tune-cancel", disabled=True),
            html.Progress(id="tune-progress", value="0", max="100",
                          style={"visibility": "hidden"}),
            html.Span(id="tune-status", className="status", role="status"),
        ], className="row"),
        html.Div([
            html.Span("plan", className="label"),
            html.Button("save plan", id="plan-save"),
            dcc.Upload(id="plan-upload", children=html.Div("load plan (.json)"),
                       className="upload small"),
            html.Button("reset plan", id="plan-reset"),
            html.Span(className="sep"),
            html.Span("export", className="label"),
            _field("device", dcc.Input(id="export-device", type="text", value="/GPU:0",
                                       className="text short"), "accelerator device string"),
            _field("host", dcc.Input(id="export-host", type="text", value="/CPU:0",
                                     className="text short"), "host device string"),
            html.Button("export rewritten graph + plan", id="export"),
            dcc.Download(id="download"),
        ], className="row"),
    ], className="controls")


def views(rendered: Any) -> html.Div:
    """The linked views: the figure, the hotspot table, the swap editor, the recomputes."""
    return html.Div([
        html.Div(rendered.note, id="ordering-note", className="note"),
        html.Div([
            dcc.Input(id="find", type="text", debounce=True, className="text find",
                      placeholder="find op or tensor (Enter)"),
            html.Span(id="window-note", className="note"),
        ], className="row"),
        html.Details([
            html.Summary("what a level is, and every mark"),
            html.P(figures.LEVEL_HELP, className="hint"),
            html.Ul([html.Li([html.Span(g, style={"color": c, "fontWeight": "700",
                                                  "marginRight": "6px"}), m])
                     for g, c, m in figures.LEGEND], className="legend"),
        ], id="legend"),
        dcc.Loading(
            dcc.Graph(id="studio", figure=rendered.figure, className="studio",
                      config=GRAPH_CONFIG),
            delay_show=400, overlay_style={"visibility": "visible", "opacity": 0.6},
            type="dot",
        ),
        html.Div([
            html.Div([
                html.Div(rendered.caption, id="hotspot-caption", className="caption"),
                html.Div(id="edit-message", className="message", role="status"),
                _table(
                    id="hotspots", columns=HOTSPOT_COLUMNS, data=rendered.rows,
                    sort_action="native", filter_action="native", page_action="native",
                    page_size=12, style_data_conditional=rendered.row_styles,
                    style_table={"overflowX": "auto"},
                    style_cell={"fontFamily": "system-ui, sans-serif", "fontSize": "13px",
                                "padding": "4px 8px", "textAlign": "left"},
                    style_cell_conditional=[
                        {"if": {"column_id": "tensor"}, "minWidth": "200px", "maxWidth": "420px",
                         "whiteSpace": "normal", "wordBreak": "break-all"},
                        # reasons wrap, so that the tensor keeps its width
                        *({"if": {"column_id": c}, "minWidth": "90px", "maxWidth": "200px",
                           "whiteSpace": "normal"} for c in ("swappable", "recomputable")),
                    ],
                    style_header={"fontWeight": "600", "backgroundColor": "#f1f5f9"},
                ),
            ], className="table"),
            html.Div([
                html.Div([
                    html.Button("↶ undo", id="undo", title="back to the plan before the last "
                                "edit"),
                    html.Button("↷ redo", id="redo", title="forward again"),
                ], className="row"),
                html.H4("swap editor"),
                html.Div(rendered.editor, id="swap-editor"),
                html.Div([
                    dcc.Dropdown(id="edit-group", options=rendered.groups, value=0,
                                 clearable=False, placeholder="swap-in", className="preset"),
                    html.Button("trigger = selected op", id="edit-trigger",
                                title="click an op in the ordering view first"),
                    html.Button("synchronous", id="edit-sync"),
                ], className="row"),
                html.Div([
                    html.Button("swap / unswap selected op's output", id="edit-swap-op",
                                title="click an op in the ordering view (or find it) first"),
                    html.Button("recompute / keep selected op's output",
                                id="edit-recompute-op",
                                title="click an op in the ordering view (or find it) first"),
                ], className="row"),
                html.Div([
                    dcc.Input(id="edit-groupby", type="text", inputMode="numeric", value=5,
                              className="num"),
                    html.Button("regroup by levels", id="edit-regroup"),
                    html.Button("one group", id="edit-onegroup"),
                ], className="row"),
                html.H4("recomputed"),
                html.Div(rendered.recomputes, id="recompute-list"),
            ], className="editor"),
        ], className="lower"),
    ], className="views")


def compare_section() -> html.Div:
    """The compare panel, closed: plans side by side, and memory against the batch size.

    Its contents are drawn when it is opened (:mod:`lmsviz.compare_panel`).
    """
    hidden = {"display": "none"}
    return html.Div([
        html.Button("compare plans ▸", id="compare-open", title="the current plan against "
                    "the unplanned step and a saved plan; memory against the batch size"),
        html.Div([
            html.Div([
                _field("compare with", dcc.Dropdown(
                    id="compare-pick", options=[], value=None, clearable=True,
                    placeholder="a plan this tab saved or loaded", className="picker"),
                    "plans this tab saved (save plan) or loaded (load plan, or the upload "
                    "next to this)"),
                dcc.Upload(id="compare-upload", children=html.Div("load a plan to compare "
                                                                  "(.json)"),
                           className="upload small"),
            ], className="row"),
            html.Div(id="compare-message", className="message", role="status"),
            html.Div(id="compare-note", className="note"),
            _table(id="compare-table", columns=compare_panel.COLUMNS, data=[],
                   style_table={"overflowX": "auto"},  # (not the page: it scrolls itself)
                   style_cell={"fontFamily": "system-ui, sans-serif", "fontSize": "13px",
                               "padding": "4px 8px", "textAlign": "left"},
                   style_header={"fontWeight": "600", "backgroundColor": "#f1f5f9"}),
            dcc.Graph(id="compare-figure", config=GRAPH_CONFIG, style=hidden),
            html.H4("memory against the batch size"),
            html.Div([
                html.Button("plot peak memory against batch size", id="batch-run",
                            className="primary"),
                html.Button("cancel", id="batch-cancel", disabled=True),
                html.Progress(id="batch-progress", value="0", max="100",
                              style={"visibility": "hidden"}),
                html.Span(id="batch-status", className="status", role="status"),
            ], className="row"),
            html.Div(id="batch-note", className="note"),
            dcc.Graph(id="batch-figure", config=GRAPH_CONFIG, style=hidden),
        ], id="compare-panel", style=hidden),
    ], className="compare")


def build(app: AppContext, session: dict[str, Any], rendered: Any,
          picker: tuple[list[dict[str, str]], str]) -> html.Div:
    """The whole page for a new visit.

    Parameters
    ----------
    app : AppContext
        Server state (upload cap).
    session : dict
        Initial data of the session stores (:func:`lmsviz.state.new_session`).
    rendered : lmsviz.rendering.Rendered
        The initial session rendered (figure, table, summary).
    picker : (list, str)
        Options and value of the graph picker.
    """
    return html.Div([
        html.Header([
            html.H1("lms studio"),
            html.Span("see where a training step's memory goes, and make it fit",
                      className="tagline"),
        ]),
        controls(session, picker),
        html.Div(id="message", className="message", role="status"),
        # set by assets/page.js when the server does not answer an action
        html.Div(id="offline", className="offline", role="alert", hidden=True),
        html.Div(rendered.summary, id="summary", className="summary"),
        compare_section(),
        views(rendered),
        dcc.Store(id="st-graph", storage_type="session", data=session["graph"]),
        dcc.Store(id="st-settings", storage_type="session", data=session["settings"]),
        dcc.Store(id="st-plan", storage_type="session", data=session["plan"]),
        dcc.Store(id="st-view", storage_type="session", data=session["view"]),
        dcc.Store(id="st-history", storage_type="session", data=session["history"]),
        # the tab's id: a reloaded tab keeps the one in its session storage
        dcc.Store(id="st-tab", storage_type="session", data=session["tab"]),
        dcc.Store(id="st-fork"),  # a duplicated tab's old and new id (TAB_CLAIM_JS)
        dcc.Store(id="st-click"),  # a lone click on the views (assets/page.js)
        dcc.Store(id="st-rendered", data=rendered.rendered),
        dcc.Store(id="st-tune"),
        dcc.Store(id="graph-gate"),
        dcc.Store(id="plan-gate"),
        # plans this tab saved or loaded, to compare with; the batch job's last result
        dcc.Store(id="st-compare-plans", storage_type="session", data=[]),
        dcc.Store(id="st-batch"),
        dcc.Store(id="compare-gate"),
        dcc.Store(id="st-config", data=app.upload_cap_bytes),
    ], className="page")
