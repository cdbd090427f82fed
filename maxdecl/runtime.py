"""``md.compile(graph, weights)``: a graph planned once, its weights checked and bound.

The compiled object owns everything a run needs (the graph itself only builds and
type-checks): the execution plan (generated Python, one local per value and one line
per step, each intermediate deleted after its last use: a decode step runs ~400
nodes, and interpreting them from a table cost ~5 us of bookkeeping each), where a
step is one node or several fused by ``maxdecl.fusion`` (sibling linears as one
grouped call, reshapes inline; ``fuse=False`` / ``MAXDECL_FUSE=0``: none), the
runtime function of every step (imported from ``maxdecl.kernels`` here, the first
time numba loads), and the weights bound to the graph's ``weight`` nodes, checked
once. Every failure is a ``GraphError`` naming the node's spec position, layer
path, op and the runtime types of its inputs (a fused step: its first node, and
the others). Steps whose runners take their output arrays from the plan
(``kernels.step_outputs``) reuse them from run to run where no output can outlive the
run, so that a decode step allocates no activations.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Mapping

import numpy as np

from . import dims, fusion
from .dtypes import format_shape
from .errors import GraphError, MaxdeclError
from .ops import _registry
from .tensors import QuantizedTensor


def describe_value(v) -> str:
    """``float32[2, 16]`` or ``q4_k[1024, 4096]`` for a runtime array (or a Value)."""
    if isinstance(v, QuantizedTensor):
        return f"{v.encoding}{format_shape(v.shape)}"
    if isinstance(v, np.ndarray):
        return f"{v.dtype.name}{format_shape(v.shape)}"
    t = getattr(v, "type", None)
    return str(t) if t is not None else type(v).__name__


class PerSequence(list):
    """One array per sequence of a batch: a state input or output (a KV cache each)."""


class CompiledGraph:
    """A runnable graph: ``compiled(*inputs) -> list[np.ndarray]``.

    **Batches of sequences** (``compiled(*inputs, rows=[n_1, ..., n_B])``): the row
    inputs hold the rows of B sequences one after the other along axis 0 (``tokens``,
    ``positions``: ``sum(rows)`` of them) and every state input is a ``PerSequence``
    list with one array per sequence (its own KV cache, its own ``past``). Row-wise
    ops (linear, norms, activations, rope, ...) run once over all the rows, so a
    weight is read once per step for the whole batch; ops that mix positions along
    the sequence (``attention``: ``OpDef.sequence_axis``) run once per sequence on its
    rows and state. State outputs come back as ``PerSequence`` lists.

    **Fusion** (``maxdecl.fusion``): ``steps`` lists what one run calls, some steps
    covering several nodes (sibling linears as one grouped call, reshapes inline);
    ``fused`` says whether the rules were applied (``md.compile(..., fuse=False)`` or
    ``MAXDECL_FUSE=0``: one step per node). Outputs are bit-identical either way.

    Example::

        run = md.compile(g, weights=td)
        (y,) = run(np.ones((2, 16), np.float32))
    """

    def __init__(self, graph, weights=None, fuse=None, activations=None):
        from .kernels import compiler_pages, config

        try:
            self.activations = config.activations(activations)
        except ValueError as e:
            raise GraphError(f"{graph.name}: {e}") from None
        self._mode = config.ACTIVATION_MODE
        if not graph.outputs:
            raise GraphError(f"{graph.name}: no outputs; call graph.output(...) first")
        if weights is not None and not isinstance(weights, Mapping):
            raise GraphError(f"{graph.name}: weights must be a TensorDict or mapping of name "
                             f"-> array, got {type(weights).__name__}")
        self.name = graph.name
        self.batching = graph.batching
        self.input_types = [v.type for v in graph.inputs]
        self.input_dims = [_dim_kinds(t) for t in self.input_types]
        self.input_names = [v.name for v in graph.inputs]
        self._inputs = list(graph.inputs)
        self.output_names = list(graph.output_names)
        self.weights = weights
        weight_nodes = [n for n in graph.nodes if n.op == "weight"]
        self._bound = [_bind_weight(n, weights) for n in weight_nodes]
        bound = {id(n.outputs[0]): w for n, w in zip(weight_nodes, self._bound)}
        self._nodes, folded = _fold_weight_casts(
            [n for n in graph.nodes if n.op != "weight"], bound)
        self._nodes, constants = _fold_constants(self._nodes, graph.outputs)
        folded += constants
        preloaded = [n.outputs[0] for n in weight_nodes] + [v for v, _ in folded]
        self._bound += [a for _, a in folded]
        self.fused = fusion.enabled(fuse)
        self.steps = fusion.plan(self._nodes, bound, self.fused, graph.outputs)
        self._run = _generate(graph, preloaded, self.steps, self._nodes)
        self._plan = (graph, preloaded)          # for ``fixed`` runs of the same steps
        self._pages = compiler_pages

    def __call__(self, *inputs, rows=None) -> list:
        arrays, rows = self._arrays(inputs, rows)
        return self._execute(self._run, arrays, rows)

    def fixed(self, names) -> "FixedInputsRun":
        """This graph as a callable of the same inputs that runs the steps reading only
        the inputs ``names`` (and the weights) once per value of those inputs, and
        reuses their results while later calls pass equal values: an encoder-decoder's
        encoder and cross-attention keys and values, computed once per source."""
        return FixedInputsRun(self, names)

    def _arrays(self, inputs, rows) -> tuple:
        """(the inputs as arrays, checked; the batch's rows, checked, or None)."""
        arrays = [a if isinstance(a, (QuantizedTensor, PerSequence)) else np.asanyarray(a)
                  for a in inputs]
        if rows is None:
            bind_inputs(self, arrays)
            return arrays, None
        return arrays, _check_batch(self, arrays, rows)

    def _execute(self, run, arrays, rows, *extra) -> list:
        env = arrays + self._bound
        loads = self._pages.loads()
        mode = self._mode.set(self.activations)
        held = run.outputs                    # this thread's output arrays of the plan
        outs = getattr(held, "steps", None) or run.new_outputs()
        held.steps = None                     # a nested run of the plan takes its own
        try:
            return run(env, rows, outs, *extra)
        except Exception as e:  # noqa: BLE001 - one error type out of a run
            s, args = _failed_step(e, run)
            if s is None:
                raise
            step = self.steps[s]
            node = self._nodes[step.nodes[0]]
            also = ""
            if len(step.nodes) > 1:
                also = " [fused in one call with " + ", ".join(
                    self._nodes[j].where() for j in step.nodes[1:]) + "]"
            if isinstance(e, MaxdeclError):
                raise GraphError(f"{node.where()}: {e}{also}") from e
            ins = ", ".join(describe_value(a) for a in args)
            raise GraphError(f"{node.where()}: {type(e).__name__}: {e} "
                             f"(inputs: {ins}){also}") from e
        finally:
            held.steps = outs
            self._mode.reset(mode)
            if self._pages.loads() != loads:   # kernels were compiled or loaded: the
                self._pages.release()          # compiler's pages go back (compiler_pages)

    def __repr__(self) -> str:
        return (f"CompiledGraph({self.name!r}, {len(self._nodes)} nodes, "
                f"{sum(s.kind != 'reshape' for s in self.steps)} calls)")


class FixedInputsRun:
    """``compiled.fixed(names)``: call it as the compiled graph. The steps that read only
    the inputs ``names`` and the weights run when those inputs differ from the last
    call's (or on the first call), and their results serve the calls in between; batched
    calls (``rows=``) run the whole graph. The results of those steps are shared by the
    calls that reuse them: outputs among them are the same arrays each time."""

    def __init__(self, compiled: CompiledGraph, names):
        names = [names] if isinstance(names, str) else list(names)
        unknown = [n for n in names if n not in compiled.input_names]
        if unknown:
            raise GraphError(f"{compiled.name}: no input named {', '.join(map(repr, unknown))} "
                             f"to fix (inputs: {', '.join(compiled.input_names)})")
        self.compiled = compiled
        self._at = [compiled.input_names.index(n) for n in names]
        graph, preloaded = compiled._plan
        self._run = _generate(graph, preloaded, compiled.steps, compiled._nodes, set(names))
        self._key = None
        self.values = None           # the fixed steps' results, once computed

    def __call__(self, *inputs, rows=None) -> list:
        if rows is not None:
            return self.compiled(*inputs, rows=rows)
        arrays, _ = self.compiled._arrays(inputs, None)
        key = [arrays[i] for i in self._at]
        if self._key is None or not all(_same(a, b) for a, b in zip(key, self._key)):
            self.values = None
            self._key = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a
                         for a in key]
        try:
            return self.compiled._execute(self._run, arrays, None, self)
        except BaseException:
            self._key = self.values = None   # a failed run leaves nothing half-kept
            raise


