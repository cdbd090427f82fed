"""Frozen records: what a spec declares (``Spec``) and what it unrolls to (``Program``).

``Spec`` keeps the declaration as written (templates and expressions unevaluated),
so one Spec serves every variant. ``Spec.program(variant)`` unrolls repeats and
blocks, evaluates every expression and resolves every name, giving a flat
``Program``: graph inputs, constants, weights (full names, integer shapes,
encodings) and ops in dataflow order, each with its layer path and YAML position.
The builder, ``describe_tree`` and the semantic checks all read the same Program.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from types import MappingProxyType

from .decls import (EMPTY, BlockDecl, ConstDecl, IODecl, LayerDecl, PConst,  # noqa: F401
                    PInput, PLayer, POp, Pos, Program, PWeight, Ref, WeightDecl)
from .expr import render
from .semantic import expand_or_raise, select_variant


@dataclass(frozen=True)
class Spec:
    """A parsed, checked spec. ``params`` are the selected variant's resolved values.

    Example::

        spec = md.load_spec("specs/llama3.yaml", variant="tiny")
        spec.params["head_dim"]          # 64
        prog = spec.program()            # flat ops, weights, graph inputs/outputs
        [w.name for w in prog.weights][:2]   # ['token_embd.weight', 'blk.0.attn_norm.weight']
    """

    file: str
    name: str
    version: int
    doc: str
    variant: str                     # the selected variant
    default_variant: str
    variants: MappingProxyType       # name -> {hyperparameter: raw value}
    derived: tuple                   # (name, raw value, Pos) in order
    params: MappingProxyType         # selected variant: every hyperparameter and derived param
    dims: MappingProxyType           # symbolic dim -> doc
    encoding_default: str
    encoding_overrides: tuple        # (glob, encoding, Pos)
    inputs: tuple                    # IODecl (root)
    constants: tuple                 # ConstDecl
    blocks: MappingProxyType         # name -> BlockDecl
    layers: tuple                    # LayerDecl
    outputs: tuple                   # (name, Pos)
    formats: MappingProxyType        # format -> plain dict (hf, gguf, llama2c, ...)
    marks: MappingProxyType = field(default_factory=lambda: EMPTY, repr=False)
    chat_template: str = ""          # Jinja chat template used when the weights carry none
    batching: str = "rows"           # raw: "rows", "per_sequence" or "{expression}" giving one
    # programs already unrolled, by (variant, params, check_encodings): a load unrolls
    # the same one to map the weights and to build (Programs are frozen records)
    _programs: dict = field(default_factory=dict, init=False, repr=False, compare=False)


    def program(self, variant: str | None = None, params: dict | None = None,
                check_encodings: bool = True) -> "Program":
        """Unroll the spec for ``variant`` (default: the selected one); ``params``
        override hyperparameters (e.g. from weights metadata); ``check_encodings=False``
        when the weights bring their own encodings. Raises SpecError."""
        variant = variant or self.variant
        try:
            key = (variant, repr(sorted(params.items())) if params else "", check_encodings)
        except TypeError:                  # keys that do not sort: no cache
            return expand_or_raise(self, variant, params, check_encodings)
        prog = self._programs.get(key)
        if prog is None:
            if len(self._programs) >= 16:
                self._programs.clear()
            prog = self._programs[key] = expand_or_raise(self, variant, params,
                                                         check_encodings)
        return prog

    def with_variant(self, variant: str) -> "Spec":
        """The same spec with another variant selected (SpecError if unknown)."""
        return select_variant(self, variant)

    def encoding_for(self, weight_name: str, env: dict | None = None) -> str:
        """Encoding of ``weight_name`` by the spec's rules (first matching glob wins)."""
        for glob, enc, _ in self.encoding_overrides:
            if fnmatch.fnmatchcase(weight_name, glob):
                return str(render(enc, env or dict(self.params))).lower()
        return str(render(self.encoding_default, env or dict(self.params))).lower()
