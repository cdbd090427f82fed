"""The spec JSON Schema (``SCHEMA``) and its errors as positioned problems.

Every error from Draft 2020-12 ``iter_errors`` becomes one ``RawProblem`` at the
YAML mark nearest to the error's ``absolute_path``. For ``oneOf``/``anyOf`` the
best (deepest) alternative's error is shown and the rest are counted, as
check-jsonschema does. Messages say what was expected and what was found.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from .marks import RawProblem, nearest_mark, pointer_escape

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schema" / "spec.schema.json"
SCHEMA: dict = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))

_VALIDATOR = None
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string",
               list: "array", dict: "object", type(None): "null"}


def _validator():
    """The validator of the checking part of SCHEMA: the per-op attribute lists that
    ``schema_gen`` adds for editors (``$defs.layer.allOf``) only describe, never
    constrain, and testing ~50 ``if`` branches on every layer cost a third of
    ``maxdecl validate``'s time, so they are left out here."""
    global _VALIDATOR
    if _VALIDATOR is None:
        from jsonschema import Draft202012Validator

        checking = dict(SCHEMA, **{"$defs": dict(SCHEMA["$defs"])})
        checking["$defs"]["layer"] = {k: v for k, v in SCHEMA["$defs"]["layer"].items()
                                      if k != "allOf"}
        _VALIDATOR = Draft202012Validator(checking)
    return _VALIDATOR


def check(data, marks) -> list[RawProblem]:
    """All schema errors of ``data``, each at its nearest YAML position."""
    out = []
    for err in _validator().iter_errors(data):
        out.extend(_to_problems(err, marks))
    return out


def _ptr(path) -> str:
    return "".join("/" + pointer_escape(p) for p in path)


def _deepest(err):
    """For oneOf/anyOf: the alternative's error that got deepest into the instance
    (ties: a non-``type`` error, i.e. an alternative whose type matched), and how
    many other alternatives there were."""
    others = 0
    while err.context:
        n_alts = len({e.relative_schema_path[0] for e in err.context
                      if e.relative_schema_path})
        others += max(n_alts - 1, 0)
        err = max(err.context, key=lambda e: (len(e.absolute_path), e.validator != "type"))
    return err, others


def _to_problems(err, marks) -> list[RawProblem]:
    if err.validator in ("oneOf", "anyOf") and err.context:
        err, others = _deepest(err)
        found = _to_problems(err, marks)
        if others > 0:
            note = (f" ({others} other accepted form{'s' if others > 1 else ''} did not "
                    "match either)")
            found = [RawProblem(p.line, p.col, p.path, p.message + note) for p in found]
        return found
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = list(err.schema.get("properties", {}))
        extras = [k for k in err.instance if k not in allowed]
        probs = []
        for k in extras:
            hint = _close(k, allowed)
            if not hint and isinstance(k, str) and " " in k:
                hint = ("; a ': ' or ', ' inside a flow mapping {...} splits plain text: "
                        "quote the value")
            where = list(err.absolute_path) + [k]
            probs.append(_at(where, f"unknown key {k!r} (expected one of: "
                                    f"{', '.join(allowed)}){hint}", marks, key=True))
        return probs
    if "propertyNames" in err.absolute_schema_path and isinstance(err.instance, str):
        bad = err.instance
        message = (f"unknown name {bad!r} (expected one of: "
                   f"{', '.join(map(str, err.validator_value))}){_close(bad, err.validator_value)}"
                   if err.validator == "enum" else
                   f"invalid name {bad!r}: expected letters, digits and _, not starting "
                   "with a digit" + (
                       f" (a weight under a sub-path: declare it in a weights-only child "
                       f"layer `{bad.rsplit('.', 1)[0]}` as `{bad.rsplit('.', 1)[1]}`)"
                       if "weights" in [str(p) for p in err.absolute_path] and "." in bad
                       else ""))
        return [_at(list(err.absolute_path) + [bad], message, marks, key=True)]
    return [_at(err.absolute_path, _message(err), marks)]


def _close(name, names) -> str:
    """``"; did you mean 'x'?"`` for the entry of ``names`` closest to ``name``, or ""."""
    close = difflib.get_close_matches(str(name), [str(x) for x in names], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _short(text: str) -> str:
    return text.split(". ")[0].rstrip(".")


def _at(path, message, marks, key=False) -> RawProblem:
    ptr = _ptr(path)
    line, col = nearest_mark(marks, ptr, key=key)
    return RawProblem(line, col, ptr, message)


def _found(v) -> str:
    t = _JSON_TYPES.get(type(v), type(v).__name__)
    shown = repr(v) if not isinstance(v, (dict, list)) else ("a mapping" if isinstance(
        v, dict) else "a list")
    return f"{t} {shown}" if not isinstance(v, (dict, list)) else shown


def _message(err) -> str:
    v, val, inst = err.validator, err.validator_value, err.instance
    desc = err.schema.get("description", "") if isinstance(err.schema, dict) else ""
    if v == "type":
        want = " or ".join(val) if isinstance(val, list) else val
        hint = ""
        if isinstance(inst, bool) and "string" in (val if isinstance(val, list) else [val]):
            hint = ("; YAML reads a plain on, off, yes, no, true or false as a boolean: "
                    "quote it")
        return (f"expected {want}, got {_found(inst)}" + (f" ({_short(desc)})" if desc else "")
                + hint)
    if v == "required":
        missing = [k for k in val if isinstance(inst, dict) and k not in inst]
        return f"missing required key {missing[0]!r}" if missing else err.message
    if v == "const":
        return f"expected {val!r}, got {_found(inst)}"
    if v == "enum":
        return f"expected one of {', '.join(map(str, val))}, got {_found(inst)}{_close(inst, val)}"
    if v == "pattern":
        return f"{inst!r} is not valid here" + (f": {_short(desc)}" if desc else
                                                f" (must match {val})")
    if v == "minimum":
        kind = "an integer" if isinstance(inst, int) else "a number"
        return f"expected {kind} >= {val}, got {inst!r}" + (f" ({_short(desc)})"
                                                               if len(desc) < 60 else "")
    if v in ("minItems", "minProperties", "minLength"):
        n = len(inst) if isinstance(inst, (list, dict, str)) else 0
        what = "character" if v == "minLength" else "item"
        return (f"expected at least {val} {what}{'s' if val != 1 else ''}, got "
                f"{n or 'none'}")
    return err.message
