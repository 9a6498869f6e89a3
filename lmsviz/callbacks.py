"""Dash wiring: the page's callbacks, each a thin wrapper around a plain function.

- the control callback hands every user action to :func:`lmsviz.edits.control`, the only
  writer of the session stores;
- the render callback turns the stores into the views (:func:`lmsviz.rendering.render`);
- the export, plan download and auto-tune callbacks call :mod:`lmsviz.files` and
  :mod:`lmsviz.tuning`.

Session state travels in ``dcc.Store`` components (``storage_type="session"``: per tab,
kept across reloads); the server keeps only the :class:`~lmsviz.state.AppContext`.
A callback that fails answers one line on the page (:func:`internal_error`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dash
from dash import ClientsideFunction, Input, Output, State, ctx, dcc, no_update

from lmscore.errors import LmsError

from . import compare_panel, edits, files, rendering, tuning
from .edits import Update
from .results import plan_label
from .state import TAB_CLAIM_JS, AppContext, ServerBusy

_log = logging.getLogger("lmsviz")


def _upload_gate(app: dash.Dash, name: str) -> None:
    """The browser-side check of an upload (size, type) before ``NAME-gate`` gets it."""
    app.clientside_callback(
        files.GATE_JS, Output(f"{name}-gate", "data"), Output(f"{name}-upload", "contents"),
        Input(f"{name}-upload", "contents"), State(f"{name}-upload", "filename"),
        State("st-config", "data"), prevent_initial_call=True,
    )


def register(app: dash.Dash, state: AppContext) -> None:
    """Attach every callback of the page to ``app``."""
    inputs = {
        "graph-picker": "value", "graph-gate": "data", "batch": "value", "budget": "value",
        "device": "value", "link": "value", "workspace": "value", "knobs-apply": "n_clicks",
        "plan-reset": "n_clicks",
        "plan-gate": "data", "hotspots": "active_cell", "st-click": "data",
        "edit-trigger": "n_clicks", "edit-sync": "n_clicks", "edit-regroup": "n_clicks",
        "edit-swap-op": "n_clicks", "edit-recompute-op": "n_clicks", "tune-cancel": "n_clicks",
        "edit-onegroup": "n_clicks", "undo": "n_clicks", "redo": "n_clicks",
        "st-tune": "data", "st-graph": "data", "st-settings": "data", "find": "value",
    }
    fields = {"knob-threshold": "value", "knob-ahead": "value", "knob-groupby": "value",
              "knob-sync": "value", "edit-group": "value", "edit-groupby": "value",
              "tune-run": "disabled"}
    stores = ("st-graph", "st-settings", "st-plan", "st-view")

    _upload_gate(app, "graph")
    _upload_gate(app, "plan")
    # a click on the views selects only when it was neither part of a double click nor a
    # drag (assets/page.js)
    app.clientside_callback(ClientsideFunction("lms", "clickGate"), Output("st-click", "data"),
                            Input("studio", "clickData"), prevent_initial_call=True)

    @app.callback(
        *[Output(s, "data") for s in stores], Output("st-history", "data"),
        *[Output(m, p) for m in MESSAGES for p in ("children", "className")],
        Output("graph-picker", "options"), Output("graph-picker", "value"),
        *[Output(c, "value") for c in rendering.CONTROLS],
        Output("hotspots", "active_cell"), Output("hotspots", "selected_cells"),
        Output("find", "value"),
        *[Output(c, p, allow_duplicate=True) for c, p in RENDERED],
        *[Input(k, prop) for k, prop in inputs.items()],
        *[State(k, prop) for k, prop in fields.items()],
        State("st-plan", "data"), State("st-view", "data"), State("st-history", "data"),
        State("st-tab", "data"), State("st-rendered", "data"),
        prevent_initial_call=True,
    )
    def _control(*args: Any) -> tuple[Any, ...]:
        names = [*inputs, *fields]
        values = dict(zip(names, args[: len(names)], strict=True))
        plan, view, history, tab, rendered = args[len(names):]
        session = {"graph": values["st-graph"], "settings": values["st-settings"],
                   "plan": plan, "view": view, "history": history, "tab": tab}
        fired = [t["prop_id"].split(".")[0] for t in ctx.triggered
                 if t["prop_id"].split(".")[0] in inputs]
        trigger = fired[-1] if fired else None
        try:
            up, trigger = edits.control_all(state, fired, values, session)
        except Exception as e:  # noqa: BLE001 - a bug must not leave the page without an answer
            up = edits.refuse(internal_error(trigger or "this action", e))
        return (*_outputs(up, session, trigger), *_render_now(state, up, session, rendered))

    @app.callback(
        Output("studio", "figure"), Output("ordering-note", "children"),
        Output("summary", "children"), Output("hotspots", "data"),
        Output("hotspots", "style_data_conditional"), Output("hotspot-caption", "children"),
        Output("swap-editor", "children"), Output("edit-group", "options"),
        Output("recompute-list", "children"), Output("st-rendered", "data"),
        Output("message", "children", allow_duplicate=True),
        Output("message", "className", allow_duplicate=True),
        *[Input(s, "data") for s in stores],
        State("st-rendered", "data"),
        prevent_initial_call=True,
    )
    def _render(graph: Any, settings: Any, plan: Any, view: Any, rendered: Any
                ) -> tuple[Any, ...]:
        session = {"graph": graph, "settings": settings, "plan": plan, "view": view}
        if rendered and rendered.get("state") == rendering.state_digest(session):
            return (no_update,) * 12  # the control callback drew this state already
        full = rendering.needs_full_figure(rendered, session)
        only_view = {t["prop_id"].split(".")[0] for t in ctx.triggered} == {"st-view"}
        try:
            r = rendering.render(state, session, full=full, data=not only_view)
        except ServerBusy as e:
            return (*([no_update] * 10), str(e), "message error")
        except LmsError as e:
            return (*([no_update] * 10), f"cannot show this graph: {e}", "message error")
        except Exception as e:  # noqa: BLE001 - a bug must not leave the page without an answer
            return (*([no_update] * 10), internal_error("drawing", e), "message error")
        msg = (r.message, "message error") if r.message else (no_update, no_update)
        return (r.figure, r.note, r.summary, r.rows, r.row_styles, r.caption, r.editor,
                r.groups, r.recomputes, r.rendered, *msg)

    # a duplicated tab takes a new id in the browser, then gets a copy of the old one's plans
    app.clientside_callback(TAB_CLAIM_JS, Output("st-tab", "data"), Output("st-fork", "data"),
                            Input("st-tab", "data"))

    @app.callback(Input("st-fork", "data"), prevent_initial_call=True)
    def _fork(fork: Any) -> None:
        if isinstance(fork, dict):
            state.fork_tab(fork.get("from"), fork.get("to"))

    @app.callback(
        Output("studio", "figure", allow_duplicate=True),
        Output("window-note", "children"),
        Input("studio", "relayoutData"), Input("find", "value"),
        State("st-graph", "data"), State("st-settings", "data"), State("st-plan", "data"),
        prevent_initial_call=True,
    )
    def _zoom(relayout: Any, query: Any, graph: Any, settings: Any, plan: Any
              ) -> tuple[Any, Any]:
        session = {"graph": graph, "settings": settings, "plan": plan}
        trigger = ctx.triggered_id if isinstance(ctx.triggered_id, str) else None
        try:
            patch, note, _ = rendering.zoom(state, session, relayout, query, trigger)
        except (LmsError, ServerBusy):
            return no_update, no_update
        except Exception as e:  # noqa: BLE001 - a bug must not leave the page without an answer
            return no_update, internal_error("zooming", e)
        return patch, note

    @app.callback(
        Output("download", "data", allow_duplicate=True),
        Output("message", "children", allow_duplicate=True),
        Output("message", "className", allow_duplicate=True),
        Input("export", "n_clicks"), State("st-graph", "data"), State("st-plan", "data"),
        State("export-device", "value"), State("export-host", "value"),
        prevent_initial_call=True,
    )
    def _export(_n: Any, graph: Any, plan: Any, device: Any, host: Any) -> tuple[Any, ...]:
        try:
            name, data = files.export_bundle(state, graph, plan or {}, device or "/GPU:0",
                                       host or "/CPU:0")
        except LmsError as e:
            return no_update, f"export failed: {e}", "message error"
        except Exception as e:  # noqa: BLE001
            return no_update, internal_error("export", e), "message error"
        return (dcc.send_bytes(data, name), f"exported {name} (rewritten graph and plan)",
                "message ok")

    @app.callback(
        Output("download", "data", allow_duplicate=True),
        Output("message", "children", allow_duplicate=True),
        Output("message", "className", allow_duplicate=True),
        Input("plan-save", "n_clicks"), State("st-graph", "data"), State("st-plan", "data"),
        prevent_initial_call=True,
    )
    def _save_plan(_n: Any, graph: Any, plan: Any) -> tuple[Any, ...]:
        # said where the user looks (the comparison's own line is in its closed panel)
        try:
            name, text, label = files.plan_download(state, graph, plan or {})
        except LmsError as e:
            return no_update, f"plan not saved: {e}", "message error"
        except Exception as e:  # noqa: BLE001 - a bug must not leave the page without an answer
            return no_update, internal_error("plan download", e), "message error"
        kept = "; kept for comparison (compare plans)" if (plan or {}).get("json") else ""
        return ({"content": text, "filename": name, "type": "application/json"},
                f"downloaded {name}: {label}{kept}", "message ok")

    register_compare(app, state)

    if getattr(app, "_background_manager", None) is None:
        # without diskcache/multiprocess/psutil the tuner runs inside the request
        @app.callback(
            Output("st-tune", "data"),
            Input("tune-run", "n_clicks"), State("st-graph", "data"),
            State("st-settings", "data"), prevent_initial_call=True,
        )
        def _tune_inline(_n: Any, graph: Any, settings: Any) -> dict[str, Any]:
            try:
                return tuning.run_tune(state, graph, settings, lambda f, m: None)
            except Exception as e:  # noqa: BLE001 - a failing tuner must not break the page
                return {"error": f"the tuner failed: {type(e).__name__}: {e}"}

        return

    @app.callback(
        Output("st-tune", "data"),
        Input("tune-run", "n_clicks"), State("st-graph", "data"), State("st-settings", "data"),
        background=True,
        running=[
            (Output("tune-run", "disabled"), True, False),
            # saved mid-run, the file held the plan before the run and the comparison the
            # tuned one (the kept copy waits for the plan the run is still making)
            (Output("plan-save", "disabled"), True, False),
            (Output("tune-cancel", "disabled"), False, True),
            (Output("tune-progress", "style"), {"visibility": "visible"},
             {"visibility": "hidden"}),
        ],
        progress=[Output("tune-progress", "value"), Output("tune-status", "children")],
        progress_default=[0, ""],
        # another graph cancels a run for the one shown (its plan would be refused)
        cancel=[Input("tune-cancel", "n_clicks"), Input("st-graph", "data")],
        interval=400,
        prevent_initial_call=True,
    )
    def _tune(set_progress: Callable[[Any], None], _n: Any, graph: Any, settings: Any
              ) -> dict[str, Any]:
        set_progress((0, "starting…"))
        try:
            return tuning.run_tune(state, graph, settings,
                            lambda f, m: set_progress((round(100 * f), m)))
        except Exception as e:  # noqa: BLE001 - a failing tuner must not leave the UI stuck
            return {"error": f"the tuner failed: {type(e).__name__}: {e}"}



def register_compare(app: dash.Dash, state: AppContext) -> None:
    """The compare panel's callbacks and the zoomed window drawn again after a plan edit.

    The panel computes only while it is open (:mod:`lmsviz.compare_panel`); the batch
    sweep is a background job like auto-tune.
    """
    _upload_gate(app, "compare")

    @app.callback(
        Output("st-compare-plans", "data"), Output("compare-pick", "value"),
        Output("compare-pick", "options", allow_duplicate=True),
        Output("compare-message", "children"), Output("compare-message", "className"),
        Input("plan-save", "n_clicks"), Input("st-plan", "data"), Input("compare-gate", "data"),
        Input("st-settings", "data"), State("st-graph", "data"),
        State("st-compare-plans", "data"), prevent_initial_call=True,
    )
    def _keep_plan(_n: Any, plan: Any, gate: Any, settings: Any, graph: Any, kept: Any
                   ) -> tuple[Any, ...]:
        fp = str((graph or {}).get("fingerprint", ""))
        if ctx.triggered_id == "st-settings":  # a later success clears a refusal shown here
            return no_update, no_update, no_update, "", "message"
        try:
            if ctx.triggered_id == "compare-gate":
                name, loaded = compare_panel.read_upload(state, graph or {}, gate)
                kept, pid = compare_panel.remember(kept, fp, name, loaded.to_json())
                # the picker gets its options with its value: a value it had no option for
                # was dropped (the first plan loaded for comparison was never compared)
                return (kept, pid, compare_panel.options(kept, fp),
                        f"{name}: {plan_label(loaded, (settings or {}).get('batch'))}",
                        "message ok")
            source = (plan or {}).get("source")
            if not (plan or {}).get("json") or (ctx.triggered_id == "st-plan"
                                                and source not in ("file", "saved")):
                return no_update, no_update, no_update, "", "message"
            p = compare_panel.plan_of(state, state.resolve(graph or {}), plan["json"])
            what = "saved" if ctx.triggered_id == "plan-save" else (
                "loaded" if source == "file" else "restored")
            name = compare_panel.next_name(kept, what, p)
            kept, _ = compare_panel.remember(kept, fp, name, plan["json"])
            if what == "saved":
                return kept, no_update, no_update, (
                    f"plan downloaded and kept for comparison as {name}"), "message ok"
            return kept, no_update, no_update, "", "message"
        except LmsError as e:
            return no_update, no_update, no_update, f"not kept for comparison: {e}", (
                "message error")
        except Exception as e:  # noqa: BLE001 - a bug must not leave the page without an answer
            return no_update, no_update, no_update, internal_error("compare", e), "message error"

    @app.callback(
        Output("compare-panel", "style"), Output("compare-open", "children"),
        Output("compare-pick", "options"), Output("compare-table", "data"),
        Output("compare-figure", "figure"), Output("compare-figure", "style"),
        Output("compare-note", "children"),
        Input("compare-open", "n_clicks"), Input("st-plan", "data"), Input("st-graph", "data"),
        Input("st-settings", "data"), Input("compare-pick", "value"),
        Input("st-compare-plans", "data"), prevent_initial_call=True,
    )
    def _compare(n: Any, plan: Any, graph: Any, settings: Any, pick: Any, kept: Any
                 ) -> tuple[Any, ...]:
        if not n or n % 2 == 0:  # closed: nothing is computed
            return {"display": "none"}, "compare plans ▸", *([no_update] * 5)
        shown = ({}, "compare plans ▾")
        fp = str((graph or {}).get("fingerprint", ""))
        opts = compare_panel.options(kept, fp)
        other = next((e for e in kept or [] if e.get("id") == pick and e.get("fp") == fp), None)
        try:
            rows, fig = compare_panel.comparison(state, graph, settings, plan, other)
        except (LmsError, ServerBusy) as e:
            return (*shown, opts, [], no_update, no_update, f"cannot compare: {e}")
        except Exception as e:  # noqa: BLE001 - a bug must not leave the page without an answer
            return (*shown, opts, [], no_update, no_update, internal_error("compare", e))
        note = ("Pick a plan this tab saved or loaded to compare it too." if other is None
                else "")
        return (*shown, opts, rows, fig, {}, note)

    @app.callback(
        Output("batch-figure", "figure"), Output("batch-figure", "style"),
        Output("batch-note", "children"),
        Input("st-batch", "data"), Input("compare-open", "n_clicks"), Input("st-graph", "data"),
        Input("st-settings", "data"), Input("st-plan", "data"), prevent_initial_call=True,
    )
    def _batch_view(result: Any, n: Any, graph: Any, settings: Any, plan: Any
                    ) -> tuple[Any, ...]:
        if not n or n % 2 == 0:
            return no_update, no_update, no_update
        try:
            fig, note = compare_panel.batch_view(state, graph, settings, plan, result)
        except Exception as e:  # noqa: BLE001 - a bug must not leave the page without an answer
            return no_update, {"display": "none"}, internal_error("batch plot", e)
        if fig is None:
            return no_update, {"display": "none"}, note
        return fig, {}, note

    @app.callback(
        Output("studio", "figure", allow_duplicate=True),
        Output("window-note", "children", allow_duplicate=True),
        Input("st-plan", "data"), State("studio", "relayoutData"), State("st-graph", "data"),
        State("st-settings", "data"), prevent_initial_call=True,
    )
    def _window_after_edit(plan: Any, relayout: Any, graph: Any, settings: Any
                           ) -> tuple[Any, Any]:
        # a zoomed window draws the plan's swap and recompute ops: draw it again
        session = {"graph": graph, "settings": settings, "plan": plan}
        try:
            patch, note, _ = rendering.zoom(state, session, relayout, None, None)
        except Exception:  # noqa: BLE001 - the next zoom draws it; the render says the rest
            return no_update, no_update
        return patch, note

    def sweep(progress: Callable[[float, str], None], graph: Any, settings: Any, plan: Any
              ) -> dict[str, Any]:
        try:
            return compare_panel.run_sweep(state, graph, settings, plan, progress)
        except Exception as e:  # noqa: BLE001 - a failing job must not leave the UI stuck
            return {"error": f"the batch sweep failed: {type(e).__name__}: {e}"}

    if getattr(app, "_background_manager", None) is None:
        @app.callback(Output("st-batch", "data"), Input("batch-run", "n_clicks"),
                      State("st-graph", "data"), State("st-settings", "data"),
                      State("st-plan", "data"), prevent_initial_call=True)
        def _batch_inline(_n: Any, graph: Any, settings: Any, plan: Any) -> dict[str, Any]:
            return sweep(lambda f, m: None, graph, settings, plan)

        return

    @app.callback(
        Output("st-batch", "data"),
        Input("batch-run", "n_clicks"), State("st-graph", "data"), State("st-settings", "data"),
        State("st-plan", "data"), background=True,
        running=[
            (Output("batch-run", "disabled"), True, False),
            (Output("batch-cancel", "disabled"), False, True),
            (Output("batch-progress", "style"), {"visibility": "visible"},
             {"visibility": "hidden"}),
        ],
        progress=[Output("batch-progress", "value"), Output("batch-status", "children")],
        progress_default=[0, ""], cancel=[Input("batch-cancel", "n_clicks")], interval=400,
        prevent_initial_call=True,
    )
    def _batch(set_progress: Callable[[Any], None], _n: Any, graph: Any, settings: Any,
               plan: Any) -> dict[str, Any]:
        set_progress((0, "starting…"))
        return sweep(lambda f, m: set_progress((round(100 * f), m)), graph, settings, plan)


def internal_error(action: str, exc: BaseException) -> str:
    """Log an unexpected exception with its traceback; return the one line the page shows.

    Parameters
    ----------
    action : str
        What failed (the component that fired, "drawing", "export").
    exc : BaseException

    Returns
    -------
    str
    """
    _log.error("internal error in %s", action, exc_info=exc)
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return (f"internal error in {action}: {type(exc).__name__}{': ' + first if first else ''}"
            " (the server keeps running; the traceback is in its log)")


#: The message areas: above the views (graph, batch, knobs, plan files, tuner) and next
#: to the table and the swap editor (edits of the plan, clicks on the views).
MESSAGES = ("message", "edit-message")
#: Actions answered next to the table and the swap editor.
EDIT_ACTIONS = frozenset({"hotspots", "st-click", "edit-trigger", "edit-swap-op",
                          "edit-recompute-op", "edit-sync",
                          "edit-regroup", "edit-onegroup", "undo", "redo"})


def message_outputs(up: Update, trigger: str | None) -> list[Any]:
    """Text and class of both message areas: the answer goes next to where the user acted.

    The other area is cleared with it, so that no earlier refusal stays on screen.

    >>> message_outputs(Update(message="no", error=True), "hotspots")
    ['', 'message', 'no', 'message error']
    >>> message_outputs(Update(), "batch") == [no_update] * 4
    True
    """
    if up.message is None:
        return [no_update] * 4
    cls = "message error" if up.error else ("message ok" if up.message else "message")
    here = 1 if trigger in EDIT_ACTIONS else 0
    out: list[Any] = []
    for k in range(len(MESSAGES)):
        out += [up.message, cls] if k == here else ["", "message"]
    return out


#: What :func:`lmscore`'s rendering of a session fills, in the render callback's order.
RENDERED = (("studio", "figure"), ("ordering-note", "children"), ("summary", "children"),
            ("hotspots", "data"), ("hotspots", "style_data_conditional"),
            ("hotspot-caption", "children"), ("swap-editor", "children"),
            ("edit-group", "options"), ("recompute-list", "children"), ("st-rendered", "data"))


def _render_now(state: AppContext, up: Update, session: dict[str, Any], rendered: Any
                ) -> tuple[Any, ...]:
    """The views of the state an edit makes, drawn in the edit's own answer.

    Without it the browser waits for a second request (the render callback, triggered by
    the stores the edit changed); that one then finds the state drawn and does nothing.
    Anything unusual (a refusal, a new graph, a message of the rendering) is left to it.
    """
    skip = (no_update,) * len(RENDERED)
    changed = [k for k in ("graph", "settings", "plan", "view") if getattr(up, k) is not None]
    if up.error or not changed or up.graph is not None:
        return skip
    new = {k: getattr(up, k) if getattr(up, k) is not None else session[k]
           for k in ("graph", "settings", "plan", "view")}
    try:
        r = rendering.render(state, new, full=rendering.needs_full_figure(rendered, new),
                             data=changed != ["view"])
    except Exception:  # noqa: BLE001 - the render callback answers for it, message and all
        return skip
    if r.message:
        return skip
    return (r.figure, r.note, r.summary, r.rows, r.row_styles, r.caption, r.editor,
            r.groups, r.recomputes, r.rendered)


def _outputs(up: Update, session: dict[str, Any], trigger: str | None = None
             ) -> tuple[Any, ...]:
    """The control callback's outputs for an update."""
    stores = [
        up.graph if up.graph is not None else no_update,
        up.settings if up.settings is not None else no_update,
        up.plan if up.plan is not None else no_update,
        up.view if up.view is not None else no_update,
        up.history if up.history is not None else no_update,
    ]
    graph = up.graph or session["graph"]
    settings = up.settings or session["settings"]
    if up.controls:
        options, value = rendering.picker(graph)
        controls = [options, value, *rendering.controls_values(settings)]
    else:
        controls = [no_update] * (2 + len(rendering.CONTROLS))
    # another graph clears "find": the same name typed again is a new search there
    find = "" if up.graph is not None else no_update
    return (*stores, *message_outputs(up, trigger), *controls, None, [], find)
