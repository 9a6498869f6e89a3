"""Server-side state of the web app, and the shape of the per-session state.

Per-session state lives in the browser (``dcc.Store``, one per concern, see
:func:`new_session`); the server keeps only an :class:`AppContext`, made by
:func:`lmsviz.app.create_app` (never at module level):

- a bounded, content-addressed cache of loaded graphs (:class:`BoundedCache`, keyed by the
  SHA-256 of the file) and of results derived from them (orderings, simulations, keyed by
  graph hash, batch size and plan hash). Entries are immutable; two sessions showing the
  same graph share its entry, and nothing else.
- the user data directory: each tab's plans, saved per graph fingerprint
  (``plans/<tab>/<fp>.json``, written atomically on every edit so work survives a server
  restart), the texts of the plans its undo history names (``plans/<tab>/history/``; the
  tab holds only their digests), and the uploaded graphs (``uploads/<sha256><suffix>``, the
  last :data:`KEEP_UPLOADS`), so that a page reloaded after a restart finds its graph
  again. A tab's folder is deleted at a start :data:`KEEP_TAB_DAYS` after its last edit.

Uploaded files are only ever parsed as protobufs (or, for a zip, as a SavedModel by
:func:`lmscore.load`); nothing uploaded is executed or unpickled.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import importlib
import logging
import os
import pathlib
import re
import secrets
import shutil
import tempfile
import threading
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import lmscore
from lmscore import samples
from lmscore.errors import ConfigError, GraphError, LmsError
from lmscore.ir import Graph
from lmscore.plan import Plan, check_plan, fingerprint, plan_from_json, write_atomic
from lmscore.units import format_bytes

T = TypeVar("T")

#: Suffixes accepted for uploaded graphs.
GRAPH_SUFFIXES = (".pb", ".pbtxt", ".txt", ".prototxt", ".graphdef", ".zip")
_TEXT_SUFFIXES = (".pbtxt", ".txt", ".prototxt")
#: Uploaded graphs kept in the data directory for reloads after a restart.
KEEP_UPLOADS = 8
#: A tab's saved plans are deleted when the server starts this long after the tab's last
#: edit (a closed tab's id is gone with its session storage: nothing can reach them).
KEEP_TAB_DAYS = 30
#: A zipped SavedModel may not unpack to more than this many times the upload cap.
ZIP_EXPANSION = 4
DEFAULT_SAMPLE = "resnet50"
DEFAULT_BUDGET = "16GiB"
DEFAULT_KNOBS = {"threshold": 5, "ahead": 1, "groupby": 5, "sync_mode": 0}
_HEX = re.compile(r"^[0-9a-f]{64}$")
_TAB = re.compile(r"[0-9a-f]{32}")


#: Heavy computations (parsing, simulating, rewriting, tuning) the server runs at once.
DEFAULT_MAX_JOBS = 2
#: Largest graph the server loads (ops); a 1M-op graph takes ~2.5 GB while analysed.
DEFAULT_SERVER_MAX_OPS = 1_000_000
#: How long a heavy request waits for a free slot before it is refused.
DEFAULT_JOB_WAIT = 60.0


#: Set (to anything) to log each callback's stages and their milliseconds (one line each,
#: logger ``lmsviz.timing``); ``bench/bench_ui.py`` reads them from the server's log.
TIMING_ENV = "LMS_TIMING"
_timing_log = logging.getLogger("lmsviz.timing")
_stages = threading.local()


@contextlib.contextmanager
def timed(callback: str) -> Iterator[None]:
    """Time one callback and the :func:`stage` blocks it runs; log them if asked.

    Off (nothing recorded) unless the environment sets :data:`TIMING_ENV`.

    Parameters
    ----------
    callback : str
        Names the log line (``"control"``, ``"render"``).
    """
    if not os.environ.get(TIMING_ENV) or getattr(_stages, "rec", None) is not None:
        yield
        return
    rec: list[tuple[str, float]] = []
    _stages.rec = rec
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _stages.rec = None
        total = 1000 * (time.perf_counter() - t0)
        _timing_log.info("timing %s %.1f ms: %s", callback, total,
                         ", ".join(f"{name} {ms:.1f}" for name, ms in rec))


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Time a block of the callback :func:`timed` is timing (nothing when it is not)."""
    rec = getattr(_stages, "rec", None)
    if rec is None:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        rec.append((name, 1000 * (time.perf_counter() - t0)))