def _same(a, b) -> bool:
    """Whether a fixed input equals its last value (dtype, shape and every element)."""
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
            and a.shape == b.shape and np.array_equal(a, b))


def compile(graph, weights=None, fuse=None,  # noqa: A001 - md.compile
            activations=None) -> CompiledGraph:
    """Plan ``graph``, check and bind ``weights`` (a TensorDict or mapping) to its
    declared ``g.weight`` names; returns a ``CompiledGraph`` to call with inputs.

    ``fuse``: merge calls by the rules of ``maxdecl.fusion`` (sibling linears as one
    grouped call, reshapes inline; outputs bit-identical); None (default) follows the
    ``MAXDECL_FUSE`` environment variable (``0`` turns it off), else on.

    ``activations``: "f32" (exact float32 products everywhere) or "q8": quantized
    matmuls of up to 16 rows of x (decode steps) on q8_0, q4_0, q5_0, q4_k and q6_k
    weights round x to int8 codes with a scale per 32 values and sum integer products,
    as llama.cpp does on CPUs (faster, not bit-identical: x's rounding error, at most
    half a step per value). None (default) follows ``MAXDECL_ACTIVATIONS``, else "f32".

    Raises:
        GraphError: no outputs, a weight missing, of the wrong encoding, dtype or shape;
            an unknown ``activations``.
    """
    return CompiledGraph(graph, weights, fuse, activations)


