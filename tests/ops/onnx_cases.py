"""ONNX's own operator test cases mapped onto maxdecl ops (Conv, ConvTranspose, AveragePool,
MaxPool, LayerNormalization, Tile, Where).

The cases come from ``onnx.backend.test.case.node`` (the installed wheel generates
them in Python; it ships no ``.pb`` data for nodes). A case maps when its attributes
fit one of our ops: NCHW input -> ``input_layout="NCHW"`` / ``filter_layout="FCRS"``
(pools: transposed to channels-last inside the graph, 2-D or 3-D), ``auto_pad`` SAME_*
or ConvTranspose's ``output_shape`` -> explicit padding (an output past the natural
size -> ``output_padding``), 1-D cases -> 2-D with H = 1, MaxPool's Indices -> ours plus
each image's offset in the whole tensor (``storage_order`` 1: the image pooled with H
and W swapped), MaxPool padding over half the kernel (torch's limit, not ONNX's) ->
explicit -inf padding, LayerNormalization on ``axis`` -> reshape to 2-D around
``layer_norm`` (Mean and InvStdDev from ``mean`` / ``rsqrt``). Every output of a case
is compared.

Used by ``test_onnx_cases.py`` and ``bench/onnx_cases.py`` (prints the counts).
"""

from __future__ import annotations

import importlib
import math
import warnings
from dataclasses import dataclass

import numpy as np

import maxdecl as md

OPS = {"Conv": "conv", "ConvTranspose": "convtranspose", "AveragePool": "averagepool",
       "MaxPool": "maxpool", "LayerNormalization": "layernormalization", "Tile": "tile",
       "Where": "where"}


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


def _types(arrays):
    return [md.TensorType(md.DType.from_numpy(v.dtype), v.shape) for v in arrays]