class ServerBusy(LmsError):
    """Every slot for heavy work stayed taken for longer than the wait allowed."""


class WorkSlots:
    """At most ``n`` heavy computations at once, across threads and processes.

    A slot is an exclusive ``flock`` on one of ``n`` files in ``directory``: the tuner's
    background jobs run in child processes and must share the bound with the request
    threads, and the kernel drops the lock of a job that dies, so a killed job never keeps
    a slot. A thread that holds a slot may nest further heavy calls without a second one.
    """

    def __init__(self, directory: pathlib.Path, n: int, wait_seconds: float) -> None:
        if n < 1:
            raise ConfigError(f"the number of concurrent jobs must be positive, got {n}")
        if not 0 <= wait_seconds <= 86400:  # NaN fails too: it would wait forever
            raise ConfigError(f"the wait for a job slot must be 0 to 86400 s, got {wait_seconds}")
        self.paths = [directory / f"slot-{k}.lock" for k in range(n)]
        self.wait_seconds = wait_seconds
        self._held = threading.local()
        self._fds: set[int] = set()  # descriptors holding a slot, in any thread
        # A forked child (a tuner job) holds no slot, whatever its parent's threads held:
        # its copies of their descriptors would keep their locks until it exits.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._held = threading.local()
        for fd in list(self._fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = set()

    @contextlib.contextmanager
    def slot(self, what: str = "this request") -> Iterator[None]:
        """Hold a slot while the block runs.

        Raises
        ------
        ServerBusy
            If no slot frees up within ``wait_seconds``.
        """
        if getattr(self._held, "depth", 0):
            self._held.depth += 1
            try:
                yield
            finally:
                self._held.depth -= 1
            return
        fd = self._acquire(what)
        self._fds.add(fd)
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            self._fds.discard(fd)
            os.close(fd)  # closing the descriptor releases its lock

    def _acquire(self, what: str) -> int:
        deadline = time.monotonic() + self.wait_seconds
        delay = 0.005
        while True:
            for path in self.paths:
                fd = self._try_lock(path)
                if fd is not None:
                    return fd
            if time.monotonic() >= deadline:
                raise ServerBusy(f"the server is busy ({len(self.paths)} heavy jobs running); "
                                 f"{what} waited {self.wait_seconds:g} s: try again")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    @staticmethod
    def _try_lock(path: pathlib.Path) -> int | None:
        """A descriptor holding ``path``'s lock, or None if someone else holds it."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def busy(self) -> int:
        """How many slots are taken right now (by any thread or process)."""
        taken = 0
        for path in self.paths:
            fd = self._try_lock(path)
            if fd is None:
                taken += 1
            else:
                os.close(fd)
        return taken


#: A full garbage collection runs once this many times the cached weight has been evicted
#: since the last one (:func:`settle_heap`).
COLLECT_AFTER_EVICTED = 4


def settle_heap(ctx: AppContext) -> None:
    """Keep what the caches hold out of the cyclic garbage collector's way.

    A full collection walks every object the collector tracks. With the ResNet-50 sample
    and its simulations cached (about 200k objects) one took 100-130 ms, and it ran inside
    most edit requests (a knob change's answer took 155 ms without one, 250-330 ms with
    one). Results are kept for many requests, so after each is stored everything alive is
    frozen (:func:`gc.freeze`, constant time): collections then walk only what the
    current requests made. Evicted entries are freed by reference counting; the few
    cycles among them (100 objects after 20 knob changes), and those of what another
    request held when the heap was frozen (a plotly figure is one), wait for a full
    collection once :data:`COLLECT_AFTER_EVICTED` times the cached weight has been evicted.
    """
    if not ctx.freeze_results:
        return
    evicted = ctx.results.evicted + ctx.graphs.evicted
    live = ctx.results.weight + ctx.graphs.weight
    if evicted - ctx.evicted_at_collection > COLLECT_AFTER_EVICTED * max(live, 1):
        ctx.evicted_at_collection = evicted
        gc.unfreeze()
        gc.collect()
    gc.freeze()


def default_data_dir() -> pathlib.Path:
    """``$XDG_DATA_HOME/lms`` (``~/.local/share/lms``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return pathlib.Path(base) / "lms"


class BoundedCache:
    """A least-recently-used mapping bounded in entries and in total weight.

    The weight of an entry is what the caller says it costs (the server uses op counts,
    which memory follows); the newest entry is always kept, whatever its weight. Values
    must be treated as read-only by callers: they are shared by every session that asks
    for the same key.
    """

    def __init__(self, maxsize: int, max_weight: int | None = None) -> None:
        self.maxsize = maxsize
        self.max_weight = max_weight
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._weight = 0
        #: Total weight ever evicted (:func:`settle_heap` reads it).
        self.evicted = 0
        self._lock = threading.Lock()
        # a background job forks the server; a lock held by another thread at that moment
        # would stay held forever in the child
        os.register_at_fork(after_in_child=self._reset_lock)

    def _reset_lock(self) -> None:
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        """The value for ``key`` (marked as recently used), or None."""
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key][0]

    def put(self, key: Hashable, value: Any, weight: int = 1) -> None:
        """Store ``value``, evicting the least recently used entries beyond the bounds."""
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._data[key] = (value, weight)
            self._weight += weight
            while len(self._data) > 1 and (
                    len(self._data) > self.maxsize
                    or (self.max_weight is not None and self._weight > self.max_weight)):
                _, (_, w) = self._data.popitem(last=False)
                self._weight -= w
                self.evicted += w

    def get_or_compute(self, key: Hashable, compute: Callable[[], T], weight: int = 1) -> T:
        """The cached value, or ``compute()`` stored under ``key``."""
        value = self.get(key)
        if value is None:
            value = compute()
            self.put(key, value, weight)
        return value

    @property
    def weight(self) -> int:
        """Total weight of the entries."""
        return self._weight

    def __len__(self) -> int:
        return len(self._data)


@dataclass(frozen=True)
class LoadedGraph:
    """A graph in the cache.

    Attributes
    ----------
    key : str
        SHA-256 of the file's bytes.
    name : str
        File name shown to the user.
    origin : str
        Where to load it from again: ``"sample:<name>"``, ``"file"`` (the graph given on
        the command line) or ``"upload"`` (the data directory).
    graph : Graph
    default_batch : int or None
        The sample's batch size, if it is a sample.
    """

    key: str
    name: str
    origin: str
    graph: Graph = field(repr=False)
    default_batch: int | None = None

    @property
    def fingerprint(self) -> str:
        """Plan fingerprint of the graph (:func:`lmscore.plan.fingerprint`)."""
        return fingerprint(self.graph)

    @property
    def fixed_batch(self) -> int | None:
        """The batch size every feed of the graph fixes, or None when it is unknown."""
        from lmscore.ir import fixed_batch

        return fixed_batch(self.graph)

    def ref(self) -> dict[str, Any]:
        """The session's reference to this graph (what ``st-graph`` holds)."""
        ordering = lmscore.order(self.graph)
        return {
            "key": self.key, "name": self.name, "origin": self.origin,
            "fingerprint": self.fingerprint, "ops": len(self.graph.ops),
            "levels": ordering.num_levels, "fixed_batch": self.fixed_batch,
        }


@dataclass
class AppContext:
    """What the server keeps: caches, limits and directories (one per app).

    Attributes
    ----------
    data_dir : pathlib.Path
        Root of ``plans/`` and ``uploads/``.
    upload_cap_bytes : int
    initial : LoadedGraph
        The graph a new session starts with.
    initial_batch : int
    initial_file : pathlib.Path or None
        The graph file given on the command line, if any (the only path, besides the
        samples and the data directory, the server reads graphs from).
    graphs : BoundedCache
        Loaded graphs by content hash.
    results : BoundedCache
        Derived results (sizes, simulations, rewrites) by (hash, batch, ...) keys.
    max_points : int
        Ordering-view points above which the view aggregates.
    jobs_dir : pathlib.Path
        Directory of the background-job cache and of the work slots' lock files.
    max_ops : int
        Largest graph (in ops) the server loads.
    slots : WorkSlots
        The bound on concurrent heavy work.
    """

    data_dir: pathlib.Path
    upload_cap_bytes: int
    initial: LoadedGraph
    initial_batch: int
    initial_file: pathlib.Path | None
    graphs: BoundedCache
    results: BoundedCache
    max_points: int
    jobs_dir: pathlib.Path
    slots: WorkSlots
    max_ops: int
    #: Freeze what the caches hold after each new result (:func:`settle_heap`); the
    #: server's choice, since freezing is process-wide.
    freeze_results: bool = False
    #: Weight evicted from the caches at the last full garbage collection (settle_heap).
    evicted_at_collection: int = field(default=0, repr=False)

    def compute(self, key: Hashable, fn: Callable[[], T], what: str, weight: int = 1) -> T:
        """A cached result, or ``fn()`` run in a work slot and cached under ``key``.

        Raises
        ------
        ServerBusy
            If no work slot frees up in time.
        """
        hit = self.results.get(key)
        if hit is not None:
            return hit
        with self.slots.slot(what):
            value = self.results.get_or_compute(key, fn, weight)
        settle_heap(self)
        return value

    # --- graphs -------------------------------------------------------------------------

    def resolve(self, ref: dict[str, Any]) -> LoadedGraph:
        """The graph a session refers to: from the cache, else loaded again from its origin.

        Raises
        ------
        GraphError
            If the reference is malformed or its graph is no longer available.
        """
        key = str(ref.get("key", ""))
        hit = self.graphs.get(key)
        if hit is not None:
            return hit
        origin = str(ref.get("origin", ""))
        name = str(ref.get("name", "graph"))
        if origin.startswith("sample:"):
            return load_sample(self, origin.removeprefix("sample:"))
        if origin == "file" and self.initial_file is not None:
            return load_file(self, self.initial_file)
        if origin == "upload" and _HEX.match(key):
            for p in sorted(self.uploads_dir.glob(f"{key}.*")):
                return _cache_graph(self, p.read_bytes(), name, "upload", None)
        raise GraphError(f"{name}: this graph is no longer on the server; upload it again")

    @property
    def uploads_dir(self) -> pathlib.Path:
        """Where uploaded graphs are kept."""
        return self.data_dir / "uploads"

    @property
    def plans_dir(self) -> pathlib.Path:
        """Where plans are saved, one per graph fingerprint."""
        return self.data_dir / "plans"

    # --- plans --------------------------------------------------------------------------

    def save_plan(self, tab: str, fp: str, plan_json: str | None) -> None:
        """Write tab ``tab``'s plan for graph ``fp`` (atomically); errors are ignored.

        Plans are kept per tab (``plans/<tab>/<fp>.json``): another tab, or another user of
        a server started with ``--host``, never sees them.
        """
        if not (valid_tab(tab) and re.fullmatch(r"[0-9a-f]{16}", fp)):
            return
        try:
            folder = self.plans_dir / tab
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(folder / f"{fp}.json", plan_json or "")
        except (OSError, ConfigError):
            pass  # a read-only home must not break editing

    def saved_plan(self, tab: str, loaded: LoadedGraph) -> Plan | None:
        """The plan tab ``tab`` last saved for this graph, if it still fits it."""
        if not valid_tab(tab):
            return None
        p = self.plans_dir / tab / f"{loaded.fingerprint}.json"
        try:
            text = p.read_text()
            if not text:
                return None  # the tab emptied its plan
            plan = plan_from_json(text, str(p))
            check_plan(loaded.graph, plan)
        except (OSError, UnicodeDecodeError, LmsError):
            return None
        return plan

    # --- the tabs' undo history: plan texts on the server, their digests in the tab ------

    def keep_version(self, tab: str, digest: str, plan_json: str) -> bool:
        """Keep a plan's text for tab ``tab``'s undo history (``plans/<tab>/history/``).

        The tab's history store then holds the digest alone, so an edit's request and
        answer do not carry every earlier plan (30 knob plans of ResNet-50 are 2 MB).

        Returns
        -------
        bool
            Whether it is kept (False on a read-only data directory: the caller keeps the
            text in the history itself).
        """
        if not (valid_tab(tab) and _HEX.match(digest)):
            return False
        try:
            folder = self.plans_dir / tab / "history"
            target = folder / f"{digest}.json"
            if not target.exists():
                folder.mkdir(parents=True, exist_ok=True)
                write_atomic(target, plan_json)
        except (OSError, ConfigError):
            return False
        return True

    def version(self, tab: str, digest: str) -> str | None:
        """The text :meth:`keep_version` kept, or None when it is gone."""
        if not (valid_tab(tab) and isinstance(digest, str) and _HEX.match(digest)):
            return None
        try:
            return (self.plans_dir / tab / "history" / f"{digest}.json").read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def fork_tab(self, old: str, new: str) -> bool:
        """Give tab ``new`` a copy of tab ``old``'s plans and undo texts.

        A browser's "duplicate tab" copies the tab's session storage, its id included; the
        page then takes a new id (:data:`TAB_CLAIM_JS`) and asks for this copy, so the
        duplicate starts where the original was and each edits only its own folder.

        Returns
        -------
        bool
            Whether the copy was made (False for ids that are not tab ids, the same id
            twice, or a data directory that cannot be written: the duplicate then starts
            without the undo texts).
        """
        if not (valid_tab(old) and valid_tab(new)) or old == new:
            return False
        source, target = self.plans_dir / old, self.plans_dir / new
        try:
            if source.is_dir() and not target.exists():
                shutil.copytree(source, target)
        except OSError:
            return False
        return True

    def forget_versions(self, tab: str, digests: set[str]) -> None:
        """Delete the tab's kept plan texts of ``digests`` (its history dropped them)."""
        if not valid_tab(tab):
            return
        folder = self.plans_dir / tab / "history"
        for digest in digests:
            if _HEX.match(digest):
                with contextlib.suppress(OSError):
                    (folder / f"{digest}.json").unlink(missing_ok=True)


def valid_tab(tab: Any) -> bool:
    """Whether ``tab`` is a tab id as :func:`new_tab_id` makes them (safe as a file name).

    >>> valid_tab(new_tab_id()), valid_tab("../etc"), valid_tab(None)
    (True, False, False)
    """
    return isinstance(tab, str) and _TAB.fullmatch(tab) is not None


def new_tab_id() -> str:
    """A random id for a new browser tab (kept in its session storage)."""
    return secrets.token_hex(16)


#: The page's claim on its tab id, run when the id is read from session storage. A
#: duplicated tab has the original's session storage, id included: the page asks the
#: app's other tabs of this browser (a ``BroadcastChannel``: in the browser, this origin
#: only) whether one holds the id; if one answers within 250 ms, it makes itself a new id
#: (32 random hex digits, as :func:`new_tab_id`; the server checks it with
#: :func:`valid_tab`) and answers it, with ``{"from": old, "to": new}`` for the server to
#: copy the old tab's plans (:meth:`AppContext.fork_tab`). Without ``BroadcastChannel``
#: nothing changes.
TAB_CLAIM_JS = """
function(tab) {
    const none = [window.dash_clientside.no_update, window.dash_clientside.no_update];
    if (typeof tab !== "string" || typeof BroadcastChannel === "undefined") { return none; }
    let s = window.lmsTabs;
    if (!s) {
        s = window.lmsTabs = {held: new Set(), asking: {}, chan: new BroadcastChannel("lms-tabs")};
        s.chan.onmessage = function(e) {
            const m = e.data || {};
            if (m.ask && (s.held.has(m.ask) || s.asking[m.ask])) {
                s.chan.postMessage({taken: m.ask, nonce: m.nonce});
            } else if (m.taken && s.asking[m.taken] === m.nonce) {
                s.asking[m.taken] = "taken";
            }
        };
    }
    if (s.held.has(tab) || s.asking[tab]) { return none; }
    const nonce = Math.random().toString(36).slice(2);
    s.asking[tab] = nonce;
    s.chan.postMessage({ask: tab, nonce: nonce});
    return new Promise(function(resolve) {
        setTimeout(function() {
            const taken = s.asking[tab] === "taken";
            delete s.asking[tab];
            if (!taken) { s.held.add(tab); resolve(none); return; }
            const bytes = new Uint8Array(16);
            window.crypto.getRandomValues(bytes);
            const fresh = Array.from(bytes, function(b) {
                return b.toString(16).padStart(2, "0"); }).join("");
            s.held.add(fresh);
            resolve([fresh, {from: tab, to: fresh}]);
        }, 250);
    });
}
"""


def new_context(
    initial_graph: str | None,
    batch_size: int | None,
    *,
    upload_cap_bytes: int,
    data_dir: str | os.PathLike[str] | None,
    max_graphs: int = 4,
    max_results: int = 16,
    max_points: int = 20_000,
    max_jobs: int = DEFAULT_MAX_JOBS,
    job_wait: float = DEFAULT_JOB_WAIT,
    max_ops: int = DEFAULT_SERVER_MAX_OPS,
    freeze_results: bool = False,
) -> AppContext:
    """Make the server state and load the initial graph.

    Parameters
    ----------
    initial_graph : str, optional
        A graph file or a bundled sample's name (default: :data:`DEFAULT_SAMPLE`).
    batch_size : int, optional
        Default: the sample's batch size, else 1.
    upload_cap_bytes : int
    data_dir : path-like, optional
        Default: :func:`default_data_dir`.
    max_graphs, max_results : int
        Bounds of the graph and result caches.
    max_points : int
        Ordering-view points above which the view aggregates.
    max_jobs : int
        Heavy computations run at once (:class:`WorkSlots`).
    job_wait : float
        Seconds a heavy request waits for a slot before it is refused.
    max_ops : int
        Largest graph accepted (ops); the caches hold at most twice that many ops each.
    freeze_results : bool
        Keep cached results out of the garbage collector's walks (:func:`settle_heap`).
        Process-wide: for a server, not for a library user's process.

    Raises
    ------
    LmsError
        If the initial graph cannot be loaded.
    """
    if upload_cap_bytes <= 0:
        raise ConfigError(f"upload cap must be positive, got {upload_cap_bytes}")
    if max_ops < 1:
        raise ConfigError(f"the op limit must be positive, got {max_ops}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch size must be positive, got {batch_size}")
    root = pathlib.Path(data_dir) if data_dir is not None else default_data_dir()
    jobs_dir = pathlib.Path(tempfile.mkdtemp(prefix="lms-jobs-"))
    ctx = AppContext(
        data_dir=root, upload_cap_bytes=upload_cap_bytes, initial=None,  # type: ignore[arg-type]
        initial_batch=1, initial_file=None, graphs=BoundedCache(max_graphs, 2 * max_ops),
        results=BoundedCache(max_results, 2 * max_ops), max_points=max_points, max_ops=max_ops,
        jobs_dir=jobs_dir, slots=WorkSlots(jobs_dir, max_jobs, job_wait),
        freeze_results=freeze_results,
    )
    name = initial_graph or DEFAULT_SAMPLE
    if sample_entry(name) is not None and not pathlib.Path(name).exists():
        loaded = load_sample(ctx, name)
    else:
        path = samples.find(name)
        if sample_entry(path.name) is not None and path.parent == samples.sample_dir():
            loaded = load_sample(ctx, path.name)
        else:
            ctx.initial_file = path.resolve()
            loaded = load_file(ctx, path)
    ctx.initial = loaded
    ctx.initial_batch = batch_size or loaded.default_batch or 1
    prune_tabs(ctx.plans_dir)
    return ctx


def prune_tabs(plans_dir: pathlib.Path, max_age_days: float = KEEP_TAB_DAYS,
               now: float | None = None) -> list[str]:
    """Delete the plan folders of tabs not edited for ``max_age_days``; errors are ignored.

    Only folders named like a tab id (:func:`valid_tab`) are touched. A folder's age is
    that of its newest file.

    Returns
    -------
    list of str
        The tab ids whose folders were deleted.
    """
    cutoff = (time.time() if now is None else now) - max_age_days * 86400
    gone = []
    with contextlib.suppress(OSError):
        for folder in plans_dir.iterdir():
            if not (folder.is_dir() and not folder.is_symlink() and valid_tab(folder.name)):
                continue
            try:
                files = [p for p in folder.rglob("*") if p.is_file()]
                newest = max((p.stat().st_mtime for p in files),
                             default=folder.stat().st_mtime)
                if newest >= cutoff:
                    continue
                for p in files:
                    p.unlink(missing_ok=True)
                for d in sorted((d for d in folder.rglob("*") if d.is_dir()), reverse=True):
                    d.rmdir()
                folder.rmdir()
                gone.append(folder.name)
            except OSError:
                continue  # another server's files, or changed meanwhile: left alone
    return gone


# --- loading ----------------------------------------------------------------------------


def sample_entry(name: str) -> dict[str, Any] | None:
    """The ``samples.json`` entry called ``name`` (or whose file is ``name``)."""
    for s in samples.samples():
        if name in (s["name"], s["file"]):
            return s
    return None


def sample_options() -> list[dict[str, str]]:
    """Dropdown options of the bundled samples."""
    return [
        {"label": f"{s['name']}  ({s.get('nodes', '?')} ops)", "value": f"sample:{s['name']}"}
        for s in samples.samples()
        if (samples.sample_dir() / s["file"]).exists()
    ]


def load_sample(ctx: AppContext, name: str) -> LoadedGraph:
    """Load a bundled sample (through the cache).

    Raises
    ------
    GraphError
        If there is no such sample.
    """
    entry = sample_entry(name)
    if entry is None:
        raise GraphError(f"{name}: no such sample")
    path = samples.sample_dir() / entry["file"]
    data = _read(path)
    return _cache_graph(ctx, data, entry["file"], f"sample:{entry['name']}",
                        int(entry.get("batch_size", 1)))


def load_file(ctx: AppContext, path: pathlib.Path) -> LoadedGraph:
    """Load the graph named on the command line (a file, or a SavedModel directory)."""
    if path.is_dir():
        with ctx.slots.slot(f"loading {path.name}"):
            graph = lmscore.load(path, max_ops=ctx.max_ops)
            lmscore.order(graph)
        h = hashlib.sha256(graph.graphdef or repr(graph.ops).encode()).hexdigest()
        loaded = LoadedGraph(h, path.name, "file", graph, None)
        ctx.graphs.put(h, loaded, len(graph.ops))
        return loaded
    return _cache_graph(ctx, _read(path), path.name, "file", None)


def _read(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise GraphError(f"{path}: no such file or directory") from None
    except OSError as e:
        raise GraphError(f"{path}: cannot read ({e.strerror})") from None


def _cache_graph(
    ctx: AppContext, data: bytes, name: str, origin: str, default_batch: int | None,
    path_hint: pathlib.Path | None = None,
) -> LoadedGraph:
    key = hashlib.sha256(data).hexdigest()
    hit = ctx.graphs.get(key)
    if hit is not None:
        # same bytes, maybe under another name: share the graph, keep this session's label
        return LoadedGraph(key, name, origin, hit.graph, default_batch)
    with ctx.slots.slot(f"loading {name}"):
        graph = _parse(data, name, ctx.upload_cap_bytes, ctx.max_ops)
        lmscore.order(graph)  # refuses cycles now rather than at the first render
    loaded = LoadedGraph(key, name, origin, graph, default_batch)
    ctx.graphs.put(key, loaded, len(graph.ops))
    settle_heap(ctx)
    return loaded


def _parse(data: bytes, name: str, cap: int, max_ops: int) -> Graph:
    suffix = pathlib.Path(name).suffix.lower()
    if data[:4] == b"PK\x03\x04" or suffix == ".zip":
        return _load_zip(data, name, cap, max_ops)
    if suffix in _TEXT_SUFFIXES:
        return lmscore.from_graphdef_bytes(data, source=name, text=True, max_ops=max_ops)
    try:
        # binary by its suffix: a cut or damaged file is said to be that, not a text error
        return lmscore.from_graphdef_bytes(data, source=name, text=False, max_ops=max_ops)
    except GraphError as e:
        if "corrupt or truncated" not in str(e):
            raise  # it parsed, and something else is wrong with it
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise GraphError(f"{name}: not a GraphDef: the binary protobuf does not parse "
                             "(the file is cut short or damaged)") from None
        return lmscore.from_graphdef_bytes(data, source=name, text=True, max_ops=max_ops)


def _load_zip(data: bytes, name: str, cap: int, max_ops: int) -> Graph:
    """A zipped SavedModel, read by :func:`lmscore.load` from a temporary file."""
    with tempfile.TemporaryDirectory(prefix="lms-upload-") as tmp:
        path = pathlib.Path(tmp) / "upload.zip"
        path.write_bytes(data)
        try:
            with zipfile.ZipFile(path) as zf:
                total = sum(i.file_size for i in zf.infolist())
        except (zipfile.BadZipFile, OSError) as e:
            raise GraphError(f"{name}: unreadable zip archive ({e})") from None
        if total > ZIP_EXPANSION * cap:
            raise GraphError(f"{name}: the archive unpacks to {format_bytes(total)}, more than "
                             f"{ZIP_EXPANSION}x the upload limit")
        graph = lmscore.load(path, max_ops=max_ops)
    return graph.replace(graph.ops, source=name)


def accept_upload(ctx: AppContext, filename: str, data: bytes) -> LoadedGraph:
    """Load an uploaded graph and keep its bytes for reloads after a restart.

    Raises
    ------
    GraphError
        If the file is over the cap, has a suffix that is not a graph's, or does not
        parse as a training graph.
    """
    name = pathlib.Path(filename or "upload").name
    if len(data) > ctx.upload_cap_bytes:
        raise GraphError(f"{name} is {format_bytes(len(data))}: over the upload limit of "
                         f"{format_bytes(ctx.upload_cap_bytes)}")
    suffix = pathlib.Path(name).suffix.lower()
    if suffix not in GRAPH_SUFFIXES:
        raise GraphError(f"{name}: not a graph file (upload a GraphDef .pb or .pbtxt, or a "
                         ".zip of a SavedModel)")
    if not data:
        raise GraphError(f"{name}: the file is empty")
    try:
        loaded = _cache_graph(ctx, data, name, "upload", None)
    except LmsError:
        raise
    except RecursionError:
        raise GraphError(f"{name}: not a GraphDef (nested too deeply)") from None
    except Exception as e:  # noqa: BLE001 - any parser failure is a bad upload, not a crash
        raise GraphError(f"{name}: not a usable graph ({type(e).__name__}: {e})") from None
    _keep_upload(ctx, loaded.key, suffix, data)
    return loaded


def _keep_upload(ctx: AppContext, key: str, suffix: str, data: bytes) -> None:
    try:
        ctx.uploads_dir.mkdir(parents=True, exist_ok=True)
        target = ctx.uploads_dir / f"{key}{suffix}"
        if not target.exists():
            write_atomic(target, data)
        kept = sorted(ctx.uploads_dir.glob("*.*"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[KEEP_UPLOADS:]:
            old.unlink(missing_ok=True)
    except (OSError, ConfigError):
        pass  # the session still works; only a reload after a restart would miss it


# --- per-session state (what the dcc.Store components hold) ------------------------------


def new_session(ctx: AppContext) -> dict[str, Any]:
    """Initial data of the session stores for a new tab.

    A new tab starts with no plan: plans come back only to the tab that made them (its id
    is kept in its session storage) or by an explicit "load plan".

    Returns
    -------
    dict
        ``graph`` (:meth:`LoadedGraph.ref`), ``settings`` (batch, budget, device and link
        presets, knobs), ``plan`` (plan JSON or None, where it came from, the tuner's
        verdict), ``view`` (selected level, tensor and op), ``history`` (the tab's undo
        and redo stacks of plans) and ``tab`` (the tab's id).
    """
    loaded = ctx.initial
    return {
        "graph": loaded.ref(),
        "settings": default_settings(loaded.fixed_batch or ctx.initial_batch),
        "plan": plan_store(None, "none"),
        "view": empty_view(),
        "history": empty_history(),
        "tab": new_tab_id(),
    }


def empty_history() -> dict[str, list[dict[str, Any]]]:
    """No plan to undo or redo."""
    return {"undo": [], "redo": []}


def default_settings(batch: int) -> dict[str, Any]:
    """Settings of a new session: the V100 preset (if the tuner has it) and its memory."""
    devices, links = presets()
    device = "V100" if "V100" in devices else next(iter(devices), "V100")
    link = "pcie3" if "pcie3" in links else next(iter(links), "pcie3")
    memory = getattr(devices.get(device), "memory_bytes", None)
    return {
        "batch": batch, "budget": budget_text(int(memory)) if memory else DEFAULT_BUDGET,
        "device": device, "link": link, "workspace": "accelerator", "knobs": dict(DEFAULT_KNOBS),
    }


def budget_text(n: int) -> str:
    """A byte count as budget text.

    >>> budget_text(16 * 2**30), budget_text(1536 * 2**20), budget_text(1000)
    ('16GiB', '1536MiB', '1000')
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def plan_text(plan: Plan) -> str:
    """The JSON of ``plan`` as the page keeps it, and as caches and verdicts key it.

    Compact: the page sends it back with every edit (ResNet-50's knob plan is 160 KB
    indented), and the C encoder writes it where indenting takes Python's.
    """
    return plan.to_json(indent=None)


def plan_store(plan: Plan | None, source: str, tune: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """What ``st-plan`` holds: the plan as JSON, how it was made, the tuner's verdict."""
    return {
        "json": plan_text(plan) if plan is not None else None,
        "source": source,
        "tune": tune,
        "swaps": len(plan.swaps) if plan is not None else 0,
        "recomputes": len(plan.recomputes) if plan is not None else 0,
    }


def empty_view() -> dict[str, Any]:
    """No level, tensor or op selected."""
    return {"level": None, "tensor": None, "op": None}


def presets() -> tuple[dict[str, Any], dict[str, Any]]:
    """Device and link presets of the tuner (empty when it is not installed)."""
    try:
        # the module, not the function lmscore re-exports under the same name
        tune = importlib.import_module("lmscore.tune")
    except ImportError:
        return {"V100": None}, {"pcie3": None}
    return (dict(getattr(tune, "DEVICES", None) or {"V100": None}),
            dict(getattr(tune, "LINKS", None) or {"pcie3": None}))
