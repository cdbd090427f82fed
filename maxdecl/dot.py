"""Graphviz ``dot`` text for a Graph: one box per node, clustered by layer path."""

from __future__ import annotations


def _q(text: str) -> str:
    text = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + text + '"'


def to_dot(graph) -> str:
    """The graph as Graphviz source (``maxdecl graph SPEC --dot | dot -Tsvg``).

    Weights and constants are left out to keep the picture readable; graph inputs
    are ellipses, ops are boxes grouped in a cluster per layer path.
    """
    producer = {}
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB;", "  node [shape=box, fontsize=10];"]
    for i, v in enumerate(graph.inputs):
        producer[id(v)] = f"in{i}"
        lines.append(f"  in{i} [shape=ellipse, label={_q(f'{v.name or i}: {v.type}')}];")
    by_layer: dict[str, list[str]] = {}
    edges = []
    for k, node in enumerate(graph.nodes):
        if node.op in ("weight", "constant"):
            continue
        name = f"n{k}"
        for v in node.outputs:
            producer[id(v)] = name
        shape = ", ".join(str(v.type) for v in node.outputs)
        label = _q(node.op + "\n" + shape)
        by_layer.setdefault(node.layer, []).append(f"{name} [label={label}];")
        edges += [f"  {producer[id(v)]} -> {name};" for v in node.inputs if id(v) in producer]
    for c, (layer, items) in enumerate(by_layer.items()):
        if layer:
            lines.append(f"  subgraph cluster_{c} {{ label={_q(layer)}; fontsize=9;")
            lines += [f"    {it}" for it in items]
            lines.append("  }")
        else:
            lines += [f"  {it}" for it in items]
    lines += edges
    for i, v in enumerate(graph.outputs):
        label = graph.output_names[i] if i < len(graph.output_names) else None
        lines.append(f"  out{i} [shape=ellipse, label={_q(label or f'output {i}')}];")
        if id(v) in producer:
            lines.append(f"  {producer[id(v)]} -> out{i};")
    lines.append("}")
    return "\n".join(lines)