def bind_inputs(compiled, arrays, skip=()) -> dict:
    """Check runtime inputs against the input types; returns ``{symbol: size}``.

    Every symbolic dim takes one size across all inputs (``seq`` of tokens and of
    positions); a compound dim (``past+seq``) must equal its value from the others.
    Inputs at the indices in ``skip`` are checked elsewhere (per sequence).
    """
    name, types = compiled.name, compiled.input_types
    if len(arrays) != len(types):
        raise GraphError(f"{name}: expected {len(types)} inputs, got {len(arrays)}")
    symbols: dict[str, int] = {}
    compound = []
    for i, a in enumerate(arrays):
        if i not in skip:
            compound += _bind_one(compiled, i, a, symbols)
    for label, want, got in compound:
        value = dims.evaluate(want, symbols)
        if value is not None and value != got:
            raise GraphError(f"{name}: {label}: dim {want!r} is {value} by the other inputs "
                             f"but {got} here")
    return symbols


def _bind_one(compiled, i, a, symbols) -> list:
    """Check input ``i`` (dtype, rank, static dims), binding its simple symbolic dims in
    ``symbols``; returns its compound dims ``(label, dim, size)`` to check afterwards."""
    name, t = compiled.name, compiled.input_types[i]
    label = compiled.input_names[i] or f"input {i}"
    if not isinstance(a, (np.ndarray, QuantizedTensor)):
        raise GraphError(f"{name}: {label}: expected an array {t}, got {type(a).__name__}")
    if not isinstance(a, QuantizedTensor) and a.dtype != t.dtype.numpy:
        raise GraphError(f"{name}: {label}: expected {t}, got "
                         f"{a.dtype.name}{format_shape(a.shape)}")
    if len(a.shape) != len(t.shape):
        raise GraphError(f"{name}: {label}: expected rank {len(t.shape)} {t}, "
                         f"got shape {format_shape(a.shape)}")
    compound = []
    for (kind, want), got in zip(compiled.input_dims[i], a.shape):
        if kind == "int":
            if want != got:
                raise GraphError(f"{name}: {label}: expected {t}, got shape "
                                 f"{format_shape(a.shape)}")
        elif kind == "symbol":
            if symbols.setdefault(want, got) != got:
                raise GraphError(f"{name}: {label}: dim {want!r} is {symbols[want]} "
                                 f"elsewhere but {got} here")
        else:
            compound.append((label, want, got))
    return compound


