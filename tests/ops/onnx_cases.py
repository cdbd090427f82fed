"""ONNX's own operator test cases mapped onto maxdecl ops (Conv, AveragePool, MaxPool,
LayerNormalization, Tile, Where).

The cases come from ``onnx.backend.test.case.node`` (the installed wheel generates
them in Python; it ships no ``.pb`` data for nodes). A case maps when its attributes
fit one of our ops: NCHW input -> ``input_layout="NCHW"`` / ``filter_layout="FCRS"``
(pools: transposed to NHWC inside the graph), ``auto_pad`` SAME_* -> explicit padding,
1-D cases -> 2-D with H = 1, LayerNormalization on ``axis`` -> reshape to 2-D around
``layer_norm``. Not mapped: 3-D pools (our pools are NHWC 2-D), MaxPool with an
``Indices`` output, LayerNormalization's optional Mean/InvStdDev outputs (only Y is
compared; such cases still map and say so).

Used by ``test_onnx_cases.py`` and ``bench/onnx_cases.py`` (prints the counts).
"""

from __future__ import annotations

import importlib
import math
import warnings
from dataclasses import dataclass

import numpy as np

import maxdecl as md

OPS = {"Conv": "conv", "AveragePool": "averagepool", "MaxPool": "maxpool",
       "LayerNormalization": "layernormalization", "Tile": "tile", "Where": "where"}


@dataclass
class Case:
    name: str
    op: str
    attrs: dict
    inputs: list
    outputs: list
    rtol: float
    atol: float


_CACHE: list | None = None


def load_cases() -> list[Case]:
    """Every single-node ONNX test case of the six op types (expanded forms skipped)."""
    global _CACHE
    if _CACHE is not None:
        return _CACHE
    import onnx
    from onnx.backend.test.case import node as nodecases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod in OPS.values():
            importlib.import_module(f"onnx.backend.test.case.node.{mod}")
    cases = []
    for c in nodecases._NodeTestCases:
        nodes = c.model.graph.node
        if len(nodes) != 1 or nodes[0].op_type not in OPS:
            continue
        n = nodes[0]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        for inputs, outputs in c.data_sets:
            cases.append(Case(c.name, n.op_type, attrs, list(inputs), list(outputs),
                              c.rtol, c.atol))
    _CACHE = cases
    return cases


class Unmapped(Exception):
    """The case's attributes have no counterpart in our ops."""


def _auto_pads(attrs, spatial, k, s, d):
    mode = attrs.get("auto_pad", "NOTSET")
    nd = len(spatial)
    if mode in ("NOTSET", ""):
        p = list(attrs.get("pads", [0] * (2 * nd)))
        return [v for i in range(nd) for v in (p[i], p[i + nd])]
    if mode == "VALID":
        return [0] * (2 * nd)
    out = []
    for n, kk, ss, dd in zip(spatial, k, s, d):
        total = max((math.ceil(n / ss) - 1) * ss + (kk - 1) * dd + 1 - n, 0)
        small = total // 2
        out += [small, total - small] if mode == "SAME_UPPER" else [total - small, small]
    return out


def _window_params(c, x, k):
    nd = x.ndim - 2
    a = c.attrs
    s = list(a.get("strides", [1] * nd))
    d = list(a.get("dilations", [1] * nd))
    pads = _auto_pads(a, x.shape[2:], k, s, d)
    return nd, s, d, pads


def _to_2d(nd, x, k, s, d, pads):
    """1-D -> 2-D with H = 1."""
    if nd == 1:
        return x[:, :, None], [1] + list(k), [1] + s, [1] + d, [0, 0] + pads
    return x, list(k), s, d, pads


