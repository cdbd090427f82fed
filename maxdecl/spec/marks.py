"""Safe YAML loading that keeps where every value came from.

``load_yaml(text)`` composes the document with PyYAML's *safe* machinery and builds
plain Python data itself, so no constructor ever runs for an unknown tag:
``!!python/object/apply:...`` and local ``!tags`` become problems, not calls.
It returns ``(data, marks, problems)`` where ``marks`` maps a JSON pointer
(``/layers/0/op``) to the 1-based ``(line, col)`` of that value, and
``marks["/layers/0/op#key"]`` to the position of its key. Duplicate keys are
reported at the second occurrence.

Example::

    data, marks, problems = load_yaml("a: 1\\nb: [2, 3]\\n")
    marks["/b/1"]   # (2, 8)
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

_CORE = "tag:yaml.org,2002:"
# libyaml's composer when present (same nodes and marks, several times faster).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SCALAR_TAGS = {"str", "int", "float", "bool", "null", "timestamp"}
_MAX_NODES = 200_000   # alias bombs ("billion laughs") stop here
_MAX_DEPTH = 200


@dataclass(frozen=True)
class RawProblem:
    """A problem found while reading YAML: 1-based position, JSON pointer, message."""

    line: int
    col: int
    path: str
    message: str


def pointer_escape(key) -> str:
    """Escape one JSON-pointer token (RFC 6901)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def pointer_tokens(ptr: str) -> list[str]:
    """``"/a/b~1c"`` -> ``["a", "b/c"]``."""
    if not ptr:
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in ptr.split("/")[1:]]


class _Builder:
    def __init__(self):
        self.marks: dict[str, tuple[int, int]] = {}
        self.problems: list[RawProblem] = []
        self.count = 0
        self._constructor = yaml.constructor.SafeConstructor()

    def problem(self, node, path, message):
        m = node.start_mark
        self.problems.append(RawProblem(m.line + 1, m.column + 1, path, message))

    def build(self, node, path="", depth=0):
        self.count += 1
        if self.count > _MAX_NODES or depth > _MAX_DEPTH:
            if self.count == _MAX_NODES + 1 or depth == _MAX_DEPTH + 1:
                self.problem(node, path, "document too large or too deeply nested "
                             "(aliases expanding without bound?)")
            return None
        self.marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        tag = node.tag or ""
        short = tag[len(_CORE):] if tag.startswith(_CORE) else None
        if isinstance(node, yaml.MappingNode):
            if short != "map":
                return self._bad_tag(node, path, tag)
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            if short != "seq":
                return self._bad_tag(node, path, tag)
            return [self.build(n, f"{path}/{i}", depth + 1) for i, n in enumerate(node.value)]
        if short not in _SCALAR_TAGS:
            return self._bad_tag(node, path, tag)
        if short == "str" or short == "timestamp":   # dates stay text
            return node.value
        try:
            return getattr(self._constructor, f"construct_yaml_{short}")(node)
        except (ValueError, yaml.YAMLError) as e:
            self.problem(node, path, f"invalid {short} {node.value!r}: {e}")
            return None

    def _bad_tag(self, node, path, tag):
        shown = tag.replace(_CORE, "!!")
        self.problem(node, path, f"YAML tag {shown!r} is not allowed: specs are plain data "
                     "(mappings, lists, strings, numbers, booleans, null)")
        return None

    def _mapping(self, node, path, depth):
        out = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.problem(key_node, path, "mapping keys must be plain scalars")
                continue
            key = self.build(key_node, path + "/#key", depth + 1)
            if isinstance(key, (int, float, bool)) or key is None:
                key = key_node.value    # `8b:` or `1:` stay the text the author wrote
            sub = f"{path}/{pointer_escape(key)}"
            if key in out:
                first = self.marks.get(sub + "#key", (0, 0))
                self.problem(key_node, sub, f"duplicate key {key!r} (first defined at line "
                             f"{first[0]}); each key may appear once")
                continue
            self.marks[sub + "#key"] = (key_node.start_mark.line + 1,
                                        key_node.start_mark.column + 1)
            out[key] = self.build(value_node, sub, depth + 1)
        self.marks.pop(path + "/#key", None)
        return out


def load_yaml(text: str):
    """Parse one YAML document safely; returns ``(data, marks, problems)``.

    A syntax error gives ``data=None`` and one problem at the error's position.
    """
    b = _Builder()
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        msg = e.problem or "invalid YAML"
        if e.context:
            msg = f"{e.context}: {msg}" if "found" in msg else f"{msg} ({e.context})"
        if "mapping values are not allowed" in msg or "expected <block end>" in msg:
            msg += "; check the indentation of this line and the one above"
        b.problems.append(RawProblem(line, col, "", f"YAML syntax error: {msg}"))
        return None, b.marks, b.problems
    except yaml.YAMLError as e:
        b.problems.append(RawProblem(1, 1, "", f"YAML error: {e}"))
        return None, b.marks, b.problems
    if node is None:
        return None, b.marks, b.problems
    data = b.build(node)
    return data, b.marks, b.problems


def nearest_mark(marks: dict, ptr: str, key: bool = False) -> tuple[int, int]:
    """Position of ``ptr`` or of its nearest ancestor that has a mark.

    With ``key=True`` the mapping key's position is preferred (for "unknown
    property" style problems).
    """
    if key and ptr + "#key" in marks:
        return marks[ptr + "#key"]
    if ptr in marks and not (key and "/" in ptr):
        return marks[ptr]
    tokens = pointer_tokens(ptr)
    while True:
        p = "".join("/" + pointer_escape(t) for t in tokens)
        if key and p + "#key" in marks:
            return marks[p + "#key"]
        if p in marks:
            return marks[p]
        if not tokens:
            return (1, 1)
        tokens.pop()