def _dim_kinds(t) -> list:
    """``[(kind, dim)]`` of a type's declared dims, kind "int", "symbol" (one name) or
    "compound" (worked out once: a batched step checks every sequence's cache with it)."""
    return [("int", d) if isinstance(d, int) else
            ("symbol", d) if dims.poly(d) == {(d,): 1} else ("compound", d) for d in t.shape]


def _check_batch(compiled, arrays, rows) -> list:
    """Check a batch: ``rows`` positive ints; row inputs bound like plain inputs; each
    ``PerSequence`` input one array of its input's type per sequence (its own ``past``)."""
    rows = [int(r) for r in rows]
    if not rows or any(r < 1 for r in rows):
        raise GraphError(f"{compiled.name}: rows must be positive row counts, one per "
                         f"sequence, got {rows}")
    per = set()
    for i, a in enumerate(arrays):
        if isinstance(a, PerSequence):
            _check_state_readers(compiled, i)
            per.add(i)
            label = compiled.input_names[i] or f"input {i}"
            if len(a) != len(rows):
                raise GraphError(f"{compiled.name}: {label}: {len(a)} arrays for "
                                 f"{len(rows)} sequences")
            arrays[i] = PerSequence(np.asanyarray(x) for x in a)
            for each in arrays[i]:
                _bind_one(compiled, i, each, {})
    bind_inputs(compiled, arrays, skip=per)
    return rows


def _check_state_readers(compiled, i) -> None:
    """GraphError when graph input ``i``, a state given per sequence, is read by a node
    other than through its op's state input (a ``reshape`` of the cache, say): in a
    batched run only the state op reads one array per sequence."""
    seen = compiled.__dict__.setdefault("_state_ok", set())
    if i in seen:
        return
    node = direct_state_reader(compiled, i)
    if node is not None:
        label = compiled.input_names[i] or f"input {i}"
        raise GraphError(f"{node.where()}: reads the state {label!r} "
                         "directly; in a batched run (rows=) a state is one array "
                         "per sequence, read only by its op's state input: take "
                         "what else you need (a shape, say) from another value")
    seen.add(i)


def direct_state_reader(compiled, i):
    """The first node that reads graph input ``i`` other than through its op's state
    input (an ``mul`` of a recurrent state, a ``reshape`` of a cache), or None: such a
    state cannot be given per sequence in one batched call (``rows=``)."""
    value = compiled._inputs[i]
    for node in compiled._nodes:
        opdef = _registry.REGISTRY.get(node.op)
        names = list(opdef.inputs) + list(opdef.optional) if opdef is not None else []
        for k, v in enumerate(node.inputs):
            if v is value and (k >= len(names) or names[k] not in opdef.state):
                return node
    return None


