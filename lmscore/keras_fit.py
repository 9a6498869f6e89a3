"""Make ``model.fit`` of a compiled Keras 3 model train with the rewritten step.

::

    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    lmscore.swap_fit(model, batch_size=64, threshold=40)   # fit now runs the swapped step
    model.fit(x, y, batch_size=64, epochs=5, validation_data=(x_val, y_val))

Keras' TensorFlow trainer builds ``model.train_function`` from ``model.train_step`` (the
documented place to customize what ``fit`` does) in ``make_train_function``, and
``model.compile`` drops that function. :func:`swap_fit` sets two attributes on the model
itself: a ``train_step`` that, when Keras traces it, traces the model's own ``train_step``
for the batches ``fit`` feeds, with Keras' own structure and shapes (x, y and sample
weights, any nesting; the batch dimension is unknown when the last batch is partial),
rewrites it with :func:`lmscore.swap` and calls the rewritten graph from Keras' train
function, on the same variables (weights, optimizer slots, metrics, dropout seeds); and a
``make_train_function`` that builds Keras' function without XLA, which would compile the
swap nodes away. Everything else is Keras': callbacks, the progress bar, metrics,
validation (``test_step`` is left as it is, XLA included), ``steps_per_execution``. After
``compile`` again the next ``fit`` rewrites the step for the new optimizer, loss and
metrics. :meth:`SwapFit.restore` (or leaving a ``with`` block) removes both attributes, and
``fit`` runs the original step again.

Under TensorFlow's default Grappler the rewritten ``fit`` trains bit for bit as the plain
one where the rewritten step computes what the original does (README, "Numerics under the
user's runtime"); on this CPU a CNN, a transformer and mixed precision with loss scaling
are tested (``tests/test_keras_fit.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from .errors import ConfigError
from .export import SwappedStep, swap

__all__ = ["SwapFit", "swap_fit"]


class SwapFit:
    """A compiled Keras model whose ``fit`` runs the step rewritten by :func:`lmscore.swap`.

    Made by :func:`swap_fit`. Use it as a context manager to restore the model's own step
    on exit.

    Attributes
    ----------
    model : keras.Model
    options : dict
        The keyword arguments passed on to :func:`lmscore.swap` (``batch_size`` included).
    """

    def __init__(self, model: Any, options: dict[str, Any]) -> None:
        self.model = model
        self.options = dict(options)
        self._original: Callable[[Any], Any] = model.train_step
        self._steps: dict[Any, SwappedStep] = {}
        self._warned_jit = False

    @property
    def steps(self) -> tuple[SwappedStep, ...]:
        """The rewritten steps of the current train function, one per batch signature.

        Empty until ``fit`` (or ``train_on_batch``) first traces the step; emptied when
        Keras builds its train function again (after ``compile``).
        """
        return tuple(self._steps.values())

    @property
    def installed(self) -> bool:
        """Whether ``model.fit`` runs the rewritten step."""
        return getattr(self.model.train_step, "__self__", None) is self

    def restore(self) -> None:
        """Make ``model.fit`` run the model's own training step again.

        Idempotent; the variables keep what training with the rewritten step wrote.
        """
        if not self.installed:
            return
        for name in ("train_step", "make_train_function"):
            if name in vars(self.model):
                delattr(self.model, name)
        self.model.train_function = None
        self._steps.clear()

    def __enter__(self) -> SwapFit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        state = "installed" if self.installed else "restored"
        return f"SwapFit({self.model.name!r}, {state}, {len(self._steps)} step(s))"

    # --- what Keras calls --------------------------------------------------------------------

    def make_train_function(self, force: bool = False) -> Any:
        """Keras' ``make_train_function``, building the train function without XLA."""
        model = self.model
        if model.train_function is not None and not force:
            return model.train_function
        self._steps.clear()  # compile again: new optimizer, loss or metrics
        jit = model.jit_compile
        if jit and not self._warned_jit:
            warnings.warn(
                "jit_compile: the rewritten train step runs without XLA (XLA would compile "
                "the swaps away); evaluation and prediction keep it",
                stacklevel=3,
            )
            self._warned_jit = True
        model.jit_compile = False
        try:
            type(model).make_train_function(model, force=True)
        finally:
            model.jit_compile = jit
        return model.train_function

    def train_step(self, data: Any) -> Any:
        """One training step on ``data`` as ``fit`` feeds it, through the rewritten graph."""
        import tensorflow as tf

        leaves = tf.nest.flatten(data)
        values = [tf.convert_to_tensor(v) for v in leaves if v is not None]
        # Keras' own shapes, not a relaxed batch dimension: Grappler's constant folding
        # folds more where the batch size is known, and the step must compute what Keras'
        # step computes (a transformer's weights were 1e-6 apart after 2 epochs).
        specs = tuple(
            tf.TensorSpec(v.shape, v.dtype, name=f"data_{i}") for i, v in enumerate(values)
        )
        skeleton = tf.nest.map_structure(lambda v: v is None, data)
        key = (repr(skeleton), specs)
        step = self._steps.get(key)
        if step is None:
            step = self._rewrite(data, leaves, specs)
            self._steps[key] = step
        return step(*values)

    def _rewrite(self, data: Any, leaves: list[Any], specs: tuple[Any, ...]) -> SwappedStep:
        import tensorflow as tf

        original = self._original
        present = [v is not None for v in leaves]

        def train_step(*tensors: Any) -> Any:
            it = iter(tensors)
            flat = [next(it) if p else None for p in present]
            return original(tf.nest.pack_sequence_as(data, flat))

        train_step.__name__ = f"{self.model.name}.train_step"
        # Keras runs train_step unconverted (``do_not_convert``); so does the trace.
        return swap(tf.function(train_step, autograph=False), *specs, **self.options)