def build(c: Case):
    """(graph, runtime inputs) for case ``c``; raises Unmapped when it does not fit."""
    f = md.TensorType
    a = c.attrs
    if c.op in ("Conv", "AveragePool", "MaxPool"):
        x = c.inputs[0]
        if c.op == "MaxPool" and (len(c.outputs) > 1 or a.get("storage_order", 0)):
            raise Unmapped("MaxPool with an Indices output / storage_order")
        k = list(a.get("kernel_shape", c.inputs[1].shape[2:] if c.op == "Conv" else ()))
        nd, s, d, pads = _window_params(c, x, k)
        if c.op != "Conv" and nd == 3:
            raise Unmapped("3-D pooling (our pools are NHWC 2-D)")
        if c.op == "Conv" and nd == 3:
            g = md.Graph(c.name, [f(md.DType.from_numpy(v.dtype), v.shape) for v in c.inputs])
            y = md.ops.conv3d(g.inputs[0], g.inputs[1], stride=s, dilation=d, padding=pads,
                              groups=a.get("group", 1),
                              bias=g.inputs[2] if len(c.inputs) > 2 else None,
                              input_layout="NCDHW", filter_layout="FCQRS")
            g.output(y)
            return g, c.inputs
        x2, k2, s2, d2, p2 = _to_2d(nd, x, k, s, d, pads)
        ins = [x2] + list(c.inputs[1:])
        if c.op == "Conv" and nd == 1:
            ins[1] = ins[1][:, :, None]
        g = md.Graph(c.name, [f(md.DType.from_numpy(v.dtype), v.shape) for v in ins])
        if c.op == "Conv":
            y = md.ops.conv2d(g.inputs[0], g.inputs[1], stride=s2, dilation=d2, padding=p2,
                              groups=a.get("group", 1),
                              bias=g.inputs[2] if len(ins) > 2 else None,
                              input_layout="NCHW", filter_layout="FCRS")
        else:
            xt = md.ops.transpose(g.inputs[0], (0, 2, 3, 1))
            kw = dict(kernel_size=k2, stride=s2, dilation=d2, padding=p2,
                      ceil_mode=bool(a.get("ceil_mode", 0)))
            if c.op == "AveragePool":
                y = md.ops.avg_pool(xt, count_boundary=bool(a.get("count_include_pad", 0)), **kw)
            else:
                y = md.ops.max_pool(xt, **kw)
            y = md.ops.transpose(y, (0, 3, 1, 2))
        if nd == 1:
            y = md.ops.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
        g.output(y)
        return g, ins
    if c.op == "LayerNormalization":
        x = c.inputs[0]
        axis = a.get("axis", -1) % x.ndim
        pre, post = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
        g = md.Graph(c.name, [f(md.DType.from_numpy(v.dtype), v.shape) for v in c.inputs])
        x2 = md.ops.reshape(g.inputs[0], (pre, post))
        ws = [md.ops.reshape(v, (post,)) for v in g.inputs[1:]]
        y = md.ops.layer_norm(x2, *ws, epsilon=a.get("epsilon", 1e-5))
        g.output(md.ops.reshape(y, x.shape))
        return g, c.inputs
    if c.op == "Tile":
        x, reps = c.inputs
        g = md.Graph(c.name, [f(md.DType.from_numpy(x.dtype), x.shape)])
        g.output(md.ops.tile(g.inputs[0], [int(r) for r in reps]))
        return g, [x]
    if c.op == "Where":
        g = md.Graph(c.name, [f(md.DType.from_numpy(v.dtype), v.shape) for v in c.inputs])
        g.output(md.ops.select(*g.inputs))
        return g, c.inputs
    raise Unmapped(c.op)


def run_case(c: Case) -> tuple[str, str]:
    """("pass" | "fail" | "unmapped", detail)."""
    try:
        g, ins = build(c)
    except Unmapped as e:
        return "unmapped", str(e)
    try:
        (out,) = g.execute(*ins)
        ref = c.outputs[0]
        np.testing.assert_allclose(out, ref, rtol=max(c.rtol, 1e-5), atol=max(c.atol, 1e-5))
        assert out.dtype == ref.dtype, f"dtype {out.dtype} vs {ref.dtype}"
    except Exception as e:  # noqa: BLE001 - reported as a failing case
        return "fail", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    note = " (Y only; Mean/InvStdDev not compared)" if len(c.outputs) > 1 else ""
    return "pass", note


def summary() -> dict:
    """{op: {"total", "mapped", "passed", "failed": [...], "unmapped": [...]}}."""
    res: dict = {}
    for c in load_cases():
        r = res.setdefault(c.op, {"total": 0, "mapped": 0, "passed": 0, "failed": [],
                                  "unmapped": []})
        r["total"] += 1
        status, detail = run_case(c)
        if status == "unmapped":
            r["unmapped"].append(f"{c.name}: {detail}")
            continue
        r["mapped"] += 1
        if status == "pass":
            r["passed"] += 1
        else:
            r["failed"].append(f"{c.name}: {detail}")
    return res