def _bind_weight(node, weights):
    name = node.attrs["name"]
    if weights is None or name not in weights:
        raise GraphError(f"{node.where()}: weight {name!r} is not bound "
                         "(pass weights=TensorDict with that name)")
    w = weights[name]
    t = node.attrs["type"]
    enc = node.attrs["encoding"]
    if enc is not None:
        if not isinstance(w, QuantizedTensor) or w.encoding != enc:
            got = w.encoding if isinstance(w, QuantizedTensor) else describe_value(w)
            raise GraphError(f"{node.where()}: weight {name!r} must be {enc}, got {got}")
    elif isinstance(w, QuantizedTensor):
        raise GraphError(f"{node.where()}: weight {name!r} is {w.encoding}, "
                         f"expected unquantized {t}")
    elif not isinstance(w, np.ndarray):
        raise GraphError(f"{node.where()}: weight {name!r} must be a NumPy array or a "
                         f"QuantizedTensor, got {type(w).__name__}")
    elif w.dtype != t.dtype.numpy:
        raise GraphError(f"{node.where()}: weight {name!r} is {w.dtype.name}, expected {t}")
    shape = w.shape
    if len(shape) != len(t.shape) or any(isinstance(d, int) and d != s
                                         for d, s in zip(t.shape, shape)):
        raise GraphError(f"{node.where()}: weight {name!r} has shape {format_shape(shape)}, "
                         f"expected {format_shape(t.shape)}")
    return w


def _fold_weight_casts(nodes, bound: dict) -> tuple[list, list]:
    """``(nodes left, [(Value, array)])``: each ``cast`` of a bound float array (a
    float16 weight, which the builder casts to float32) computed once here, by the op's
    own runtime, instead of on every call; its output joins ``bound`` (``id(Value)`` ->
    array) as a weight would. A float16 checkpoint then runs at float32 speed, holding
    a float32 copy of each float16 weight."""
    left, folded = [], []
    for n in nodes:
        w = bound.get(id(n.inputs[0])) if n.op == "cast" and len(n.inputs) == 1 else None
        if isinstance(w, np.ndarray):
            (out,) = _registry.get("cast").runner()([w], n.attrs)
            bound[id(n.outputs[0])] = out
            folded.append((n.outputs[0], out))
        else:
            left.append(n)
    return left, folded


FOLD_MAX_BYTES = 16 << 20     # a constant-only value up to this size is computed once
FOLD_TOTAL_BYTES = 256 << 20  # and at most this much of them per compiled graph


def _read_only(a):
    """``a`` made read-only (a copy when it is a writeable view: its base may be a
    caller's array); other objects as given (a QuantizedTensor's blocks are never
    written)."""
    if isinstance(a, np.ndarray) and a.flags.writeable:
        if a.base is not None:
            a = a.copy()
        a.flags.writeable = False
    return a


def _static_bytes(t) -> float:
    """The bytes of a value of type ``t``; infinite when a dim is symbolic."""
    if not all(isinstance(d, int) for d in t.shape):
        return float("inf")
    return float(np.prod(t.shape, dtype=np.float64)) * np.dtype(t.dtype.numpy).itemsize


def _fold_constants(nodes, outputs) -> tuple[list, list]:
    """``(nodes left, [(Value, array)])``: the nodes that read only constants (tables a
    spec builds from its params: a DFT matrix, relative-position buckets, ALiBi slopes)
    run once here, by their ops' own runtimes, instead of on every call. Only built-in
    row-wise ops fold (a user's custom op may not be pure), only values with static
    shapes of at most ``FOLD_MAX_BYTES`` (``FOLD_TOTAL_BYTES`` in all), never a graph
    output (a caller may write into what it gets). The values that later nodes read are
    kept, read-only."""
    known: dict[int, np.ndarray] = {}
    left, done, total = [], [], 0.0
    for n in nodes:
        opdef = _registry.get(n.op)
        size = sum(_static_bytes(o.type) for o in n.outputs)
        foldable = (isinstance(opdef.run, str) and opdef.sequence_axis is None
                    and all(id(x) in known for x in n.inputs)
                    and size <= FOLD_MAX_BYTES and total + size <= FOLD_TOTAL_BYTES
                    and not any(o is x for o in n.outputs for x in outputs))
        if not foldable:
            left.append(n)
            continue
        total += size
        try:
            outs = opdef.runner()([known[id(x)] for x in n.inputs], _run_attrs(n))
        except MaxdeclError as e:
            raise GraphError(f"{n.where()}: {e}") from e
        except Exception as e:  # noqa: BLE001 - one error type, naming the node
            raise GraphError(f"{n.where()}: {type(e).__name__}: {e}") from e
        for o, a in zip(n.outputs, outs):
            known[id(o)] = a
        done.append(n)
    read = {id(x) for n in left for x in n.inputs}
    given = {id(n.attrs["value"]) for n in done if n.op == "constant"}   # the caller's
    kept = []
    for n in done:
        for o in n.outputs:
            if id(o) in read:
                a = known[id(o)]
                kept.append((o, a if id(a) in given else _read_only(a)))
    return left, kept


