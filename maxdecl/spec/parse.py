"""Pass 1: loaded YAML data -> a frozen ``Spec``, tolerating malformed parts.

Parts with the wrong shape are skipped (the JSON Schema reports them), so the
semantic pass can still check the rest and every problem is reported at once.
"""

from __future__ import annotations

from types import MappingProxyType

from .budgets import MAX_RANK
from .marks import RawProblem, nearest_mark, pointer_escape
from .model import BlockDecl, ConstDecl, IODecl, LayerDecl, Pos, Spec, WeightDecl


def _hint(word, choices) -> str:
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class _Parser:
    def __init__(self, marks, file):
        self.marks = marks
        self.file = file
        self.problems: list[RawProblem] = []

    def pos(self, ptr: str, key: bool = False) -> Pos:
        line, col = nearest_mark(self.marks, ptr, key=key)
        return Pos(ptr, line, col)

    def shape(self, shape, ptr: str) -> tuple:
        """A shape list as a tuple; () with a problem past budgets.MAX_RANK dims (every
        unrolled instance would evaluate each one)."""
        if not isinstance(shape, list):
            return ()
        if len(shape) > MAX_RANK:
            self.problems.append(RawProblem(*nearest_mark(self.marks, ptr), ptr,
                                            f"shape has {len(shape):,} dims, over the limit "
                                            f"of {MAX_RANK} (MAX_RANK)"))
            return ()
        return tuple(shape)

    def io(self, data, ptr) -> tuple:
        out = []
        if not isinstance(data, dict):
            return ()
        for name, d in data.items():
            p = f"{ptr}/{pointer_escape(name)}"
            if not isinstance(d, dict):
                continue
            shape = d.get("shape")
            out.append(IODecl(str(name), str(d.get("dtype", "float32")),
                              self.shape(shape, f"{p}/shape"),
                              self.pos(p), str(d.get("doc", "") or "")))
        return tuple(out)

    def names(self, data, ptr) -> tuple:
        if isinstance(data, str):
            return ((data, self.pos(ptr)),)
        if not isinstance(data, list):
            return ()
        return tuple((str(n), self.pos(f"{ptr}/{i}")) for i, n in enumerate(data)
                     if isinstance(n, str))

    def layers(self, data, ptr) -> tuple:
        if not isinstance(data, list):
            return ()
        return tuple(self.layer(d, f"{ptr}/{i}") for i, d in enumerate(data)
                     if isinstance(d, dict))

    def layer(self, d, ptr) -> LayerDecl:
        weights = []
        if isinstance(d.get("weights"), dict):
            for k, w in d["weights"].items():
                p = f"{ptr}/weights/{pointer_escape(k)}"
                full = w if isinstance(w, dict) else {"shape": w}    # [dims] or {shape, absent}
                shape = full.get("shape")
                weights.append(WeightDecl(
                    str(k), self.shape(shape, f"{p}/shape" if isinstance(w, dict) else p),
                    self.pos(p),
                    shape_ptr=f"{p}/shape" if isinstance(w, dict) else p,
                    absent=full.get("absent"),
                    absent_pos=self.pos(f"{p}/absent") if "absent" in full else None,
                    required=full.get("required"),
                    required_pos=self.pos(f"{p}/required") if "required" in full else None,
                    dtype=full.get("dtype"),
                    dtype_pos=self.pos(f"{p}/dtype") if "dtype" in full else None,
                    listed=isinstance(shape, list) and len(shape) <= MAX_RANK))
        ins = d.get("in", ())
        ins = ins if isinstance(ins, list) else [ins] if "in" in d else []
        in_ptr = f"{ptr}/in"
        ins = tuple((v, self.pos(f"{in_ptr}/{i}" if isinstance(d.get("in"), list) else in_ptr))
                    for i, v in enumerate(ins))
        attrs = ()
        if isinstance(d.get("attrs"), dict):
            attrs = tuple((str(k), v, self.pos(f"{ptr}/attrs/{pointer_escape(k)}"),
                           self.pos(f"{ptr}/attrs/{pointer_escape(k)}", key=True))
                          for k, v in d["attrs"].items())
        with_ = ()
        if isinstance(d.get("with"), dict):
            with_ = tuple((str(k), v, self.pos(f"{ptr}/with/{pointer_escape(k)}"))
                          for k, v in d["with"].items())
        index = d.get("index", "i")
        return LayerDecl(
            pos=self.pos(ptr),
            name=d["name"] if isinstance(d.get("name"), str) else None,
            doc=str(d.get("doc", "") or ""),
            repeat=d.get("repeat") if not isinstance(d.get("repeat"), (dict, list)) else None,
            index=index if isinstance(index, str) else "i",
            index_given="index" in d,
            weights=tuple(weights),
            inputs=self.io(d.get("inputs"), f"{ptr}/inputs"),
            outputs=self.names(d.get("outputs"), f"{ptr}/outputs"),
            op=d["op"] if isinstance(d.get("op"), str) else None,
            ins=ins,
            outs=self.names(d.get("out"), f"{ptr}/out"),
            attrs=attrs,
            children=self.layers(d.get("layers"), f"{ptr}/layers"),
            layers_given="layers" in d,
            block=d["block"] if isinstance(d.get("block"), str) else None,
            with_=with_,
        )


