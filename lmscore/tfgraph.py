"""Turn TensorFlow and Keras objects into serialized training-step GraphDefs.

This is the only module of :mod:`lmscore` that imports TensorFlow to *produce* graphs; it is
imported only when TensorFlow is actually needed. Every function returns the bytes of a
``tensorflow.GraphDef``. Those that trace a function (all but :func:`graphdef_with_shapes`,
which completes the shapes of an existing GraphDef) return graphs such that:

* the graph is the body of one traced ``tf.function`` (a ``FuncGraph``): arguments appear as
  ``Placeholder`` nodes, and every captured resource variable (model weights, optimizer slots,
  the iteration counter) appears as a ``Placeholder`` of dtype ``DT_RESOURCE`` read by
  ``ReadVariableOp`` and written by ``AssignVariableOp`` / ``AssignAddVariableOp`` /
  ``AssignSubVariableOp`` nodes; the weights themselves are not in the graph;
* every node carries an ``_output_shapes`` attribute (an empty list for nodes without outputs,
  such as the variable writes and ``NoOp``), with ``-1`` for dimensions unknown at trace time,
  typically the batch dimension;
* the function library is kept, so the bodies of functional control flow (``While``,
  ``StatelessWhile``, ``If``) and of ``PartitionedCall`` / ``StatefulPartitionedCall`` nodes are
  available; their nodes carry ``_output_shapes`` as well;
* the serialization is deterministic (map fields sorted), so tracing the same program in a fresh
  process gives the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from lmscore.errors import ConfigError, GraphError

__all__ = [
    "graphdef_from_concrete_function",
    "graphdef_from_function",
    "graphdef_from_keras",
    "graphdef_from_saved_model",
    "graphdef_with_shapes",
    "train_step_function",
]

_DEFAULT_SAVED_MODEL_FUNCTION = "train_step"

_ConcreteFunction = tf.types.experimental.ConcreteFunction
_PolymorphicFunction = tf.types.experimental.PolymorphicFunction


def train_step_function(
    model: Any,
    loss: Callable[[Any, Any], Any] | str,
    optimizer: Any,
    input_signature: Sequence[Any],
) -> tf.types.experimental.ConcreteFunction:
    """Trace one custom-training-loop step of a Keras model.

    The traced step is::

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                l = loss(y, model(x, training=True)) + sum(model.losses)
            grads = tape.gradient(l, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return l

    so the resulting graph holds the forward pass, the gradients and the optimizer update.

    Parameters
    ----------
    model : keras.Model
        The model. If it is not built yet, it is built by one eager call on zeros shaped like
        ``x_spec`` (unknown dimensions taken as 1).
    loss : callable or str
        ``loss(y_true, y_pred)`` returning a scalar tensor, e.g. a ``keras.losses.Loss``, or
        a name ``model.compile`` accepts (``"sparse_categorical_crossentropy"``), resolved
        as it does: ``keras.losses.get``, a function averaged over the batch.
    optimizer : keras.optimizers.Optimizer or str
        The optimizer, or a name (``"adam"``: ``keras.optimizers.get``, default settings).
        Its slot variables are created before tracing
        (``optimizer.build(model.trainable_variables)``) so that the full update is traced.
    input_signature : sequence of two specs
        ``(x_spec, y_spec)``. ``x_spec`` is a ``tf.TensorSpec`` or a tuple, list or dict of
        them (multi-input models); ``y_spec`` is a ``tf.TensorSpec`` (or a structure of them
        matching what ``loss`` expects). Use ``None`` as the batch dimension to keep the batch
        size unknown in the graph. The spec names become the placeholder names.

    Returns
    -------
    tf.types.experimental.ConcreteFunction
        The traced step; it takes ``(x, y)`` and returns the scalar loss.

    Raises
    ------
    ValueError
        If ``input_signature`` does not have exactly two elements.
    ConfigError
        If ``loss`` or ``optimizer`` is a name Keras does not know.

    """
    if len(input_signature) != 2:
        raise ValueError(
            f"input_signature must be (x_spec, y_spec), got {len(input_signature)} element(s)"
        )
    x_spec, y_spec = input_signature
    loss, optimizer = _keras_loss(loss), _keras_optimizer(optimizer)
    if not getattr(model, "built", True) or not model.trainable_variables:
        model(_zeros_like_spec(x_spec), training=False)
    variables = list(model.trainable_variables)
    if not getattr(optimizer, "built", False):
        optimizer.build(variables)

    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
            extra = list(model.losses)
            if extra:
                value = value + tf.add_n(extra)
        grads = tape.gradient(value, variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return value

    traced = tf.function(step, input_signature=(x_spec, y_spec))
    return traced.get_concrete_function()


def graphdef_from_concrete_function(cf: tf.types.experimental.ConcreteFunction) -> bytes:
    """Serialize the graph of a concrete function, with shapes and its function library.

    Parameters
    ----------
    cf : tf.types.experimental.ConcreteFunction
        A traced function, e.g. from :func:`train_step_function` or a loaded SavedModel.

    Returns
    -------
    bytes
        The deterministic serialization of ``cf.graph.as_graph_def(add_shapes=True)``, where
        nodes without outputs also get an (empty) ``_output_shapes`` attribute.

    Raises
    ------
    TypeError
        If ``cf`` is not a concrete function.

    """
    if not isinstance(cf, _ConcreteFunction):
        raise TypeError(f"expected a ConcreteFunction, got {type(cf).__name__}")
    graph_def = cf.graph.as_graph_def(add_shapes=True)
    _add_missing_output_shapes(graph_def)
    _add_variable_shapes(cf, graph_def)
    _inline_captured_constants(cf, graph_def)
    return graph_def.SerializeToString(deterministic=True)


#: Largest captured constant written into the graph as a ``Const`` (bytes of its values).
MAX_INLINED_BYTES = 64 * 2**20


def _inline_captured_constants(cf: Any, graph_def: Any) -> None:
    """Write the values of captured constants into the graph, as ``Const`` nodes.

    A tensor made outside the function (a diffusion schedule, a mel filter bank) is
    captured as a ``Placeholder`` fed by the caller, like the step's data: validation then
    filled it with random numbers, and a schedule's square root became NaN. Variables,
    and constants over :data:`MAX_INLINED_BYTES`, stay placeholders.
    """
    values = {}
    for external, internal in cf.graph.captures:
        if (isinstance(external, tf.Tensor) and hasattr(external, "numpy")
                and external.dtype not in (tf.resource, tf.variant, tf.string)
                and external.shape.is_fully_defined()
                and external.shape.num_elements() * external.dtype.size <= MAX_INLINED_BYTES):
            values[internal.op.name] = external
    for node in graph_def.node:
        value = values.get(node.name)
        if value is None or node.op != "Placeholder":
            continue
        shapes = node.attr["_output_shapes"]
        kept = type(shapes)()
        kept.CopyFrom(shapes)
        node.op = "Const"
        node.ClearField("attr")
        node.attr["dtype"].type = value.dtype.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value.numpy()))
        node.attr["_output_shapes"].CopyFrom(kept)


def _add_variable_shapes(cf: Any, graph_def: Any) -> None:
    """Give each captured variable's placeholder its dtype and shape.

    As ``_handle_dtypes`` and ``_handle_shapes``, the attributes TensorFlow gives a
    function's resource arguments. A variable read only by a gather and updated by a
    scatter (an embedding table under a sparse optimizer) tells its rows' shape but not
    how many rows it has: validation could not make it.
    """
    try:
        held = cf.graph.variables
    except AssertionError:  # a variable the caller no longer holds: its shape is unknown
        return
    handles = {id(v.handle): v for v in held if hasattr(v, "handle")}
    by_name = {}
    for external, internal in cf.graph.captures:
        v = handles.get(id(external))
        if v is not None and v.shape.is_fully_defined():
            by_name[internal.op.name] = v
    for node in graph_def.node:
        v = by_name.get(node.name)
        if v is None or node.op != "Placeholder" or "_handle_shapes" in node.attr:
            continue
        node.attr["_handle_dtypes"].list.type.append(v.dtype.as_datatype_enum)
        shape = node.attr["_handle_shapes"].list.shape.add()
        for d in v.shape.as_list():
            shape.dim.add().size = d


def graphdef_from_keras(
    model: Any,
    loss: Callable[[Any, Any], Any] | str,
    optimizer: Any,
    x_spec: Any,
    y_spec: Any,
) -> bytes:
    """Trace a Keras training step and serialize it.

    This is :func:`train_step_function` followed by :func:`graphdef_from_concrete_function`.

    Parameters
    ----------
    model : keras.Model
        The model.
    loss : callable or str
        ``loss(y_true, y_pred)`` returning a scalar tensor, or a Keras loss name.
    optimizer : keras.optimizers.Optimizer or str
        The optimizer, or a Keras optimizer name.
    x_spec : tf.TensorSpec or structure of tf.TensorSpec
        Spec of the model input(s), normally with a ``None`` batch dimension.
    y_spec : tf.TensorSpec or structure of tf.TensorSpec
        Spec of the labels.

    Returns
    -------
    bytes
        The serialized GraphDef of the training step.

    """
    cf = train_step_function(model, loss, optimizer, (x_spec, y_spec))
    return graphdef_from_concrete_function(cf)


def _keras_loss(loss: Any) -> Any:
    """A loss name resolved as ``model.compile`` does; anything else as given."""
    if not isinstance(loss, str):
        return loss
    import keras
    from keras.src.losses import LossFunctionWrapper  # what compile wraps a function in

    try:
        resolved = keras.losses.get(loss)
    except (ValueError, TypeError):
        resolved = None
    if not callable(resolved):
        raise ConfigError(f"loss: Keras knows no loss named {loss!r}")
    if not isinstance(resolved, keras.losses.Loss):
        # A loss function returns one value per sample; compile averages it over the batch.
        resolved = LossFunctionWrapper(resolved, name=loss)
    return resolved


def _keras_optimizer(optimizer: Any) -> Any:
    """An optimizer name resolved by ``keras.optimizers.get``; anything else as given."""
    if not isinstance(optimizer, str):
        return optimizer
    import keras

    try:
        return keras.optimizers.get(optimizer)
    except (ValueError, TypeError):
        raise ConfigError(f"optimizer: Keras knows no optimizer named {optimizer!r}") from None


def graphdef_from_function(fn: Any, *args_specs: Any) -> bytes:
    """Serialize a ``tf.function`` traced for the given specs, or a concrete function.

    Parameters
    ----------
    fn : tf.types.experimental.PolymorphicFunction or tf.types.experimental.ConcreteFunction
        A ``tf.function`` (traced with ``fn.get_concrete_function(*args_specs)``) or an already
        traced concrete function (then ``args_specs`` must be empty).
    *args_specs : tf.TensorSpec or structure of tf.TensorSpec
        The argument specs to trace a ``tf.function`` with; none if it has an input signature.

    Returns
    -------
    bytes
        The serialized GraphDef.

    Raises
    ------
    TypeError
        If ``fn`` is neither kind of function, or specs are given with a concrete function.

    """
    if isinstance(fn, _ConcreteFunction):
        if args_specs:
            raise TypeError("argument specs cannot be given with an already traced function")
        return graphdef_from_concrete_function(fn)
    if isinstance(fn, _PolymorphicFunction):
        return graphdef_from_concrete_function(fn.get_concrete_function(*args_specs))
    raise TypeError(f"expected a tf.function or a ConcreteFunction, got {type(fn).__name__}")


def graphdef_from_saved_model(path: str | os.PathLike[str], function: str | None = None) -> bytes:
    """Load a TensorFlow SavedModel and serialize one of its functions.

    The SavedModel is loaded with ``tf.saved_model.load``, which rebuilds functions from their
    serialized graphs and never runs Python code stored with the model.

    Parameters
    ----------
    path : str or os.PathLike
        The SavedModel directory.
    function : str, optional
        Which function to take: the name of an attribute of the loaded object that is a
        ``tf.function`` traced once (or a concrete function), or else a signature key. By
        default the attribute ``train_step`` if there is one, else the only signature.

    Returns
    -------
    bytes
        The serialized GraphDef of the chosen function.

    Raises
    ------
    GraphError
        If the directory is missing or is not a loadable SavedModel, if the function is not
        found (the message lists the available choices), is ambiguous, or was traced several
        times.

    """
    where = os.fspath(path)
    if not os.path.exists(where):
        raise GraphError(f"{where}: SavedModel directory does not exist")
    if not os.path.isdir(where):
        raise GraphError(f"{where}: not a directory (a SavedModel is a directory)")
    try:
        loaded = tf.saved_model.load(where)
    except Exception as exc:  # TF raises many unrelated types here
        raise GraphError(f"{where}: cannot load SavedModel: {_one_line(exc)}") from None

    functions = _function_attributes(loaded)
    signatures = dict(getattr(loaded, "signatures", None) or {})
    if function is None:
        if _DEFAULT_SAVED_MODEL_FUNCTION in functions:
            function = _DEFAULT_SAVED_MODEL_FUNCTION
        elif len(signatures) == 1:
            function = next(iter(signatures))
        else:
            raise GraphError(
                f"{where}: no function '{_DEFAULT_SAVED_MODEL_FUNCTION}' and "
                f"{len(signatures)} signatures; choose one of: {_choices(functions, signatures)}"
            )
    if function in functions:
        cf = _single_concrete_function(where, function, functions[function])
    elif function in signatures:
        cf = signatures[function]
    else:
        raise GraphError(
            f"{where}: no function or signature '{function}'; "
            f"choose one of: {_choices(functions, signatures)}"
        )
    return graphdef_from_concrete_function(cf)


def graphdef_with_shapes(data: bytes, source: str = "<graph>") -> bytes:
    """Add ``_output_shapes`` to the nodes of a serialized GraphDef that lack them.

    The graph is imported into a ``tf.Graph``, which runs TensorFlow's shape inference; the
    nodes of the input that lack ``_output_shapes`` (or have an empty list although they have
    outputs) get the inferred shapes, the others are left as they are, and nodes without
    outputs get an empty list. Node order and the function library are kept; nodes inside
    library functions are not changed.

    Shape inference cannot see through resource handles: in a graph whose variables are
    ``DT_RESOURCE`` placeholders (a traced function), the values read from them have unknown
    shapes unless ``_output_shapes`` is already present. Graphs that create their variables
    (``VarHandleOp``, ``VariableV2``) get full shapes.

    Parameters
    ----------
    data : bytes
        A binary-serialized ``GraphDef``.
    source : str, optional
        Name of the graph's origin (e.g. a file name), used in error messages.

    Returns
    -------
    bytes
        The deterministic serialization of the completed GraphDef.

    Raises
    ------
    GraphError
        If the bytes are not a GraphDef or TensorFlow cannot import the graph.
    """
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError, or a bad type for data
        raise GraphError(f"{source}: not a binary GraphDef: {_one_line(exc)}") from None
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    except Exception as exc:  # TF raises ValueError, InvalidArgumentError, NotFoundError...
        raise GraphError(
            f"{source}: TensorFlow cannot import the graph: {_one_line(exc)}"
        ) from None
    inferred = {n.name: n for n in graph.as_graph_def(add_shapes=True).node}
    for node in graph_def.node:
        if "_output_shapes" in node.attr and node.attr["_output_shapes"].list.shape:
            continue
        shapes = inferred.get(node.name)
        if shapes is not None and "_output_shapes" in shapes.attr:
            node.attr["_output_shapes"].CopyFrom(shapes.attr["_output_shapes"])
    _add_missing_output_shapes(graph_def)
    return graph_def.SerializeToString(deterministic=True)


def _zeros_like_spec(spec: Any) -> Any:
    """Build zeros matching a structure of specs, unknown dimensions taken as 1."""

    def zeros(s: tf.TensorSpec) -> tf.Tensor:
        shape = [1 if d is None else d for d in s.shape.as_list()]
        return tf.zeros(shape, dtype=s.dtype)

    return tf.nest.map_structure(zeros, spec)


def _add_missing_output_shapes(graph_def: Any) -> None:
    """Give an empty ``_output_shapes`` list to top-level nodes lacking one (no outputs)."""
    for node in graph_def.node:
        if "_output_shapes" not in node.attr:
            node.attr["_output_shapes"].list.SetInParent()
    for fdef in graph_def.library.function:
        for node in fdef.node_def:
            if "_output_shapes" not in node.attr:
                node.attr["_output_shapes"].list.SetInParent()


def _function_attributes(loaded: Any) -> dict[str, Any]:
    """Map public attribute names of a loaded object to the functions they hold."""
    found: dict[str, Any] = {}
    for name in dir(loaded):
        if name.startswith("_") or name == "signatures":
            continue
        try:
            value = getattr(loaded, name)
        except Exception:  # a broken property is simply not a choice
            continue
        if isinstance(value, (_PolymorphicFunction, _ConcreteFunction)):
            found[name] = value
    return found


def _single_concrete_function(where: str, name: str, fn: Any) -> Any:
    """Return the one concrete function of a restored ``tf.function``, or raise GraphError."""
    if isinstance(fn, _ConcreteFunction):
        return fn
    traces = list(getattr(fn, "concrete_functions", None) or [])
    if len(traces) == 1:
        return traces[0]
    if not traces:
        try:
            return fn.get_concrete_function()
        except Exception:  # reported below as a user error
            pass
        raise GraphError(f"{where}: function '{name}' has no traced concrete function")
    raise GraphError(
        f"{where}: function '{name}' was traced {len(traces)} times; save it with an "
        "input_signature so that it has exactly one concrete function"
    )


def _choices(functions: dict[str, Any], signatures: dict[str, Any]) -> str:
    """List the selectable names for an error message."""
    names = [f"{n} (function)" for n in sorted(functions)]
    names += [f"{n} (signature)" for n in sorted(signatures)]
    return ", ".join(names) if names else "(none)"


def _one_line(exc: BaseException) -> str:
    """Reduce an exception message to one line."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