def _generate(graph, preloaded, steps, nodes, fixed=None):
    """``run(env, rows)``: Python generated from the plan's ``steps`` (``maxdecl.fusion``),
    one line each; ``env`` holds the inputs, then the values known before any call (the
    bound weights, the folded casts), in the order of ``graph.inputs`` and
    ``preloaded``. ``run.steps`` maps a line number to its step index (for
    ``_failed_step``).

    ``run(env, rows, outs)``: ``outs`` is ``run.new_outputs()`` (kept by the caller
    between runs, one per thread): per step its ``StepOutputs``, or None where the
    runner does not take its outputs from one (``step_outputs.writes_into``) or where
    every output may outlive the run (``_kept_values``).

    ``fixed`` (a set of input names): ``run(env, rows, outs, memo)`` instead, whose steps that
    depend on no other input run first, and only while ``memo.values`` is None; they
    leave there the values the other steps and the outputs read, and later runs take
    them from there."""
    from . import kernels  # noqa: F401  (numba's NumPy support, loaded the fast way)
    from .kernels.step_outputs import outputs_of

    slot: dict[int, int] = {}

    def v(value) -> str:
        return f"v{slot.setdefault(id(value), len(slot))}"

    loaded = [v(x) for x in graph.inputs] + [v(x) for x in preloaded]
    flags = _fixed_steps(graph, preloaded, steps, fixed) if fixed is not None else None
    order = list(range(len(steps)))
    if flags is not None:                    # the fixed steps first, in plan order
        order = [s for s in order if flags[s]] + [s for s in order if not flags[s]]
    last = {}
    for at, s in enumerate(order):
        for x in steps[s].inputs:
            last[v(x)] = at
    dies_at: dict[int, list] = {}            # step position -> the names last read there
    for name, at in last.items():
        dies_at.setdefault(at, []).append(name)
    keep = {v(x) for x in graph.outputs}
    memo = []
    if flags is not None:                    # fixed values the rest reads or returns
        made = {v(x) for s in order if flags[s] for x in steps[s].outputs}
        read = {v(x) for s in order if not flags[s] for x in steps[s].inputs} | keep
        memo = sorted(made & read, key=lambda n: int(n[1:]))
        keep |= set(memo)
    lines = ["def run(env, rows, _out):" if flags is None
             else "def run(env, rows, _out, memo):"]
    runs = [None if st.kind == "reshape" else fusion.runner(st.kind) if st.kind != "node"
            else _registry.get(nodes[st.nodes[0]].op).runner() for st in steps]
    kept = _kept_values(steps, order, v, keep, runs)
    reuse = [None] * len(steps)          # per step: the outputs whose arrays may be kept
    for s, (step, fn) in enumerate(zip(steps, runs)):
        free = [j for j, x in enumerate(step.outputs) if v(x) not in kept]
        if free and getattr(fn, "writes_into", False):
            reuse[s] = free
    lines += [f"    {name} = env[{k}]" for k, name in enumerate(loaded)]
    line_step = {}
    attrs, defs = [None] * len(steps), [None] * len(steps)
    pad = "    "
    for at, s in enumerate(order):
        if flags is not None and at == 0 and flags[s]:
            lines.append("    if memo.values is None:")
        if flags is not None and not flags[s] and (at == 0 or flags[order[at - 1]]):
            lines += _memo_lines(memo, at > 0)
            pad = "    "
        if flags is not None and flags[s]:
            pad = "        "
        step = steps[s]
        outs = ", ".join(v(x) for x in step.outputs)
        ins = ", ".join(v(x) for x in step.inputs)
        opdef = _registry.get(nodes[step.nodes[0]].op)
        into = f", out=_out[{s}]" if reuse[s] is not None else ""
        if step.kind == "node":
            call = (f"_run[{s}]([{ins}], _attrs[{s}]{into})" if opdef.sequence_axis is None
                    else f"_per_sequence(_run[{s}], [{ins}], _attrs[{s}], _defs[{s}], rows{into})")
            line = f"{pad}{outs}, = {call}" if step.outputs else f"{pad}{call}"
        elif step.kind == "reshape":
            line = f"{pad}{outs} = {ins}.reshape({step.attrs['shape']!r})"
        else:
            line = f"{pad}{outs}, = _run[{s}]([{ins}], _attrs[{s}]{into})"
        attrs[s] = step.attrs if step.kind != "node" else _run_attrs(nodes[step.nodes[0]])
        defs[s] = opdef
        lines.append(line)
        line_step[len(lines)] = s
        dead = [name for name in dies_at.get(at, ()) if name not in keep]
        if dead:
            lines.append(f"{pad}del {', '.join(sorted(dead))}")
    if flags is not None and (not order or flags[order[-1]]):
        lines += _memo_lines(memo, bool(order))
    lines.append(f"    return [{', '.join(v(x) for x in graph.outputs)}]")
    scope = {"_run": runs, "_attrs": attrs, "_defs": defs, "_per_sequence": _per_sequence}
    exec(builtins.compile("\n".join(lines), f"<maxdecl plan of {graph.name}>", "exec"), scope)
    run = scope["run"]
    run.steps = line_step
    run.names = [tuple(v(x) for x in step.inputs) for step in steps]
    plan = _slot_plan(steps, order, v, reuse)
    run.new_outputs = lambda: outputs_of(plan)
    run.outputs = threading.local()
    return run


