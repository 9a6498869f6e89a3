"""The web app: :func:`create_app` (the composition root) and :func:`run`.

``python -m lmsviz [FILE] [--batch-size N] [--port P]`` serves it on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import pathlib
import shutil
import sys
from collections.abc import Sequence
from typing import Any

import dash
import flask
from werkzeug.exceptions import BadRequest, HTTPException

from . import callbacks, layout, rendering, state

DEFAULT_UPLOAD_CAP = 512 * 2**20


def assets_dir() -> pathlib.Path:
    """The Dash assets: ``lmscore/data/assets`` when installed, else the checkout's ``assets/``."""
    import lmscore

    here = pathlib.Path(lmscore.__file__).resolve().parent
    installed = here / "data" / "assets"
    if installed.is_dir():
        return installed
    return here.parent / "assets"


def _background_manager(jobs_dir: pathlib.Path) -> Any | None:
    """Dash's disk-cache job manager, or None when its packages are missing."""
    try:
        import diskcache

        manager = dash.DiskcacheManager(diskcache.Cache(str(jobs_dir)))
    except ImportError:
        return None
    atexit.register(shutil.rmtree, jobs_dir, ignore_errors=True)
    return manager


def create_app(
    initial_graph: str | None = None,
    batch_size: int | None = None,
    *,
    upload_cap_bytes: int = DEFAULT_UPLOAD_CAP,
    data_dir: str | os.PathLike[str] | None = None,
    max_jobs: int = state.DEFAULT_MAX_JOBS,
    job_wait: float = state.DEFAULT_JOB_WAIT,
    max_ops: int = state.DEFAULT_SERVER_MAX_OPS,
    freeze_results: bool = False,
) -> dash.Dash:
    """Build the Dash app with ``initial_graph`` loaded.

    Parameters
    ----------
    initial_graph : str, optional
        A GraphDef, SavedModel (directory or zip) or a bundled sample's name; default the
        ResNet-50 sample.
    batch_size : int, optional
        Default: the sample's batch size, else 1.
    upload_cap_bytes : int
        Largest graph or plan file accepted from the browser.
    data_dir : path-like, optional
        Where plans and uploaded graphs are kept (default ``~/.local/share/lms``).
    max_jobs : int
        Heavy computations (loading, simulating, tuning, exporting) run at once; further
        requests wait for a slot.
    job_wait : float
        Seconds a request waits for a slot before it is refused as "server busy".
    max_ops : int
        Largest graph loaded, in ops; the graph and result caches hold twice that at most.
    freeze_results : bool
        Keep cached results out of the garbage collector's walks
        (:func:`lmsviz.state.settle_heap`; process-wide, so :func:`run` sets it).

    Returns
    -------
    dash.Dash

    Raises
    ------
    lmscore.LmsError
        If the initial graph cannot be loaded.
    """
    ctx = state.new_context(initial_graph, batch_size, upload_cap_bytes=upload_cap_bytes,
                            data_dir=data_dir, max_jobs=max_jobs, job_wait=job_wait,
                            max_ops=max_ops, freeze_results=freeze_results)
    app = dash.Dash(
        __name__, title="lms studio", update_title=None, assets_folder=str(assets_dir()),
        background_callback_manager=_background_manager(ctx.jobs_dir),
    )
    # base64 inflates uploads by 4/3; the browser refuses anything over the cap first
    app.server.config["MAX_CONTENT_LENGTH"] = upload_cap_bytes * 4 // 3 + 16 * 2**20

    def page() -> Any:
        session = state.new_session(ctx)
        return layout.build(ctx, session, rendering.render(ctx, session),
                            rendering.picker(session["graph"]))

    # Dash checks callbacks against a validation layout, which it sends inside every
    # page's HTML: unset, it would be a whole page with its figure (1.8 MB on ResNet-50,
    # twice the data of a first paint). The components are what it needs, not their data.
    session = state.new_session(ctx)
    app.validation_layout = layout.build(ctx, session, rendering.skeleton(),
                                         rendering.picker(session["graph"]))
    app.layout = page
    callbacks.register(app, ctx)
    app.server.register_error_handler(Exception, _request_error)
    return app