def swap_fit(model: Any, *, batch_size: int | None = None, **swap_options: Any) -> SwapFit:
    """Make ``model.fit`` train with the step rewritten to swap tensors to the host.

    The step ``fit`` runs is the model's own ``train_step`` (forward pass, loss, gradients,
    optimizer update and metrics), traced for the batches ``fit`` feeds and rewritten by
    :func:`lmscore.swap`; callbacks, metrics, the progress bar and validation are Keras'.
    The rewritten train function runs without XLA (``jit_compile`` is turned off while it
    is built, with a warning when it was on: XLA would compile the swap nodes away);
    evaluation and prediction are untouched.

    Parameters
    ----------
    model : keras.Model
        A compiled model (Keras 3, TensorFlow backend, one replica).
    batch_size : int, optional
        The batch size given to ``fit``, which the plan is made for (where the last batch
        is partial, Keras traces its step for batches of unknown size). Required unless
        ``plan`` is given.
    **swap_options
        Passed on to :func:`lmscore.swap`, which decides the plan: ``budget=`` (and the
        tuner's options), the TFLMS knobs (``threshold``, ``ahead``, ``groupby``,
        ``sync_mode`` and the further knobs of :func:`lmscore.plan.plan_from_params`) or
        ``plan=``; ``device`` / ``host``. They are checked when ``fit`` first traces the
        step, and refused there (a :class:`~lmscore.errors.ConfigError` out of ``fit``).

    Returns
    -------
    SwapFit
        Its :meth:`~SwapFit.restore` (or the end of a ``with`` block) makes ``fit`` run
        the original step again; :attr:`~SwapFit.steps` holds the rewritten steps (each
        with its ``plan``) once ``fit`` has run.

    Raises
    ------
    ConfigError
        If ``model`` is not a compiled Keras model on the TensorFlow backend, is
        distributed over several replicas, or ``batch_size`` is missing or not positive.

    Notes
    -----
    Calling :func:`swap_fit` again on the same model replaces the earlier rewrite.
    ``model.train_on_batch`` runs the rewritten step too. Each signature Keras traces its
    train function for (another structure or other shapes) is rewritten once, and planned
    on its own graph. A ``plan=`` names the nodes of one trace: it fits that model
    instance (Keras numbers its layers' names per session).
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        raise ConfigError(
            f"model: swap_fit needs Keras' TensorFlow backend, this Keras runs "
            f"{keras.backend.backend()!r}"
        )
    if not isinstance(model, keras.Model):
        raise ConfigError(f"model: expected a keras.Model, got {type(model).__name__}")
    if not getattr(model, "compiled", False):
        raise ConfigError(f"model: {model.name!r} is not compiled; call model.compile first")
    replicas = model.distribute_strategy.num_replicas_in_sync
    if replicas != 1:
        raise ConfigError(
            f"model: {model.name!r} is distributed over {replicas} replicas; swap_fit "
            "rewrites a single-replica step"
        )
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ConfigError(f"batch_size: must be a positive integer, got {batch_size!r}")
    if batch_size is None and swap_options.get("plan") is None:
        raise ConfigError(
            "batch_size: pass the batch size given to fit (the plan is made for it)"
        )
    previous = getattr(model.train_step, "__self__", None)
    if isinstance(previous, SwapFit):
        previous.restore()
    options = dict(swap_options)
    if batch_size is not None:
        options["batch_size"] = batch_size
    fit = SwapFit(model, options)
    model.train_step = fit.train_step
    model.make_train_function = fit.make_train_function
    model.train_function = None
    return fit