def _kept_values(steps, order, name, keep, runs) -> set:
    """The names of the values whose arrays may outlive a run: ``keep`` (the graph's
    outputs, a fixed run's remembered values) and, step by step backwards, the inputs
    of any step that makes one of them and may return a view of its inputs (a reshape,
    a runner not marked ``writes_into``)."""
    kept = set(keep)
    for s in reversed(order):
        step = steps[s]
        if (any(name(x) in kept for x in step.outputs)
                and not getattr(runs[s], "writes_into", False)):
            kept.update(name(x) for x in step.inputs)
    return kept


def _slot_plan(steps, order, name, reuse) -> list:
    """Per step: None, or {output index (or ``step_outputs.ALL``, where every output is
    in ``reuse[s]``): slot number} for its outputs in ``reuse[s]``. Two of one type
    (dtype and symbolic shape, so one shape within a run) share a slot number when the
    first one's array is last read, itself or through any value that may view it (the
    outputs of reshapes, of runners not marked ``writes_into``, and the other outputs
    of its own step), before the step that makes the second; the slot freed last is
    taken first."""
    from .kernels.step_outputs import ALL

    made, roots, last = {}, {}, {}         # step -> buffers; value -> buffers; buffer -> at
    for at, s in enumerate(order):
        step = steps[s]
        for x in step.inputs:
            for b in roots.get(name(x), ()):
                last[b] = at
        if reuse[s] is None:
            views = frozenset().union(*(roots.get(name(x), ()) for x in step.inputs))
        else:
            made[s] = [(j, str(step.outputs[j].type)) for j in reuse[s]]
            if len(reuse[s]) == len(step.outputs):
                made[s].append((ALL, "all " + " ".join(str(x.type) for x in step.outputs)))
            views = frozenset((s, j) for j, _ in made[s])
        for x in step.outputs:
            roots[name(x)] = views
    plan, free, ends, count = [None] * len(steps), {}, {}, 0
    for at, s in enumerate(order):
        for key, n in ends.pop(at - 1, ()):      # last read by the step before: free
            free.setdefault(key, []).append(n)
        if s not in made:
            continue
        plan[s] = {}
        for j, key in made[s]:
            pool = free.get(key)
            if pool:
                n = pool.pop()
            else:
                n, count = count, count + 1
            plan[s][j] = n
            ends.setdefault(max(at, last.get((s, j), at)), []).append((key, n))
    return plan