def parse(data, marks, file: str, variant: str | None = None) -> tuple[Spec | None, list]:
    """Build a Spec from loaded YAML data, tolerating malformed parts.

    Returns ``(spec, problems)``; ``spec`` is None only when ``data`` is not a mapping.
    """
    P = _Parser(marks, file)
    if not isinstance(data, dict):
        return None, []
    variants = {}
    if isinstance(data.get("variants"), dict):
        variants = {str(k): dict(v) for k, v in data["variants"].items() if isinstance(v, dict)}
    default = data.get("default_variant")
    if not isinstance(default, str) or default not in variants:
        if isinstance(default, str) and variants:
            P.problems.append(RawProblem(*nearest_mark(marks, "/default_variant"),
                                         "/default_variant",
                                         f"default_variant {default!r} is not a variant "
                                         f"(variants: {', '.join(variants)})"
                                         + _hint(default, variants)))
        default = next(iter(variants), "")
    derived = ()
    if isinstance(data.get("params"), dict):
        derived = tuple((str(k), v, P.pos(f"/params/{pointer_escape(k)}"))
                        for k, v in data["params"].items())
    enc = data.get("encodings") if isinstance(data.get("encodings"), dict) else {}
    overrides = ()
    if isinstance(enc.get("overrides"), dict):
        overrides = tuple((str(g), e, P.pos(f"/encodings/overrides/{pointer_escape(g)}"))
                          for g, e in enc["overrides"].items() if isinstance(e, str))
    constants = []
    if isinstance(data.get("constants"), dict):
        for k, v in data["constants"].items():
            p = P.pos(f"/constants/{pointer_escape(k)}")
            if isinstance(v, dict):
                constants.append(ConstDecl(str(k), v.get("value"), str(v.get("dtype", "")), p))
            else:
                constants.append(ConstDecl(str(k), v, "", p))
    blocks = {}
    if isinstance(data.get("blocks"), dict):
        for k, b in data["blocks"].items():
            if not isinstance(b, dict):
                continue
            ptr = f"/blocks/{pointer_escape(k)}"
            blocks[str(k)] = BlockDecl(
                str(k), P.pos(ptr),
                params=tuple(x for x in b["params"] if isinstance(x, str))
                if isinstance(b.get("params"), list) else (),
                inputs=P.names(b.get("inputs", []), f"{ptr}/inputs"),
                outputs=P.names(b.get("outputs", []), f"{ptr}/outputs"),
                layers=P.layers(b.get("layers"), f"{ptr}/layers"),
                doc=str(b.get("doc", "") or ""))
    dims = data.get("dims") if isinstance(data.get("dims"), dict) else {}
    formats = data.get("formats") if isinstance(data.get("formats"), dict) else {}
    spec = Spec(
        file=file,
        name=str(data.get("name", "")),
        version=data.get("maxdecl") if isinstance(data.get("maxdecl"), int) else 0,
        doc=str(data.get("doc", "") or ""),
        chat_template=data.get("chat_template") if isinstance(data.get("chat_template"), str)
        else "",
        batching=data.get("batching") if isinstance(data.get("batching"), str) else "rows",
        variant=variant or default,
        default_variant=default,
        variants=MappingProxyType(variants),
        derived=derived,
        params=MappingProxyType({}),
        dims=MappingProxyType({str(k): v for k, v in dims.items()}),
        encoding_default=enc.get("default", "f32") if isinstance(enc.get("default"), str)
        else "f32",
        encoding_overrides=overrides,
        inputs=P.io(data.get("inputs"), "/inputs"),
        constants=tuple(constants),
        blocks=MappingProxyType(blocks),
        layers=P.layers(data.get("layers"), "/layers"),
        outputs=P.names(data.get("outputs"), "/outputs"),
        formats=MappingProxyType(formats),
        marks=MappingProxyType(marks),
    )
    return spec, P.problems
