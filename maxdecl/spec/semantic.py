"""What a schema cannot say: names resolve, ops exist, shapes evaluate and divide.

After ``parse`` (``maxdecl.spec.parse``) has turned the YAML data into a
``Spec``, ``Expander`` unrolls the layer tree for one variant, like running a
straight-line program: repeats run their body N times with the index bound,
block uses run the block's body in a fresh value namespace, every ``{expr}`` is
evaluated and every name resolved. It records problems instead of stopping, and
produces the ``Program`` the builder consumes.

``check`` runs the expander for every variant and merges the problems, so a
weight shape that breaks an encoding's block size only in ``8b`` is reported
with "(variant 8b)".
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import fnmatch
import re
from types import MappingProxyType

from .. import blocks
from ..dtypes import check_dims
from ..errors import GraphError, SpecError
from ..ops import _registry
from ..ops._registry import REQUIRED
from . import budgets
from .expr import (ExprError, evaluate, is_template, parse, render, split_template,
                   template_names)
from .marks import RawProblem, nearest_mark, pointer_escape
from .typecheck import TypeEnv
from .decls import (BlockDecl, IODecl, LayerDecl, PConst, PInput, PLayer, POp, Pos, Program,
                    PWeight, Ref)

_DTYPES = {"float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool",
           "f32", "f16", "bf16", "i8", "u8", "i32", "i64"}


def known_encodings() -> dict[str, tuple[int, int]]:
    """Encoding name -> (block_elements, block_bytes): built-ins plus any already
    registered with ``md.codecs`` (checked without importing NumPy)."""
    return blocks.known()


def _hint(word, choices) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _weight_hint(name: str, weights) -> str:
    """A hint for an unknown full weight name: when it is the tail of declared names
    (a sibling layer's weight written without its layer path), those names and how to
    write one from a block or repeat; else the closest name."""
    tails = sorted(w for w in weights if w.endswith("." + name))
    if not tails:
        parts = name.split(".")        # the closest name among the longest shared prefix's
        for k in range(len(parts) - 1, 0, -1):
            near = [w for w in weights if w.startswith(".".join(parts[:k]) + ".")]
            if near:
                return _hint(name, near)
        return _hint(name, weights)
    shown = ", ".join(repr(w) for w in tails[:3]) + (", ..." if len(tails) > 3 else "")
    return (f"; declared as {shown}: write the full name, with the block's or repeat's "
            f"index where the path varies (\"blk.{{i}}.{name}\")")


_NUMBER_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _dims_polynomial(text: str, declared) -> bool:
    """Whether ``text`` is a sum of products of declared dims with integer coefficients
    (``past+seq``, ``2*seq``), not an expression over params."""
    from .. import dims as symbolic

    if "(" in text or "{" in text:
        return False
    try:
        names = symbolic.names(text)
    except (TypeError, ValueError):
        return False
    return bool(names) and names <= set(declared)


def _unknown_beside_dims(text: str, env, dims):
    """In a dim that uses a symbolic dim, the first name that is neither a dim nor a
    param, or None."""
    try:
        names = [n.id for n in ast.walk(ast.parse(text.strip(), mode="eval"))
                 if isinstance(n, ast.Name)]
    except (SyntaxError, ValueError):
        return None
    if not set(names) & set(dims):
        return None
    return next((n for n in names if n not in dims and n not in env), None)


WEIGHT_DTYPES = ("int8", "uint8", "int32", "int64", "bool")


class _ParamValues(ast.NodeTransformer):
    """Names that are not symbolic dims replaced by their (int) values in ``env``."""

    def __init__(self, dims, env):
        self.dims, self.env = dims, env

    def visit_Name(self, node):
        if node.id in self.dims:
            return node
        return ast.copy_location(ast.Constant(self.env[node.id]), node)


def _unknown_op_hint(name, known) -> str:
    """The closest op name, or the `activation` kind an unknown op is named after."""
    from ..ops.elementwise import ACTIVATIONS

    if isinstance(name, str) and name in ACTIVATIONS:
        return f"; it is an activation: op activation with attrs {{kind: {name}}}"
    return _hint(name, known)


def _yaml11_float(text: str) -> str:
    """``text`` (a number with an exponent) as YAML 1.1 reads a float: 1.0e+10."""
    mant, exp = re.split("[eE]", text)
    if "." not in mant:
        mant += ".0"
    return f"{mant}e{exp if exp[0] in '+-' else '+' + exp}"


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def variant_env(spec: Spec, variant: str, overrides: dict | None = None):
    """(params dict, problems) for ``variant``: its hyperparameters, then ``overrides``,
    then the derived ``params`` in order (an overridden name is not re-derived)."""
    problems = []
    env: dict = {}
    raw = spec.variants.get(variant, {})
    for k, v in raw.items():
        try:
            env[k] = render(v, env)
        except ExprError as e:
            ptr = f"/variants/{pointer_escape(variant)}/{pointer_escape(k)}"
            problems.append(RawProblem(*nearest_mark(spec.marks, ptr), ptr, str(e)))
    env.update(overrides or {})
    for name, value, pos in spec.derived:
        if overrides and name in overrides:
            continue
        try:
            env[name] = render(value, env)
        except ExprError as e:
            problems.append(RawProblem(pos.line, pos.col, pos.ptr, str(e)))
    return env, problems


def select_variant(spec: Spec, variant: str, overrides: dict | None = None) -> Spec:
    """``spec`` with ``variant`` selected and its params resolved (SpecError if unknown)."""
    if variant not in spec.variants:
        raise SpecError(f"{spec.file}: unknown variant {variant!r} (variants: "
                        f"{', '.join(spec.variants)}){_hint(variant, spec.variants)}")
    env, problems = variant_env(spec, variant, overrides)
    if problems:
        p = problems[0]
        raise SpecError(f"{spec.file}:{p.line}:{p.col}: {p.message}")
    return dataclasses.replace(spec, variant=variant, params=MappingProxyType(env))


# -- pass 2: unroll one variant ----------------------------------------------------------

class Expander:
    """Unrolls ``spec`` for one variant into a Program, collecting problems."""

    def __init__(self, spec: Spec, variant: str, overrides: dict | None = None,
                 check_encodings: bool = True):
        self.spec = spec
        self.block_rule = check_encodings
        self.variant = variant
        self.env, self.problems = variant_env(spec, variant, overrides)
        self.from_weights = bool(overrides)     # params read from a checkpoint's config
        self.meter = budgets.meter()
        self.encodings = known_encodings()
        self.steps: list = []
        self.layers: list[PLayer] = []
        self.layer_pos: dict[str, Pos] = {}
        self.value_names: dict[int, str] = {}
        self.globals: dict[str, int] = {}
        self.weights: dict[str, PWeight] = {}
        self.weight_refs: list[tuple[str, Pos]] = []
        self.used_weights: set[str] = set()
        self.glob_hits: set[str] = set()
        self.map_hits: set[tuple] = set()    # formats' tensor targets, transform globs hit
        self.computed_misses: dict[str, str] = {}   # computed names this variant lacks
        self.io_names: dict[str, Pos] = {}
        self.root_outputs: list = []
        self.layer_outputs: list = []
        self.output_pos: dict = {}          # graph output name -> where it is declared
        self._vid = 0
        self._unused_seen: set = set()      # layers checked as run no times (repeat 0)
        # a layer left unexpanded after an error (its repeat count or a block parameter):
        # its weights are unknown, so "names no weight" checks would only repeat the error
        self.incomplete = False
        self.loop_indices: list[str] = []   # the indices enclosing repeats bind
        self.anonymous_uses = 0              # anonymous block uses around this point
        self._at: dict = {}
        # types are checked against the spec's encodings; weights that bring their own
        # are checked by the graph as md.build adds each node (the same rules)
        self.types = TypeEnv(spec.dims) if check_encodings else None
        self.input_types: dict[str, object] = {}

    # helpers
    def problem(self, pos: Pos, message: str) -> None:
        self.problems.append(RawProblem(pos.line, pos.col, pos.ptr, message))

    def at(self, ptr: str, key: bool = False) -> Pos:
        pos = self._at.get((ptr, key))
        if pos is None:
            pos = self._at[(ptr, key)] = Pos(ptr, *nearest_mark(self.spec.marks, ptr, key=key))
        return pos

    def new_value(self, name: str) -> int:
        self._vid += 1
        self.value_names[self._vid] = name
        return self._vid

    def render(self, raw, env, pos: Pos, what: str):
        """Evaluate a template; on error report it and return None."""
        try:
            return render(raw, env)
        except ExprError as e:
            self.problem(pos, f"{what}: {e}" if what else str(e))
            return None

    def dim(self, raw, env, pos: Pos, symbolic: bool):
        """One shape entry: an int, a declared symbolic dim, or an expression."""
        if _is_num(raw) and isinstance(raw, int):
            value = raw
        elif isinstance(raw, str) and symbolic and raw.strip() in self.spec.dims:
            return raw.strip()
        elif isinstance(raw, str) and symbolic and _dims_polynomial(raw, self.spec.dims):
            return raw.strip()                  # past+seq, 2*seq: checked when bound
        elif isinstance(raw, str) and symbolic and self.dims_with_params(raw, env) is not None:
            return self.dims_with_params(raw, env)      # "{patch_len}*patches", p*patches
        elif isinstance(raw, str):
            text = raw.strip()
            try:
                if text.startswith("{") and text.endswith("}") \
                        and len(split_template(text)) == 1:
                    text = text[1:-1]
                value = evaluate(text, env)
            except ExprError as e:
                unknown = _unknown_beside_dims(text, env, self.spec.dims) if symbolic else None
                if unknown is not None:         # q*patches: name q, not the dim
                    self.problem(pos, f"shape: undefined name {unknown!r} in {text!r} (a dim "
                                      f"multiplies symbolic dims ({', '.join(self.spec.dims)}) "
                                      f"by ints and int params){_hint(unknown, env)}")
                    return None
                extra = (f" (symbolic dims: {', '.join(self.spec.dims)})"
                         if symbolic and self.spec.dims and "undefined name" in str(e) else "")
                self.problem(pos, f"shape: {e}{extra}")
                return None
        else:
            self.problem(pos, f"shape: expected an integer or expression, got {raw!r}")
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if symbolic else 1):
            self.problem(pos, f"shape: dim {raw!r} evaluates to {value!r}; expected a "
                              f"{'non-negative' if symbolic else 'positive'} integer")
            return None
        return value

    def dims_with_params(self, raw: str, env):
        """A dim over declared symbolic dims and int params (``"{patch_len}*patches"``,
        ``patch_len*patches``) with the params' values put in (``8*patches``), or None
        when ``raw`` is not one (no symbolic dim, or a name that is neither)."""
        text = raw.strip()
        if "{" in text:
            try:
                text = render(text, env)
            except ExprError:
                return None
            if not isinstance(text, str):
                return None
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except (SyntaxError, ValueError):
            return None
        dims = set(self.spec.dims)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        if not names & dims:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id not in dims:
                value = env.get(node.id)
                if not isinstance(value, int) or isinstance(value, bool):
                    return None
        swapped = _ParamValues(dims, env).visit(tree)
        text = ast.unparse(swapped).replace(" ", "")
        return text if _dims_polynomial(text, dims) else None

    def shape(self, raw, env, base_ptr: str, symbolic: bool):
        dims = [self.dim(d, env, self.at(f"{base_ptr}/{k}"), symbolic)
                for k, d in enumerate(raw)]
        if any(d is None for d in dims):
            return None
        try:
            check_dims(dims)            # at most MAX_STATIC_ELEMENTS in the known dims
        except GraphError as e:
            self.problem(self.at(base_ptr), str(e))
            return None
        return tuple(dims)

    # the program
    def run(self) -> Program:
        spec = self.spec
        if spec.variants and self.variant not in spec.variants:
            raise SpecError(f"{spec.file}: unknown variant {self.variant!r} (variants: "
                            f"{', '.join(spec.variants)}){_hint(self.variant, spec.variants)}")
        self.check_encodings()
        for io in spec.inputs:
            self.declare_input(io, (), self.globals, self.env)
        for c in spec.constants:
            value = self.render(c.value, self.env, c.pos, f"constant {c.name!r}")
            if value is not None and not (_is_num(value) or isinstance(value, (bool, list))):
                self.problem(c.pos, f"constant {c.name!r} must be a number, bool or list, "
                                    f"got {value!r}")
                value = None
            if c.name in self.globals:
                self.problem(c.pos, f"constant {c.name!r} has the name of a graph input")
            vid = self.new_value(c.name)
            self.globals[c.name] = vid
            if value is not None and self.types is not None:
                self.types.constant(vid, value, c.dtype or _default_dtype(value))
            if value is not None:
                self.steps.append(PConst(c.name, value, c.dtype or _default_dtype(value), vid,
                                         c.pos))
        ns: dict[str, int] = {}
        self.body(spec.layers, (), self.env, ns, [], ())
        for name, pos in spec.outputs:
            vid = self.lookup(name, ns, pos)
            if vid is not None:
                self.add_output(name, vid, pos, self.root_outputs)
        self.check_prefixed_logits()
        hints: dict = {}            # a repeat refers to one unknown name once a layer
        for name, pos in self.weight_refs:
            if name in self.weights:
                self.used_weights.add(name)
            else:
                if name not in hints:
                    hints[name] = _weight_hint(name, self.weights)
                self.problem(pos, f"unknown weight {name!r}" + hints[name]
                             + " (weights are <layer path>.<name> from `weights:`)")
        self.check_computed()
        self.check_batching()
        self.check_refuse()
        self.check_config_syntax()
        self.hit_format_maps()
        for w in self.weights.values():
            if w.name not in self.used_weights:
                self.problem(w.pos, f"weight {w.name!r} is declared but no op uses it "
                                    f"(reference it as .{w.name.rsplit('.', 1)[-1]} from "
                                    f"the declaring layer or one inside it, else by its "
                                    f"full name)")
        return Program(
            name=spec.name, file=spec.file, variant=self.variant,
            params=MappingProxyType(dict(self.env)), steps=tuple(self.steps),
            outputs=tuple(self.root_outputs + self.layer_outputs), layers=tuple(self.layers),
            value_names=MappingProxyType(self.value_names))

    def check_encodings(self):
        spec = self.spec
        entries = [(spec.encoding_default, self.at("/encodings/default"))]
        entries += [(e, pos) for _, e, pos in spec.encoding_overrides]
        for raw, pos in entries:
            enc = self.render(raw, self.env, pos, "encoding")
            if enc is not None and str(enc).lower() not in self.encodings:
                self.problem(pos, f"unknown encoding {enc!r} (known: "
                                  f"{', '.join(sorted(self.encodings))})"
                                  + _hint(str(enc).lower(), self.encodings))

    def encoding_for(self, name: str, env) -> str | None:
        for glob, enc, _ in self.spec.encoding_overrides:
            if fnmatch.fnmatchcase(name, glob):
                self.glob_hits.add(glob)
                break
        else:
            enc = self.spec.encoding_default
        try:
            value = str(render(enc, env)).lower()
        except ExprError:
            return None     # reported by check_encodings
        return value if value in self.encodings else None

    def declare_input(self, io: IODecl, path: tuple, ns: dict, env):
        full = ".".join(path + (io.name,))
        if full in self.io_names:
            self.problem(io.pos, f"graph input {full!r} is declared twice")
        self.io_names[full] = io.pos
        vid = self.new_value(io.name)
        ns[io.name] = vid
        if io.dtype not in _DTYPES:
            return   # the schema reports it
        shape = self.shape(io.shape, env, f"{io.pos.ptr}/shape", symbolic=True)
        self.steps.append(PInput(full, io.dtype, shape or (), vid, path, io.pos))
        if shape is not None and self.types is not None:
            self.types.input(vid, io.dtype, shape)
            self.input_types[full] = self.types.values.get(vid)

    def check_prefixed_logits(self) -> None:
        """A lone ``X.logits`` output and no ``logits``: a named layer published it, so it
        took the layer's path, and generation (which reads ``logits``) would not find it."""
        names = [n for n, _ in self.root_outputs + self.layer_outputs]
        prefixed = [n for n in names if n.endswith(".logits")]
        if len(prefixed) == 1 and "logits" not in names:
            name = prefixed[0]
            pos = self.output_pos[name]
            layer = name[:-len(".logits")]
            self.problem(pos, f"outputs: 'logits' of the named layer {layer!r} is the graph "
                              f"output {name!r} (a named layer's outputs take its path), "
                              "and generation reads 'logits': publish it from a layer "
                              "without a name or from the top-level outputs")

    def add_output(self, name: str, vid: int, pos: Pos, into: list):
        if any(n == name for n, _ in self.root_outputs + self.layer_outputs):
            self.problem(pos, f"graph output {name!r} is declared twice")
            return
        if self.types is not None and name in self.input_types:
            why = self.types.state_mismatch(self.input_types[name], self.types.values.get(vid))
            if why:
                self.problem(pos, f"state output {name!r} {why}")
        into.append((name, vid))
        self.output_pos[name] = pos

    def lookup(self, name: str, ns: dict, pos: Pos):
        if name in ns:
            return ns[name]
        if name in self.globals:
            return self.globals[name]
        known = list(ns) + list(self.globals)
        self.problem(pos, f"undefined value {name!r}{_hint(name, known)} (values come from "
                          "`inputs`, `constants` or an earlier `out`)")
        return None

    # the tree
    def body(self, layers, path, env, ns, wscope, blocks):
        for decl in layers:
            self.layer(decl, path, env, ns, wscope, blocks)

    def layer(self, decl: LayerDecl, path, env, ns, wscope, blocks):
        kinds = [k for k, v in (("op", decl.op), ("layers", decl.children or None),
                                ("block", decl.block)) if v is not None]
        weights_only = not kinds and decl.weights and not (decl.ins or decl.outs or decl.attrs)
        if len(kinds) != 1 and not weights_only:
            found = " and ".join(f"`{k}`" for k in kinds) or (
                "an empty `layers:` list" if decl.layers_given else "none")
            self.problem(decl.pos, f"a layer needs exactly one of `op`, `layers` or `block` "
                                   f"(found {found}; a layer with only `weights:` declares "
                                   "weights that later ops use by full name)")
            self.bind([n for n, _ in decl.outs], ns)
            return
        if decl.repeat is None:
            if not self.unroll(decl, path):
                self.instance(decl, path, env, ns, wscope, blocks)
            return
        rpos = self.at(f"{decl.pos.ptr}/repeat")
        raw = decl.repeat
        if isinstance(raw, str):
            text = raw.strip()
            if not (text.startswith("{") and text.endswith("}")):
                raw = "{" + text + "}"
        before = len(self.problems)
        n = self.render(raw, env, rpos, "repeat")
        if n is None:
            if len(self.problems) == before:
                self.problem(rpos, "repeat must be an integer >= 0, got None")
            self.incomplete = True
            return
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            self.incomplete = True
            name = raw.strip("{} ") if isinstance(raw, str) else None
            if name in self.spec.variants.get(self.variant, {}):
                # the bad value is the variant's hyperparameter: point at it
                ptr = f"/variants/{pointer_escape(self.variant)}/{pointer_escape(name)}"
                self.problem(self.at(ptr), f"{name} is a repeat count (line {rpos.line}): "
                                           f"expected an integer >= 0, got {n!r}")
            else:
                self.problem(rpos, f"repeat must be an integer >= 0, got {n!r}")
            return
        if budgets.check_repeat(n):
            self.problem(rpos, budgets.check_repeat(n))
            self.incomplete = True
            return
        if n == 0:
            self.unused(decl, set(env) | {decl.index})
            return
        nested = (not decl.index_given and decl.index in self.loop_indices
                  and decl.index in env)
        if nested and n == 1:   # an optional part inside a repeat keeps its index
            if not self.unroll(decl, path):
                self.instance(decl, path, env, ns, wscope, blocks)
            return
        if nested and _uses_name(decl, decl.index):     # a real loop names its own
            self.problem(rpos, "a repeat inside another needs its own index: `i` is the "
                               "enclosing repeat's (write `index: j` and use `{j}`)")
            self.incomplete = True
            return
        self.loop_indices.append(decl.index)
        try:
            for k in range(n):
                if self.unroll(decl, path):
                    return
                self.instance(decl, path, {**env, decl.index: k}, ns, wscope, blocks)
        finally:
            self.loop_indices.pop()

    def unused(self, decl: LayerDecl, known: set) -> None:
        """What can be checked of a layer this variant runs no times (a repeat of 0):
        its ops and attribute names exist, and every expression in it parses and reads
        only known names (``known``: params, indices, block params); not its types,
        which depend on values it never gets."""
        if id(decl) in self._unused_seen:
            return
        self._unused_seen.add(id(decl))
        dims = set(self.spec.dims)

        def names_in(raw, pos, what, bare=False):
            texts = [raw] if not isinstance(raw, (list, tuple)) else list(raw)
            for t in texts:
                if isinstance(t, (list, tuple)):
                    names_in(t, pos, what, bare)
                    continue
                if not isinstance(t, str) or (not bare and "{" not in t):
                    continue
                text = t if "{" in t else "{" + t + "}"
                try:
                    missing = sorted(template_names(text) - known - (dims if bare else set()))
                except ExprError as e:
                    self.problem(pos, f"{what}: {e}")
                    continue
                if missing:
                    self.problem(pos, f"{what}: undefined name {missing[0]!r} in {t!r}"
                                      + _hint(missing[0], sorted(known)))

        if decl.name is not None:
            names_in(decl.name, decl.pos, "name")
        for w in decl.weights:
            names_in(list(w.shape), w.pos, f"weight {w.local!r}", bare=True)
            names_in(w.absent, w.absent_pos or w.pos, "absent")
            names_in(w.required, w.required_pos or w.pos, "required")
        for raw, pos in decl.ins:
            names_in(raw, pos, "input")
        for _, raw, pos in decl.with_:
            names_in(raw, pos, "with")
        if decl.block is not None and decl.block not in self.spec.blocks:
            self.problem(self.at(f"{decl.pos.ptr}/block"), f"unknown block {decl.block!r}"
                         + _hint(decl.block, list(self.spec.blocks)))
        if decl.op is not None:
            opdef = _registry.REGISTRY.get(decl.op)
            if opdef is None or opdef.kind == "leaf":
                self.problem(self.at(f"{decl.pos.ptr}/op"), f"unknown op {decl.op!r}"
                             + _hint(decl.op, _registry.spec_ops()))
            for key, raw, vpos, kpos in decl.attrs:
                if opdef is not None and key not in opdef.attrs:
                    self.problem(kpos, f"unknown attribute {key!r} for {decl.op}"
                                 + _hint(key, opdef.attrs))
                names_in(raw, vpos, f"attribute {key!r}")
        for child in decl.children:
            if child.repeat is not None:
                names_in(child.repeat, self.at(f"{child.pos.ptr}/repeat"), "repeat", bare=True)
            self.unused(child, known | ({child.index} if child.repeat is not None else set()))

    def unroll(self, decl: LayerDecl, path: tuple) -> bool:
        """Count one layer instance; True (reported) past budgets.MAX_UNROLLED, or when
        its path or a name under it is past MAX_PATH_CHARS or MAX_LAYER_DEPTH."""
        if self.meter.unroll_reported:
            return True
        names = [decl.name or "", *(w.local for w in decl.weights),
                 *(r for r, _ in decl.ins if isinstance(r, str)), *(o for o, _ in decl.outs),
                 *(i.name for i in decl.inputs), *(o for o, _ in decl.outputs)]
        cost = (len(names) + len(decl.ins) + len(decl.attrs) + len(decl.with_)
                + sum(len(w.shape) for w in decl.weights) + sum(len(i.shape) for i in decl.inputs))
        msg = self.meter.unroll(cost)
        if msg is None:
            msg = budgets.check_path(path, names)
        if msg:
            self.problem(decl.pos, msg)
        return msg is not None

    def instance(self, decl: LayerDecl, path, env, ns, wscope, blocks):
        if decl.name is not None:
            npos = self.at(f"{decl.pos.ptr}/name")
            seg = self.render(decl.name, env, npos, "name")
            if seg is None:
                return
            seg = str(seg)
            if not seg or any(not part or part.strip() != part for part in seg.split(".")):
                self.problem(npos, f"invalid layer name {seg!r}: expected dot-separated parts "
                                   "without spaces, e.g. blk.{i}")
                return
            path = path + (seg,)
            full = ".".join(path)
            if full in self.layer_pos:
                first = self.layer_pos[full]
                again = " (a repeated layer needs its index in the name, e.g. blk.{i})" \
                    if decl.repeat is not None and first.ptr == npos.ptr else ""
                if self.anonymous_uses and not again:
                    again = (" (a block use without a `name` adds no path segment: two "
                             "such uses in one layer need names)")
                self.problem(npos, f"duplicate layer name {full!r} (first at line "
                                   f"{first.line}){again}")
                self.bind([n for n, _ in decl.outs], ns)
                return
            self.layer_pos[full] = npos
            self.layers.append(PLayer(full, len(path) - 1, decl.pos))
        for io in decl.inputs:
            self.declare_input(io, path, ns, env)
        local = {}
        for w in decl.weights:
            full = ".".join(path + (w.local,))
            shape = self.shape(w.shape, env, w.shape_ptr or w.pos.ptr, symbolic=False)
            wdtype = self.weight_dtype(w)
            enc = self.encoding_for(full, env) if wdtype == "float32" else "f32"
            if not w.listed:
                self.problem(w.pos, f"weight {full!r}: expected a shape list such as [dim] "
                                    f"([] for a scalar)")
                shape = None
            elif shape == () and enc is not None and self.encodings[enc][0] > 1:
                self.problem(w.pos, f"weight {full!r} is a scalar ([]): it cannot be {enc} "
                                    "blocks; give it f32 under `encodings:`")
                shape = None
            if shape and enc is not None and self.block_rule:
                block = self.encodings[enc][0]
                if shape[-1] % block:
                    self.problem(w.pos, f"weight {full!r} {list(shape)}: last dim {shape[-1]} "
                                        f"is not a multiple of {enc}'s block of {block} "
                                        "elements; choose another encoding for it under "
                                        "`encodings.overrides`")
            if full in self.weights:
                first = self.weights[full].pos
                self.problem(w.pos, f"duplicate weight {full!r} (first at line {first.line}; "
                                    "an anonymous layer names its weights after the "
                                    "enclosing path)")
                continue
            absent = self.absent(w, full, shape, env)
            pw = PWeight(full, shape or (), enc or "f32", path, w.pos, absent,
                         self.required(w, env), wdtype)
            if self.types is not None and enc is not None:
                self.types.weight(full, shape, enc, wdtype)
            self.weights[full] = pw
            self.steps.append(pw)
            local[w.local] = full
        if local:
            wscope = wscope + [local]
        if decl.op is not None:
            self.op(decl, path, env, ns, wscope)
        elif decl.block is not None:
            self.anonymous_uses += decl.name is None
            try:
                self.use_block(decl, path, env, ns, wscope, blocks)
            finally:
                self.anonymous_uses -= decl.name is None
        else:
            self.body(decl.children, path, env, ns, wscope, blocks)
        for name, pos in decl.outputs:
            vid = self.lookup(name, ns, pos)
            if vid is not None:
                self.add_output(".".join(path + (name,)), vid, pos, self.layer_outputs)

    def weight_dtype(self, w) -> str:
        """A weight's ``dtype:`` (integer or bool weights, stored as they are), else
        float32."""
        if w.dtype_pos is None:
            return "float32"
        if w.dtype not in WEIGHT_DTYPES:
            self.problem(w.dtype_pos, f"dtype: a weight's dtype is one of "
                                      f"{', '.join(WEIGHT_DTYPES)} (float weights take "
                                      f"their encoding), got {w.dtype!r}")
            return "float32"
        return w.dtype

    def required(self, w, env) -> bool:
        """A weight's ``required:`` condition, evaluated (False when not given)."""
        raw, pos = w.required, w.required_pos
        if pos is None:
            return False
        if w.absent_pos is None:
            self.problem(pos, "required: only a weight with `absent:` can be optional; "
                              "without one it is always required")
            return False
        value = raw if isinstance(raw, bool) else self.render(raw, env, pos, "required")
        if value is None:
            return False
        if not isinstance(value, bool):
            self.problem(pos, f"required: expected true, false or a condition giving one, "
                              f"got {value!r}")
            return False
        return value

    def absent(self, w, full: str, shape, env):
        """A weight's ``absent:`` stand-in as a Ref: an earlier weight of the same shape
        (``token_embd.weight``), or a fill value (a number, or ``"{expr}"`` giving a
        number or a list of ``prod(shape)`` numbers). None when required or invalid."""
        raw, pos = w.absent, w.absent_pos
        if raw is None or pos is None:
            return None
        whole = isinstance(raw, str) and is_template(raw) and len(_parts(raw)) == 1 \
            and _parts(raw)[0][0]
        if _is_num(raw) or whole:
            value = self.render(raw, env, pos, "absent")
            return self.fill(value, full, shape, pos, "absent")
        if not isinstance(raw, str) or not raw.strip():
            self.problem(pos, f"absent: expected a weight name or a number, got {raw!r}")
            return None
        name = self.render(raw.strip(), env, pos, "absent")
        if name is None:
            return None
        name = str(name)
        other = self.weights.get(name)
        if other is None or name == full:
            self.problem(pos, f"absent: unknown weight {name!r}{_hint(name, self.weights)} "
                              "(a stand-in is a weight declared before this one)")
            return None
        if shape is not None and other.shape and tuple(other.shape) != tuple(shape):
            if self.from_weights:   # these sizes come from a checkpoint: the weight must
                self.used_weights.add(name)     # be in it (the load reports it missing)
                return None
            self.problem(pos, f"absent: weight {name!r} has shape {list(other.shape)}, but "
                              f"{full!r} is {list(shape)}")
            return None
        self.used_weights.add(name)
        return Ref("weight", name)

    def fill(self, value, full: str, shape, pos: Pos, what: str):
        """Check a fill value for weight ``full``: a number or a flat list of prod(shape)
        numbers. Returns Ref("fill", value), or None (reported)."""
        if value is None:
            return None
        if _is_num(value):
            return Ref("fill", value)
        size = 1
        for d in shape or ():
            size *= d
        if (isinstance(value, list) and all(_is_num(v) for v in value)
                and (shape is None or len(value) == size)):
            return Ref("fill", value)
        got = f"a list of {len(value)}" if isinstance(value, list) else repr(value)
        self.problem(pos, f"{what}: {full!r} needs a number or a list of {size} numbers "
                          f"(shape {list(shape or ())}), got {got}")
        return None

    def check_computed(self):
        """``formats.<fmt>.computed``: weight name -> fill value computed from params
        (the loader adds it to foreign weights); each must name a declared weight and
        evaluate, for this variant, to None, a number or a list of the right size."""
        for fmt, section in self.spec.formats.items():
            table = section.get("computed") if isinstance(section, dict) else None
            if not isinstance(table, dict):
                continue
            base = f"/formats/{pointer_escape(fmt)}/computed"
            for name, raw in table.items():
                ptr = f"{base}/{pointer_escape(name)}"
                w = self.weights.get(str(name))
                if w is None:       # a weight of other variants (or of none: reported once)
                    self.computed_misses[str(name)] = _hint(str(name), self.weights)
                    continue
                self.map_hits.add((fmt, "computed", str(name)))
                pos = self.at(ptr)
                self.fill(self.render(raw, self.env, pos, "computed"), w.name, w.shape, pos,
                          "computed")

    def check_batching(self):
        """The top-level ``batching`` gives rows or per_sequence for this variant."""
        raw = self.spec.batching
        if raw == "rows":
            return
        pos = self.at("/batching")
        value = self.render(raw, self.env, pos, "batching")
        if value is not None and value not in ("rows", "per_sequence"):
            self.problem(pos, f"batching {raw!r} gives {value!r}; expected rows or "
                              "per_sequence")

    def check_refuse(self):
        """``formats.<fmt>.refuse``: each rule's ``when`` must give true or false for this
        variant's params (the loader evaluates it again with the checkpoint's); its
        ``why`` must parse, and render where ``when`` holds (it is only read then, so it
        may use params that exist only in the checkpoints the rule refuses)."""
        for fmt, section in self.spec.formats.items():
            rules = section.get("refuse") if isinstance(section, dict) else None
            for k, rule in enumerate(rules if isinstance(rules, list) else ()):
                if not isinstance(rule, dict):
                    continue                                # the schema reports it
                base = f"/formats/{pointer_escape(fmt)}/refuse/{k}"
                pos = self.at(f"{base}/when")
                before = len(self.problems)
                value = self.render(rule.get("when"), self.env, pos, "refuse")
                if len(self.problems) == before and not isinstance(value, bool):
                    self.problem(pos, f"refuse: when {rule.get('when')!r} gives {value!r}; "
                                      "expected true or false")
                why, why_pos = rule.get("why", ""), self.at(f"{base}/why")
                if value is True:
                    self.render(why, self.env, why_pos, "refuse")
                elif isinstance(why, str):
                    try:
                        template_names(why)
                    except ExprError as e:
                        self.problem(why_pos, f"refuse: {e}")

    def check_config_syntax(self):
        """``formats.hf.config`` and ``formats.gguf.metadata`` alternatives that are
        expressions must parse and use only what expressions allow (their names are the
        checkpoint's keys, known only at load, where a failing alternative is skipped)."""
        for fmt, key in (("hf", "config"), ("gguf", "metadata")):
            section = self.spec.formats.get(fmt)
            table = section.get(key) if isinstance(section, dict) else None
            for name, alts in (table.items() if isinstance(table, dict) else ()):
                many = isinstance(alts, list)
                for k, alt in enumerate(alts if many else [alts]):
                    if not (isinstance(alt, str) and is_template(alt)):
                        continue
                    ptr = (f"/formats/{fmt}/{key}/{pointer_escape(str(name))}"
                           + (f"/{k}" if many else ""))
                    try:
                        for is_expr, text in split_template(alt):
                            if is_expr:
                                parse(text)
                    except ExprError as e:
                        self.problem(self.at(ptr), f"formats.{fmt}.{key}.{name}: {e}")
        self.check_map_conditions()

    def check_map_conditions(self):
        """A ``tensors`` entry ``{name, when}``: ``when`` gives true or false from the
        params and the source's placeholders (each taken as 0 here)."""
        for fmt, section in self.spec.formats.items():
            tensors = section.get("tensors") if isinstance(section, dict) else None
            for source, target in (tensors.items() if isinstance(tensors, dict) else ()):
                if not (isinstance(target, dict) and isinstance(target.get("when"), str)):
                    continue
                ptr = f"/formats/{pointer_escape(fmt)}/tensors/{pointer_escape(str(source))}"
                holes = {h: 0 for h in re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", str(source))}
                value = self.render(target["when"], {**self.env, **holes},
                                    self.at(f"{ptr}/when"), "when")
                if value is not None and not isinstance(value, bool):
                    self.problem(self.at(f"{ptr}/when"), f"when {target['when']!r} gives "
                                                         f"{value!r}; expected true or false")

    def hit_format_maps(self):
        """Record which ``formats.<fmt>.tensors`` targets and ``transforms`` globs name a
        weight of this variant (``check`` reports those that name none in any)."""
        names = list(self.weights)
        for fmt, kind, key, pattern in format_map_entries(self.spec):
            if any(pattern(n) for n in names):
                self.map_hits.add((fmt, kind, key))

    def ref(self, raw, pos: Pos, env, ns, wscope):
        """Resolve one op input to a Ref (or None after reporting a problem)."""
        if _is_num(raw):
            return Ref("scalar", raw)
        if not isinstance(raw, str) or not raw.strip():
            self.problem(pos, f"expected a value name, .weight, weight name or number, "
                              f"got {raw!r}")
            return None
        text = raw.strip()
        if _NUMBER_TEXT.match(text):        # YAML 1.1 reads 1e10 and 1.0e10 as strings
            self.problem(pos, f"{text!r} is a string, not a number, to YAML 1.1: an "
                              f"exponent needs a dot and a sign ({_yaml11_float(text)}), or "
                              f"write the expression \"{{{text}}}\"")
            return None
        parts = None
        if is_template(text):
            try:
                parts = split_template(text)
            except ExprError as e:
                self.problem(pos, str(e))
                return None
        if parts is not None and len(parts) == 1 and parts[0][0]:
            v = self.render(text, env, pos, "")
            if v is None:
                return None
            if not _is_num(v):
                tip = (f" (a value or weight named by a param is text around the "
                       f"braces: \"{{pre}}.weight\", not \"{{name}}\")"
                       if isinstance(v, str) else
                       " (for a condition known from the params, a constant of dtype bool, "
                       "or a 0/1 `repeat:` on the op that needs it)" if isinstance(v, bool)
                       else "")
                self.problem(pos, f"{text!r} evaluates to {v!r}; an op input expression "
                                  f"must give a number (a scalar constant){tip}")
                return None
            return Ref("scalar", v)
        if text.startswith("."):
            local = text[1:]
            for scope in reversed(wscope):
                if local in scope:
                    self.used_weights.add(scope[local])
                    return Ref("weight", scope[local])
            declared = sorted({k for s in wscope for k in s})
            elsewhere = sorted(n for n in self.weights if n.rsplit(".", 1)[-1] == local)
            where = (f"; {elsewhere[-1]!r} is another layer's (a sibling's weights are not "
                     "visible as .name): use its full name" if elsewhere else "")
            self.problem(pos, f"no weight {local!r} in this layer or an enclosing one "
                              f"(declared: {', '.join(declared) or 'none'})"
                              + (where or _hint(local, declared)))
            return None
        if "." in text or parts is not None:
            name = self.render(text, env, pos, "")
            if name is None:
                return None
            self.weight_refs.append((str(name), pos))
            return Ref("weight", str(name))
        vid = self.lookup(text, ns, pos)
        return None if vid is None else Ref("value", vid)

    def op(self, decl: LayerDecl, path, env, ns, wscope):
        opos = self.at(f"{decl.pos.ptr}/op")
        opdef = _registry.REGISTRY.get(decl.op)
        n_problems = len(self.problems)
        refs = [self.ref(raw, pos, env, ns, wscope) for raw, pos in decl.ins]
        outs = [n for n, _ in decl.outs]
        if opdef is None or opdef.kind == "leaf":
            known = _registry.spec_ops()
            self.problem(opos, f"unknown op {decl.op!r}{_unknown_op_hint(decl.op, known)}")
            self.bind(outs, ns)
            return
        ipos = self.at(f"{decl.pos.ptr}/in")
        lo, hi = opdef.arity()
        names = list(opdef.inputs) + [f"{n}?" for n in opdef.optional]
        if len(refs) < lo or (hi is not None and len(refs) > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi is not None else f"{lo}+"
            self.problem(ipos if decl.ins else decl.pos,
                         f"{decl.op} takes {want} input{'s' if hi != 1 else ''} "
                         f"({', '.join(names)}), got {len(refs)}")
        attrs = {}
        for key, raw, vpos, kpos in decl.attrs:
            if key not in opdef.attrs:
                known = ", ".join(opdef.attrs) or "none"
                extra = (f" ({key!r} is an input of {decl.op}: list it in `in:`)"
                         if key in (*opdef.inputs, *opdef.optional) else "")
                self.problem(kpos, f"unknown attribute {key!r} for {decl.op} (known: {known})"
                                   + _hint(key, opdef.attrs) + extra)
                continue
            try:
                attrs[key] = render(raw, env)
            except ExprError as e:
                self.problem(vpos, f"attribute {key!r}: {e}")
                continue
            if key in opdef.dim_attrs and self.types is not None:
                self.check_dim_attr(decl.op, key, attrs[key], env, vpos)
        written = {k for k, *_ in decl.attrs}
        for key, default in opdef.attrs.items():
            if default is REQUIRED and key not in written:
                self.problem(opos, f"{decl.op} needs attribute {key!r}")
        n_out = opdef.n_outputs(len(refs), attrs)
        if n_out is not None and decl.outs and len(outs) != n_out:
            self.problem(self.at(f"{decl.pos.ptr}/out"),
                         f"{decl.op} here returns {n_out} output{'s' if n_out != 1 else ''}, "
                         f"but `out` names {len(outs)}")
        if not decl.outs and f"{decl.pos.ptr}/out" not in self.spec.marks:
            self.problem(decl.pos, f"{decl.op}: missing `out`: name the value(s) it produces")
        vids = self.bind(outs, ns)
        if all(r is not None for r in refs):
            self.steps.append(POp(decl.op, path, tuple(refs), tuple(vids),
                                  MappingProxyType(attrs), opos))
            if self.types is not None and len(self.problems) == n_problems:
                why = self.types.op(decl.op, refs, attrs, vids, ".".join(path))
                if why:
                    self.problem(opos, why)

    def check_dim_attr(self, op: str, key: str, value, env, pos: Pos) -> None:
        """Every name in a dims attribute (a reshape's shape) is a declared dim."""
        for name in self.types.undeclared(value):
            if name in env:
                fix = f"; {name!r} is a parameter: write \"{{{name}}}\" for its value"
            else:
                fix = _hint(name, list(self.spec.dims) + list(env))
            declared = ", ".join(self.spec.dims) or "none"
            self.problem(pos, f"{op}: {key}: {name!r} is not a declared dim (dims: "
                              f"{declared}){fix}")

    def bind(self, names, ns) -> list[int]:
        vids = []
        for n in names:
            vid = self.new_value(n)
            ns[n] = vid
            vids.append(vid)
        return vids

    def use_block(self, decl: LayerDecl, path, env, ns, wscope, blocks):
        bpos = self.at(f"{decl.pos.ptr}/block")
        block: BlockDecl | None = self.spec.blocks.get(decl.block)
        outs = [n for n, _ in decl.outs]
        if block is None:
            self.problem(bpos, f"unknown block {decl.block!r} (blocks: "
                               f"{', '.join(self.spec.blocks) or 'none'})"
                               + _hint(decl.block, self.spec.blocks))
            self.bind(outs, ns)
            return
        if decl.block in blocks:
            self.problem(bpos, f"block {decl.block!r} uses itself "
                               f"({' -> '.join(blocks + (decl.block,))})")
            self.bind(outs, ns)
            return
        benv = dict(self.env)
        given = set()
        before = len(self.problems)
        for key, raw, pos in decl.with_:
            if key not in block.params:
                self.problem(pos, f"block {block.name!r} has no parameter {key!r} "
                                  f"(parameters: {', '.join(block.params) or 'none'})"
                                  + _hint(key, block.params))
                continue
            given.add(key)
            benv[key] = self.render(raw, env, pos, f"parameter {key!r}")
        missing = [p for p in block.params if p not in given]
        if missing:
            self.problem(bpos, f"block {block.name!r} needs `with:` {', '.join(missing)}")
        if len(self.problems) > before:
            # what the block would report next only follows from these errors
            self.incomplete = True
            self.bind(outs, ns)
            return
        refs = [self.ref(raw, pos, env, ns, wscope) for raw, pos in decl.ins]
        if len(refs) != len(block.inputs):
            self.problem(self.at(f"{decl.pos.ptr}/in") if decl.ins else bpos,
                         f"block {block.name!r} takes {len(block.inputs)} input(s) "
                         f"({', '.join(n for n, _ in block.inputs)}), got {len(refs)}")
        bns: dict[str, int] = {}
        for (name, _), r in zip(block.inputs, refs):
            if r is None:
                bns[name] = self.new_value(name)
            elif r.kind == "value":
                bns[name] = r.target
            else:
                self.problem(self.at(f"{decl.pos.ptr}/in"),
                             f"block inputs must be values, got {r.kind} {r.target!r}")
                bns[name] = self.new_value(name)
        self.body(block.layers, path, benv, bns, wscope, blocks + (decl.block,))
        if len(outs) != len(block.outputs):
            self.problem(self.at(f"{decl.pos.ptr}/out") if decl.outs else bpos,
                         f"block {block.name!r} returns {len(block.outputs)} value(s) "
                         f"({', '.join(n for n, _ in block.outputs)}), but `out` names "
                         f"{len(outs)}")
        results = [self.lookup(name, bns, pos) for name, pos in block.outputs]
        for name, vid in zip(outs, results):
            ns[name] = vid if vid is not None else self.new_value(name)


def _uses_name(decl: LayerDecl, name: str) -> bool:
    """Whether any expression in ``decl``'s subtree (names, shapes, inputs, attributes,
    block parameters, inner repeat counts) reads ``name``."""
    def reads(raw) -> bool:
        if isinstance(raw, (list, tuple)):
            return any(reads(r) for r in raw)
        if not isinstance(raw, str):
            return False
        try:
            return name in template_names(raw if "{" in raw else "{" + raw + "}")
        except ExprError:
            return False

    if reads(decl.name) or any(reads(list(w.shape)) or reads(w.absent) or reads(w.required)
                               for w in decl.weights):
        return True
    if any(reads(r) for r, _ in decl.ins) or any(reads(r) for _, r, _ in decl.with_):
        return True
    if any(reads(r) for _, r, _, _ in decl.attrs):
        return True
    return any(reads(c.repeat) or (not (c.repeat is not None and c.index == name)
                                   and _uses_name(c, name)) for c in decl.children)


def _parts(text: str) -> list:
    try:
        return split_template(text)
    except ExprError:
        return [(False, text)]


def _default_dtype(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    return "float32"


# -- entry points -----------------------------------------------------------------------

def check(spec: Spec) -> list[RawProblem]:
    """Semantic problems of ``spec`` over all its variants (one per position)."""
    problems: list[RawProblem] = []
    variants = list(spec.variants) or [spec.variant]
    # variants must all define the same hyperparameters
    if spec.variants:
        ref_name = spec.default_variant
        ref_keys = list(spec.variants.get(ref_name, {}))
        for v, hp in spec.variants.items():
            missing = [k for k in ref_keys if k not in hp]
            if missing and v != ref_name:
                ptr = f"/variants/{pointer_escape(v)}"
                problems.append(RawProblem(*nearest_mark(spec.marks, ptr, key=True), ptr,
                                           f"variant {v!r} lacks {', '.join(missing)} "
                                           f"(defined by {ref_name!r})"))
    per_variant: dict[tuple, tuple[RawProblem, list]] = {}
    hits: set[str] = set()
    map_hits: set[tuple] = set()
    incomplete = False
    misses: dict[str, str] = {}
    for v in variants:
        ex = Expander(spec, v)
        try:
            ex.run()
        except SpecError as e:
            problems.append(RawProblem(1, 1, "", str(e)))
            continue
        hits |= ex.glob_hits
        map_hits |= ex.map_hits
        misses.update(ex.computed_misses)
        incomplete |= ex.incomplete
        seen_here = set()
        for p in ex.problems:
            key = (p.line, p.col)
            if key in seen_here:
                continue
            seen_here.add(key)
            if key in per_variant:
                per_variant[key][1].append(v)
            else:
                per_variant[key] = (p, [v])
    for p, vs in per_variant.values():
        if len(variants) > 1 and len(vs) < len(variants):
            p = dataclasses.replace(p, message=f"{p.message} (variant{'s' if len(vs) > 1 else ''}"
                                               f" {', '.join(vs)})")
        problems.append(p)
    if incomplete:      # some layers were not expanded: their weights are unknown
        return problems
    for glob, _, pos in spec.encoding_overrides:
        if glob not in hits:
            problems.append(RawProblem(pos.line, pos.col, pos.ptr,
                                       f"encoding override {glob!r} matches no weight in any "
                                       "variant (or only weights an earlier override takes)"))
    problems += format_map_problems(spec, map_hits)
    for fmt, section in spec.formats.items():
        table = section.get("computed") if isinstance(section, dict) else None
        for name in (table if isinstance(table, dict) else ()):
            if (fmt, "computed", str(name)) not in map_hits and str(name) in misses:
                ptr = f"/formats/{pointer_escape(fmt)}/computed/{pointer_escape(str(name))}"
                problems.append(RawProblem(*nearest_mark(spec.marks, ptr, key=True), ptr,
                                           f"computed: unknown weight {name!r} (no variant "
                                           f"declares it){misses[str(name)]}"))
    return problems


_MAP_PARAMS = {"hf": "config", "gguf": "metadata"}   # format -> its param-name -> key table


def format_map_entries(spec: Spec):
    """``(fmt, kind, key, matcher)`` per ``formats.<fmt>.tensors`` target pattern
    (``{i}``: a non-negative integer) and ``transforms`` glob: ``matcher(name)`` says
    whether a spec weight name fits it."""
    for fmt, section in spec.formats.items():
        if not isinstance(section, dict):
            continue
        tensors = section.get("tensors")
        for target in (tensors.values() if isinstance(tensors, dict) else ()):
            for one in _map_targets(target):
                rx = re.compile(_target_regex(one))
                yield fmt, "tensors", one, rx.fullmatch
        transforms = section.get("transforms")
        for glob in (transforms if isinstance(transforms, dict) else ()):
            yield (fmt, "transforms", glob,
                   lambda name, g=str(glob): fnmatch.fnmatchcase(name, g))


def _map_targets(target) -> list:
    """The spec weight names of one ``tensors`` entry: its string, or its split's list."""
    if isinstance(target, str):
        return [target] if target else []
    if isinstance(target, dict) and isinstance(target.get("split"), list):
        return [t for t in target["split"] if isinstance(t, str) and t]
    if isinstance(target, dict) and isinstance(target.get("fallback"), str):
        return [target["fallback"]] if target["fallback"] else []
    if isinstance(target, dict) and isinstance(target.get("name"), str):
        return [target["name"]] if target["name"] else []
    return []


def _target_regex(target: str) -> str:
    """The regex of a tensor-map target such as ``blk.{i}.attn_q.weight`` (a ``*``, the
    text its source's ``*`` matched, stands for any text)."""
    def literal(text):
        return ".*".join(re.escape(part) for part in text.split("*"))
    out, last = [], 0
    for m in re.finditer(r"\{[A-Za-z_][A-Za-z0-9_]*\}", target):
        out.append(literal(target[last:m.start()]))
        out.append("(?:0|[1-9][0-9]*)")
        last = m.end()
    out.append(literal(target[last:]))
    return "".join(out)


def format_map_problems(spec: Spec, map_hits: set) -> list[RawProblem]:
    """The ``formats`` entries that name nothing: a tensor target or transform glob no
    weight of any variant fits, a metadata or config entry for a name that is not a
    param of the spec (the loader would drop it without a word)."""
    problems = []
    for fmt, kind, key, _ in format_map_entries(spec):
        if (fmt, kind, key) not in map_hits:
            if kind == "tensors":
                tensors = spec.formats[fmt]["tensors"]
                source = next(s for s, t in tensors.items() if key in _map_targets(t))
                ptr = f"/formats/{pointer_escape(fmt)}/tensors/{pointer_escape(str(source))}"
                msg = (f"tensors: target {key!r} names no weight of the spec in any variant "
                       "(a weight that only some configurations declare needs a variant "
                       "that declares it)")
                pos = nearest_mark(spec.marks, ptr)
            else:
                ptr = f"/formats/{pointer_escape(fmt)}/transforms/{pointer_escape(str(key))}"
                msg = (f"transforms: {key!r} matches no weight of the spec in any variant "
                       "(a weight that only some configurations declare needs a variant "
                       "that declares it)")
                pos = nearest_mark(spec.marks, ptr, key=True)
            problems.append(RawProblem(*pos, ptr, msg))
    params = set(spec.params) | {d[0] for d in spec.derived}
    params |= {k for hp in spec.variants.values() if isinstance(hp, dict) for k in hp}
    for fmt, table_key in _MAP_PARAMS.items():
        section = spec.formats.get(fmt)
        table = section.get(table_key) if isinstance(section, dict) else None
        for name in (table if isinstance(table, dict) else ()):
            if name not in params:
                ptr = f"/formats/{pointer_escape(fmt)}/{table_key}/{pointer_escape(str(name))}"
                problems.append(RawProblem(
                    *nearest_mark(spec.marks, ptr, key=True), ptr,
                    f"{table_key}: {name!r} is not a param of the spec"
                    + _hint(str(name), params)))
    return problems


def problem_order(p) -> tuple:
    """Sort key of problems: a spent budget first (its ``(limit MAX_...)`` stops the
    check, and the problems after it, such as values never defined, follow from it),
    then by position."""
    return ("(limit MAX_" not in p.message, p.line, p.col)


def expand_or_raise(spec: Spec, variant: str, params: dict | None = None,
                    check_encodings: bool = True) -> Program:
    """The Program of ``spec`` for ``variant``; SpecError on the first problem.

    ``check_encodings=False`` skips the encoding block-size rule, for weights that
    bring their own encodings."""
    ex = Expander(spec, variant, params, check_encodings)
    prog = ex.run()
    if ex.problems:
        ex.problems.sort(key=problem_order)
        p = ex.problems[0]
        more = len(ex.problems) - 1
        tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise SpecError(f"{spec.file}:{p.line}:{p.col}: {p.message}{tail}")
    return prog