def _fixed_steps(graph, preloaded, steps, fixed) -> list:
    """Per step: whether it reads only the inputs named in ``fixed``, preloaded values
    (weights) and other such steps' outputs."""
    known = {id(x) for x in preloaded} | {id(x) for x in graph.inputs if x.name in fixed}
    flags = []
    for step in steps:
        ok = all(id(x) in known for x in step.inputs)
        if ok:
            known.update(id(x) for x in step.outputs)
        flags.append(ok)
    return flags


def _memo_lines(memo, after_fixed: bool) -> list:
    """The lines that store (after the fixed steps) or fetch the memoised values."""
    names = ", ".join(memo) + ("," if len(memo) == 1 else "")
    if not after_fixed:                    # no fixed step: nothing to remember
        return []
    if not memo:
        return ["        memo.values = ()"]
    return [f"        memo.values = ({names})", "    else:", f"        {names} = memo.values"]


def _run_attrs(node) -> dict:
    """A node's attributes as its runner takes them; a reshape with symbolic dims also
    gets its input's declared dims (``_in``), to size those dims by name at run time."""
    if node.op == "reshape":
        return {**node.attrs, "_in": tuple(node.inputs[0].type.shape)}
    return node.attrs


def _per_sequence(fn, args, attrs, opdef, rows, out=None):
    """Run a sequence-mixing op once per sequence of a batch: row inputs cut along
    ``opdef.sequence_axis`` by ``rows``, ``PerSequence`` inputs taken per sequence; row
    outputs joined again, state outputs returned as ``PerSequence``."""
    if rows is None:
        if any(isinstance(a, PerSequence) for a in args):
            raise ValueError("a PerSequence state needs rows= (one row count per sequence)")
        return fn(args, attrs) if out is None else fn(args, attrs, out=out)
    axis = opdef.sequence_axis
    names = (list(opdef.inputs) + list(opdef.optional))[:len(args)]
    state_out = {opdef.state[n] for n in names if n in opdef.state}
    cut = [n in opdef.sequence_inputs for n in names]
    for a, c in zip(args, cut):
        if isinstance(a, PerSequence):
            if len(a) != len(rows):
                raise ValueError(f"a state of {len(a)} sequences in a batch of {len(rows)}")
        elif c and a.shape[axis] != sum(rows):
            raise ValueError(f"{a.shape[axis]} rows along axis {axis}, but the batch has "
                             f"{sum(rows)} ({rows})")
    batched = opdef.batch_runner()
    if batched is not None:
        outs = (batched(args, rows, attrs, out=out)
                if out is not None and getattr(batched, "writes_into", False)
                else batched(args, rows, attrs))
        if outs is not None:
            return [PerSequence(o) if j in state_out else o for j, o in enumerate(outs)]
    eaches, start = [], 0
    for k, n in enumerate(rows):
        each = []
        for a, c in zip(args, cut):
            if isinstance(a, PerSequence):
                each.append(a[k])
            elif c:
                index = [builtins.slice(None)] * a.ndim
                index[axis] = builtins.slice(start, start + n)
                each.append(a[tuple(index)])
            else:
                each.append(a)                      # shared: a weight
        eaches.append(each)
        start += n
    outs = [fn(each, attrs) for each in eaches]
    return [PerSequence(o[j] for o in outs) if j in state_out
            else np.concatenate([o[j] for o in outs], axis=axis) for j in range(len(outs[0]))]


def _failed_step(e: BaseException, run):
    """(step index, its input values) of the generated ``run`` frame an error left, or
    (None, [])."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is run.__code__:
            s = run.steps.get(tb.tb_lineno)
            if s is None:
                return None, []
            loc = tb.tb_frame.f_locals
            return s, [loc.get(name) for name in run.names[s]]
        tb = tb.tb_next
    return None, []