def _lowest(dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _pad_lowest(g, x, pads, dtype):
    """Channels-last ``x`` padded with the dtype's lowest value (padding never wins a max):
    max_pool takes at most half its effective kernel as padding (torch's rule), ONNX more."""
    for i in range(x.rank - 2):
        for side, width in enumerate(pads[2 * i:2 * i + 2]):
            if width:
                shape = list(x.shape)
                shape[1 + i] = width
                block = g.constant(np.full(shape, _lowest(dtype), dtype))
                x = md.ops.concat([block, x] if side == 0 else [x, block], axis=1 + i)
    return x


def _build_pool(c):
    """AveragePool / MaxPool (1-D, 2-D, 3-D): NC... transposed to channels-last and back;
    MaxPool's Indices as ONNX counts them (flat over the whole NC... tensor; storage_order
    1: column-major, done by pooling the image with H and W swapped)."""
    a = c.attrs
    x = c.inputs[0]
    k = list(a["kernel_shape"])
    nd, s, d, pads = _window_params(c, x, k)
    x2, k2, s2, d2, p2 = _to_2d(nd, x, k, s, d, pads)
    n2 = x2.ndim - 2
    g = md.Graph(c.name, _types([x2]))
    perm = (0, *range(2, n2 + 2), 1)
    if a.get("storage_order", 0):
        if n2 != 2:
            raise Unmapped("storage_order 1 outside 2-D")
        perm = (0, 3, 2, 1)
        k2, s2, d2, p2 = k2[::-1], s2[::-1], d2[::-1], p2[2:] + p2[:2]
    back = tuple(perm.index(i) for i in range(n2 + 2))
    xt = md.ops.transpose(g.inputs[0], perm)
    kw = dict(kernel_size=k2, stride=s2, dilation=d2, padding=p2,
              ceil_mode=bool(a.get("ceil_mode", 0)))
    if c.op == "AveragePool":
        outs = [md.ops.avg_pool(xt, count_boundary=bool(a.get("count_include_pad", 0)), **kw)]
    else:
        indices = len(c.outputs) > 1
        effs = [(kk - 1) * dd + 1 for kk, dd in zip(k2, d2)]
        if any(max(p2[2 * i:2 * i + 2]) > e // 2 for i, e in enumerate(effs)):
            if indices:
                raise Unmapped("MaxPool Indices with padding over half the kernel")
            xt = _pad_lowest(g, xt, p2, x.dtype)
            kw["padding"] = 0
        y = md.ops.max_pool(xt, return_indices=indices, **kw)
        outs = list(y) if indices else [y]
    outs = [md.ops.transpose(y, back) for y in outs]
    if len(outs) > 1:   # per-image position -> position in the whole N, C, spatial tensor
        n, ch = x.shape[:2]
        base = (np.arange(n * ch, dtype=np.int64) * math.prod(x.shape[2:]))
        outs[1] = md.ops.add(outs[1], g.constant(base.reshape(n, ch, *[1] * n2)))
    if nd == 1:
        outs = [md.ops.reshape(y, (y.shape[0], y.shape[1], y.shape[3])) for y in outs]
    g.output(outs)
    return g, [x2]


def _transpose_pads(c, x, w):
    """ConvTranspose's (before, after) per dim and output_padding, from ``pads`` or, with
    ``auto_pad`` SAME_* / ``output_shape``, the spec's total padding; a negative `after`
    (output_shape past the natural size) becomes output_padding."""
    a = c.attrs
    nd = x.ndim - 2
    k = w.shape[2:]
    s = list(a.get("strides", [1] * nd))
    d = list(a.get("dilations", [1] * nd))
    extra = list(a.get("output_padding", [0] * nd))
    mode = a.get("auto_pad", "NOTSET")
    if "pads" in a and mode in ("NOTSET", ""):
        p = list(a["pads"])
        pads = [v for i in range(nd) for v in (p[i], p[i + nd])]
    elif mode == "VALID" or (mode in ("NOTSET", "") and "output_shape" not in a):
        pads = [0] * (2 * nd)
    else:
        shape = a.get("output_shape", [x.shape[2 + i] * s[i] for i in range(nd)])
        pads = []
        for i in range(nd):
            total = s[i] * (x.shape[2 + i] - 1) + extra[i] + (k[i] - 1) * d[i] + 1 - shape[i]
            half = total // 2
            pads += [half, total - half] if mode == "SAME_UPPER" else [total - half, half]
    for i in range(nd):
        if pads[2 * i + 1] < 0:
            extra[i] -= pads[2 * i + 1]
            pads[2 * i + 1] = 0
        if pads[2 * i] < 0:
            raise Unmapped("ConvTranspose with negative leading padding")
    return s, d, pads, extra


def _build_conv_transpose(c):
    x, w = c.inputs[:2]
    s, d, pads, extra = _transpose_pads(c, x, w)
    ins = list(c.inputs)
    if x.ndim == 3:
        ins[0], ins[1] = x[:, :, None], w[:, :, None]
        s, d, pads, extra = [1] + s, [1] + d, [0, 0] + pads, [0] + extra
    g = md.Graph(c.name, _types(ins))
    y = md.ops.conv_transpose(g.inputs[0], g.inputs[1], stride=s, dilation=d, padding=pads,
                              output_padding=extra, groups=c.attrs.get("group", 1),
                              bias=g.inputs[2] if len(ins) > 2 else None,
                              input_layout="NCHW" if ins[0].ndim == 4 else "NCDHW")
    if x.ndim == 3:
        y = md.ops.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    g.output(y)
    return g, ins


def build(c: Case):
    """(graph, runtime inputs) for case ``c``; raises Unmapped when it does not fit."""
    a = c.attrs
    if c.op in ("AveragePool", "MaxPool"):
        return _build_pool(c)
    if c.op == "ConvTranspose":
        return _build_conv_transpose(c)
    if c.op == "Conv":
        x = c.inputs[0]
        k = list(a.get("kernel_shape", c.inputs[1].shape[2:]))
        nd, s, d, pads = _window_params(c, x, k)
        if nd == 3:
            g = md.Graph(c.name, _types(c.inputs))
            y = md.ops.conv3d(g.inputs[0], g.inputs[1], stride=s, dilation=d, padding=pads,
                              groups=a.get("group", 1),
                              bias=g.inputs[2] if len(c.inputs) > 2 else None,
                              input_layout="NCDHW", filter_layout="FCQRS")
            g.output(y)
            return g, c.inputs
        x2, k2, s2, d2, p2 = _to_2d(nd, x, k, s, d, pads)
        ins = [x2] + list(c.inputs[1:])
        if nd == 1:
            ins[1] = ins[1][:, :, None]
        g = md.Graph(c.name, _types(ins))
        y = md.ops.conv2d(g.inputs[0], g.inputs[1], stride=s2, dilation=d2, padding=p2,
                          groups=a.get("group", 1), bias=g.inputs[2] if len(ins) > 2 else None,
                          input_layout="NCHW", filter_layout="FCRS")
        if nd == 1:
            y = md.ops.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
        g.output(y)
        return g, ins
    if c.op == "LayerNormalization":   # Y, and Mean / InvStdDev when the case has them
        x = c.inputs[0]
        axis = a.get("axis", -1) % x.ndim
        pre, post = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
        eps = a.get("epsilon", 1e-5)
        g = md.Graph(c.name, _types(c.inputs))
        x2 = md.ops.reshape(g.inputs[0], (pre, post))
        ws = [md.ops.reshape(v, (post,)) for v in g.inputs[1:]]
        outs = [md.ops.reshape(md.ops.layer_norm(x2, *ws, epsilon=eps), x.shape)]
        if len(c.outputs) > 1:
            stat = x.shape[:axis] + (1,) * (x.ndim - axis)
            mean = md.ops.mean(x2, axis=-1, keepdims=True)
            dev = md.ops.sub(x2, mean)
            var = md.ops.mean(md.ops.mul(dev, dev), axis=-1, keepdims=True)
            inv = md.ops.rsqrt(md.ops.add(var, g.constant(np.float32(eps))))
            outs += [md.ops.reshape(mean, stat), md.ops.reshape(inv, stat)]
        g.output(outs[:len(c.outputs)])
        return g, c.inputs
    if c.op == "Tile":
        x, reps = c.inputs
        g = md.Graph(c.name, _types([x]))
        g.output(md.ops.tile(g.inputs[0], [int(r) for r in reps]))
        return g, [x]
    if c.op == "Where":
        g = md.Graph(c.name, _types(c.inputs))
        g.output(md.ops.select(*g.inputs))
        return g, c.inputs
    raise Unmapped(c.op)


def run_case(c: Case) -> tuple[str, str]:
    """("pass" | "fail" | "unmapped", detail); every output of the case is compared."""
    try:
        g, ins = build(c)
    except Unmapped as e:
        return "unmapped", str(e)
    try:
        outs = g.execute(*ins)
        assert len(outs) == len(c.outputs), f"{len(outs)} outputs vs {len(c.outputs)}"
        for i, (out, ref) in enumerate(zip(outs, c.outputs)):
            np.testing.assert_allclose(out, ref, rtol=max(c.rtol, 1e-5),
                                       atol=max(c.atol, 1e-5), err_msg=f"output {i}")
            assert out.dtype == ref.dtype, f"output {i}: dtype {out.dtype} vs {ref.dtype}"
    except Exception as e:  # noqa: BLE001 - reported as a failing case
        return "fail", f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
    return "pass", ""


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
