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

import re
from dataclasses import dataclass

import yaml
from yaml.composer import Composer
from yaml.resolver import Resolver

from .budgets import MAX_SPEC_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {"str", "int", "float", "bool", "null", "timestamp"}
_MAX_NODES = MAX_YAML_NODES   # alias bombs ("billion laughs") stop here
_MAX_DEPTH = MAX_YAML_DEPTH
# Characters YAML does not allow in a stream (PyYAML's Reader.NON_PRINTABLE).
_NON_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD"
                            "\U00010000-\U0010FFFF]")
try:                                    # libyaml's parser when present (several times faster)
    from yaml.cyaml import CParser as _Parser
except ImportError:                     # pragma: no cover - pure-Python PyYAML
    from yaml.parser import Parser as _Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, _Parser):     # noqa: F811
        def __init__(self, stream):
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            _Parser.__init__(self)


class _TooBig(Exception):
    def __init__(self, mark, message):
        super().__init__(message)
        self.mark = mark


class _Loader(Composer, _Parser, Resolver):
    """PyYAML's composer over the (C) parser's events, counting nodes and depth as it
    goes: libyaml's own composer recurses without limit and crashes on deep nesting."""

    def __init__(self, stream):
        _Parser.__init__(self, stream)
        Composer.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_YAML_DEPTH or self._nodes > MAX_YAML_NODES:
            raise _TooBig(self.peek_event().start_mark,
                          f"document nested more than {MAX_YAML_DEPTH} deep (MAX_YAML_DEPTH)"
                          if self._depth > MAX_YAML_DEPTH else
                          f"document has more than {MAX_YAML_NODES:,} nodes (MAX_YAML_NODES)")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


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
        self.too_big = False
        self._constructor = yaml.constructor.SafeConstructor()

    def problem(self, node, path, message):
        m = node.start_mark
        self.problems.append(RawProblem(m.line + 1, m.column + 1, path, message))

    def _over_budget(self, node, path, depth) -> bool:
        """Count one node; True (reported once) past MAX_YAML_NODES or MAX_YAML_DEPTH."""
        self.count += 1
        if self.count > _MAX_NODES or depth > _MAX_DEPTH:
            if not self.too_big:
                self.too_big = True
                self.problem(node, path, f"document too large or too deeply nested: more "
                             f"than {_MAX_NODES:,} nodes (MAX_YAML_NODES) or {_MAX_DEPTH} levels "
                             "(MAX_YAML_DEPTH) once aliases are expanded")
            return True
        return False

    def build(self, node, path="", depth=0):
        if self._over_budget(node, path, depth):
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
        out, merged = {}, {}
        for key_node, value_node in node.value:
            if key_node.tag == _CORE + "merge":     # `<<: *base`: YAML's merge key
                self._merge(value_node, path, depth, merged)
                continue
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
        for key, value in merged.items():           # keys written here win over merged ones
            out.setdefault(key, value)
        self.marks.pop(path + "/#key", None)
        return out

    def _merge(self, value_node, path, depth, merged):
        """The mappings of a merge key (one, or a list: the first to give a key wins)
        into ``merged``."""
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for src in sources:
            if not isinstance(src, yaml.MappingNode):
                self.problem(src, path, "a merge key '<<' takes a mapping or a list of "
                             "mappings (`<<: *base`)")
                continue
            if self._over_budget(src, path, depth + 1):    # also a mapping merging itself
                return
            for key, value in self._mapping(src, path, depth + 1).items():
                merged.setdefault(key, value)


def position(text: str, index: int) -> tuple[int, int]:
    """1-based ``(line, col)`` of character ``index`` in ``text``."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def decode(data: bytes) -> tuple[str | None, RawProblem | None]:
    """Spec file bytes -> ``(text, None)``, or ``(None, problem)`` for a file over
    MAX_SPEC_BYTES or bytes that are not UTF-8 (positioned at the first bad byte)."""
    if len(data) > MAX_SPEC_BYTES:
        return None, RawProblem(1, 1, "", f"file is larger than {MAX_SPEC_BYTES:,} bytes, "
                                          "the limit for a spec (MAX_SPEC_BYTES)")
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        head = data[:e.start].decode("utf-8", errors="replace")
        line, col = position(head + "?", len(head))
        return None, RawProblem(line, col, "", f"invalid UTF-8: byte 0x{data[e.start]:02x} "
                                               f"({e.reason}); save the spec as UTF-8")


def bad_character(text: str) -> RawProblem | None:
    """The first character YAML does not allow (NUL, control characters, lone
    surrogates), as a positioned problem; None when there is none."""
    m = _NON_PRINTABLE.search(text)
    if m is None:
        return None
    c = m.group()
    name = "a NUL byte" if c == "\0" else f"control character U+{ord(c):04X}" \
        if ord(c) < 0x100 else f"character U+{ord(c):04X}"
    return RawProblem(*position(text, m.start()), "",
                      f"{name} is not allowed in YAML; remove it")


def load_yaml(text: str):
    """Parse one YAML document safely; returns ``(data, marks, problems)``.

    A syntax error gives ``data=None`` and one problem at the error's position.
    """
    b = _Builder()
    bad = bad_character(text)
    if bad is None and len(text) > MAX_SPEC_BYTES:
        bad = RawProblem(1, 1, "", f"spec text is {len(text):,} characters, over the limit "
                                   f"of {MAX_SPEC_BYTES:,} (MAX_SPEC_BYTES)")
    if bad is not None:
        b.problems.append(bad)
        return None, b.marks, b.problems
    try:
        node = yaml.compose(text, Loader=_Loader)
    except _TooBig as e:
        b.problems.append(RawProblem(e.mark.line + 1, e.mark.column + 1, "", str(e)))
        return None, b.marks, b.problems
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        msg = e.problem or "invalid YAML"
        if e.context:
            msg = f"{e.context}: {msg}" if "found" in msg else f"{msg} ({e.context})"
        if "mapping values are not allowed" in msg or "expected <block end>" in msg:
            msg += "; check the indentation of this line and the one above"
        if _tab_at(text, line, col):
            msg = "a tab is used for indentation here; YAML indents with spaces only"
        b.problems.append(RawProblem(line, col, "", f"YAML syntax error: {msg}"))
        return None, b.marks, b.problems
    except yaml.YAMLError as e:
        msg = " ".join(str(e).split())
        b.problems.append(RawProblem(1, 1, "", f"YAML error: {msg}"))
        return None, b.marks, b.problems
    if node is None:
        return None, b.marks, b.problems
    data = b.build(node)
    if b.too_big:            # the other stages would only report the cut-off parts
        return None, b.marks, b.problems
    return data, b.marks, b.problems


def _tab_at(text: str, line: int, col: int) -> bool:
    """True when the error at ``line:col`` sits in a line's leading whitespace that
    holds a tab."""
    lines = text.split("\n", line)
    if line > len(lines):
        return False
    row = lines[line - 1]
    lead = row[:len(row) - len(row.lstrip(" \t"))]
    return "\t" in lead and col <= len(lead) + 1


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