def _request_error(exc: Exception) -> Any:
    """A request the app cannot make sense of: one log line and a 400, not a traceback.

    Callbacks catch their own errors (:func:`lmsviz.callbacks.internal_error`); what
    reaches this handler is a malformed request to Dash's callback endpoint (not JSON, no
    such callback, the wrong shape). Anything else keeps Flask's 500 and its traceback.
    """
    if isinstance(exc, HTTPException):
        return exc
    if flask.request.path.endswith("/_dash-update-component"):
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        logging.getLogger("lmsviz").warning("malformed callback request refused (%s)", why)
        return BadRequest(f"malformed callback request ({why})")
    raise exc


def run(host: str = "127.0.0.1", port: int = 8050, debug: bool = False, **kwargs: Any) -> None:
    """Serve the app (blocking).

    Parameters
    ----------
    host : str
        Interface to bind; only this machine by default.
    port : int
    debug : bool
        Dash debug mode (reloader, dev tools); off unless asked for.
    **kwargs
        Passed to :func:`create_app`.
    """
    app = create_app(**{"freeze_results": True, **kwargs})
    print(f"lms studio on http://{host}:{port}/ (Ctrl-C to stop)", flush=True)
    app.run(host=host, port=port, debug=debug, dev_tools_ui=debug, use_reloader=False)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lmsviz``: parse the command line and serve."""
    from lmscore.cli import allow_negative_values, quiet_tensorflow
    from lmscore.errors import LmsError
    from lmscore.units import SIZE_SYNTAX, parse_bytes

    p = allow_negative_values(argparse.ArgumentParser(prog="lms serve",
                                                      description="the lms web app"))
    p.add_argument("file", nargs="?", default=None,
                   help="GraphDef, SavedModel or sample name (default: resnet50)")
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="batch size of the first graph (default: the sample's, else 1)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1)")
    p.add_argument("--port", type=int, default=8050, help="port to serve on (8050)")
    p.add_argument("--debug", action="store_true", help="Dash debug mode")
    p.add_argument("--upload-cap", default="512MiB", metavar="SIZE",
                   help=f"largest graph or plan uploaded: {SIZE_SYNTAX} (512MiB)")
    p.add_argument("--data-dir", default=None, help="plans and uploads (~/.local/share/lms)")
    p.add_argument("--max-jobs", type=int, default=state.DEFAULT_MAX_JOBS,
                   help=f"heavy computations at once ({state.DEFAULT_MAX_JOBS})")
    p.add_argument("--job-wait", type=float, default=state.DEFAULT_JOB_WAIT,
                   help=f"seconds a request waits for a free slot ({state.DEFAULT_JOB_WAIT:g})")
    p.add_argument("--max-ops", type=int, default=state.DEFAULT_SERVER_MAX_OPS,
                   help=f"largest graph loaded, in ops ({state.DEFAULT_SERVER_MAX_OPS:,})")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show TensorFlow's log lines and warnings (hidden otherwise)")
    args = p.parse_args(argv)
    quiet_tensorflow(args.verbose)
    if not 0 < args.port < 65536:
        p.error(f"argument --port: must be 1 to 65535, got {args.port}")
    logging.basicConfig(level=logging.INFO,
                        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
    try:
        run(host=args.host, port=args.port, debug=args.debug, initial_graph=args.file,
            batch_size=args.batch_size,
            upload_cap_bytes=parse_bytes(args.upload_cap, "--upload-cap"),
            data_dir=args.data_dir, max_jobs=args.max_jobs, job_wait=args.job_wait,
            max_ops=args.max_ops)
    except LmsError as e:
        print(f"lms: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
