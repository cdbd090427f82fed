"""YAML specs -> checked, frozen ``Spec`` objects. Never imports numba (nor NumPy).

Checking runs in stages, each reporting every problem it finds with its
``file:line:col``:

1. ``marks``: safe YAML load keeping positions; syntax errors, duplicate keys, tags;
2. ``schema``: the JSON Schema (Draft 2020-12), errors mapped to the nearest mark;
3. ``semantic``: ops, attributes, arity, names, expressions, encodings and
   block sizes, for every variant.

A later stage's problem inside a value an earlier stage already rejected is
dropped, so one mistake gives one message.

Example::

    problems = md.validate_spec("specs/llama3.yaml")     # [] when valid
    spec = md.load_spec("specs/llama3.yaml", variant="tiny")
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import SpecError
from . import budgets, checked, semantic
from .marks import decode, load_yaml
from .model import Program, Spec
from .parse import parse

__all__ = ["SpecProblem", "Spec", "Program", "load_spec", "validate_spec", "validate_text",
           "parse_text", "format_problems"]


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a spec: 1-based ``line``/``col``, JSON-pointer ``path``, ``message``."""

    file: str
    line: int
    col: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"


def _covered(ptr: str, bad: list[str]) -> bool:
    return any(b and (ptr == b or ptr.startswith(b + "/")) for b in bad)


def parse_text(text: str, file: str = "<string>",
               trust_checked: bool = False) -> tuple[Spec | None, list[SpecProblem]]:
    """Check spec ``text``; returns ``(spec or None, problems sorted by position)``.

    ``trust_checked``: a text that passed every check before under the same code and
    ops (``spec.checked``) is parsed without checking it again."""
    with budgets.metered():
        if trust_checked and checked.was_valid(text):
            data, marks, problems = load_yaml(text)
            if data is not None and not problems:
                spec, problems = parse(data, marks, file)
                if spec is not None and not problems:
                    return spec, []
        spec, problems = _parse_text(text, file)
        if trust_checked and spec is not None and not problems:
            checked.mark_valid(text)
        return spec, problems


def _parse_text(text: str, file: str):
    from .schema import check as schema_check

    data, marks, problems = load_yaml(text)
    if data is None and not problems:
        problems.append(semantic.RawProblem(1, 1, "", "empty spec: expected a mapping with "
                                                      "maxdecl, name, variants, inputs, layers, "
                                                      "outputs"))
    spec = None
    if data is not None:
        bad = [p.path for p in problems]
        found = [p for p in schema_check(data, marks) if not _covered(p.path, bad)]
        problems += found
        bad += [p.path for p in found]
        spec, parse_problems = parse(data, marks, file)
        if spec is not None:
            more = parse_problems + semantic.check(spec)
            problems += [p for p in more if not _covered(p.path, bad)]
    out, seen = [], set()
    for p in sorted(problems, key=semantic.problem_order):
        key = (p.line, p.col, p.message)
        if key not in seen:
            seen.add(key)
            out.append(SpecProblem(file, p.line, p.col, _clip(p.path), _clip(p.message)))
    return spec, out


_MAX_MESSAGE = 400   # characters of a problem's message: values quoted in it are cut


def _clip(text: str) -> str:
    text = " ".join(text.split()) if "\n" in text or "\r" in text else text
    if len(text) <= _MAX_MESSAGE:
        return text
    return f"{text[:_MAX_MESSAGE - 100]} ... ({len(text) - _MAX_MESSAGE + 40:,} characters " \
           f"cut) ... {text[-60:]}"


def validate_text(text: str, file: str = "<string>") -> list[SpecProblem]:
    """All problems of spec ``text`` (``[]`` when valid)."""
    return parse_text(text, file)[1]


def validate_spec(path) -> list[SpecProblem]:
    """All problems of the spec file at ``path``, sorted by position; ``[]`` when valid.

    Raises OSError when the file cannot be read (the CLI exits 2 for that).

    Example::

        for p in md.validate_spec("specs/llama3.yaml"):
            print(p)          # specs/llama3.yaml:41:7: unknown op 'rms_nrom'; did you mean ...
    """
    text, problem = _read(path)
    if problem is not None:
        return [SpecProblem(str(path), problem.line, problem.col, "", problem.message)]
    return validate_text(text, str(path))


def load_spec(path, variant: str | None = None) -> Spec:
    """Parse and check the spec at ``path`` (or pass a Spec through, selecting ``variant``).

    Returns a frozen Spec with ``variant`` (default: the spec's default variant)
    selected and its params resolved.

    Raises:
        SpecError: ``file:line:col: message`` of the first problem, plus
            "(and N more problems)"; or an unknown variant.
    """
    if isinstance(path, Spec):
        return path if variant in (None, path.variant) and path.params else \
            semantic.select_variant(path, variant or path.variant)
    try:
        text, problem = _read(path)
    except OSError as e:
        raise SpecError(f"{path}: cannot read the spec: {e.strerror or e}") from None
    if problem is not None:
        raise SpecError(f"{path}:{problem.line}:{problem.col}: {problem.message}")
    spec, problems = parse_text(text, str(path), trust_checked=True)
    if problems:
        more = len(problems) - 1
        tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise SpecError(f"{problems[0]}{tail}")
    return semantic.select_variant(spec, variant or spec.default_variant)


def _read(path):
    """``(text, None)`` or ``(None, problem)``: too large, or not UTF-8 (positioned)."""
    with open(Path(path), "rb") as f:
        data = f.read(budgets.MAX_SPEC_BYTES + 1)
    return decode(data)


def format_problems(problems, fmt: str = "text") -> str:
    """Render problems for ``maxdecl validate --format text|json|github``.

    text: ``file:line:col: /json/pointer: message`` per line; json: a list of objects
    (file, line, col, path, message); github: ``::error file=F,line=L,col=C::message``.
    """
    problems = list(problems)
    if fmt == "json":
        return json.dumps([asdict(p) for p in problems], indent=2)
    if fmt == "github":
        def esc(s, prop=False):
            s = str(s).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
            return s.replace(":", "%3A").replace(",", "%2C") if prop else s
        return "\n".join(f"::error file={esc(p.file, True)},line={p.line},col={p.col}::"
                         f"{esc((p.path + ': ') if p.path else '')}{esc(p.message)}"
                         for p in problems)
    if fmt != "text":
        raise ValueError(f"unknown format {fmt!r}; expected text, json or github")
    return "\n".join(f"{p.file}:{p.line}:{p.col}: " + (f"{p.path}: " if p.path else "")
                     + p.message for p in problems)
