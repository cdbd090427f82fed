import numpy as np
import pytest
import torch

import maxdecl as md
from ophelp import run_op


def test_concat_split_roundtrip(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((2, 5, 4)).astype(np.float32)
    out = run_op(lambda x, y: md.ops.concat([x, y], axis=1), a, b)
    np.testing.assert_array_equal(out, torch.cat([torch.from_numpy(a), torch.from_numpy(b)], 1))
    p, q, r = run_op(lambda x: md.ops.split(x, [1, 0, 3], axis=-1), a)
    np.testing.assert_array_equal(p, a[..., :1])
    assert q.shape == (2, 3, 0)
    np.testing.assert_array_equal(r, a[..., 1:])


def test_concat_symbolic_dims_and_errors():
    g = md.Graph("t", [md.TensorType("float32", ("past", 4)), md.TensorType("float32", ("seq", 4)),
                       md.TensorType("float32", ("seq", 5))])
    assert md.ops.concat(g.inputs[:2]).shape == ("past+seq", 4)
    with pytest.raises(md.GraphError, match="dim 1 differs"):
        md.ops.concat([g.inputs[0], g.inputs[2]])
    with pytest.raises(md.GraphError, match="sum to 5.*has 4"):
        md.ops.split(g.inputs[0], [2, 3], axis=1)


@pytest.mark.parametrize("axis", [0, 1, 3, -1, -4])
def test_stack_is_torch_stack(rng, axis):
    a, b, c = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    out = run_op(lambda x, y, z: md.ops.stack([x, y, z], axis=axis), a, b, c)
    want = torch.stack([torch.from_numpy(v) for v in (a, b, c)], axis)
    assert out.shape == tuple(want.shape)
    np.testing.assert_array_equal(out, want)


def test_stack_symbolic_dims_and_errors():
    g = md.Graph("t", [md.TensorType("float32", ("seq", 4)), md.TensorType("float32", ("seq", 4)),
                       md.TensorType("float32", ("seq", 5))])
    assert md.ops.stack(g.inputs[:2], axis=-1).shape == ("seq", 4, 2)
    with pytest.raises(md.GraphError, match="differ in shape"):
        md.ops.stack([g.inputs[0], g.inputs[2]])
    with pytest.raises(md.GraphError, match="out of range"):
        md.ops.stack(g.inputs[:2], axis=3)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1], [3], None, None), ([-3, 0], [None, 100], [2, 0], [1, 2]), ([4], [0], [1], [-2]),
    ([0], [2**62], [1], None)])
def test_slice_is_python_slicing(rng, starts, ends, axes, steps):
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    out = run_op(lambda v: md.ops.slice(v, starts, ends, axes, steps), x)
    idx = [slice(None)] * 3
    for i, (s, e) in enumerate(zip(starts, ends)):
        a = axes[i] if axes else i
        idx[a] = slice(s, e, steps[i] if steps else 1)
    np.testing.assert_array_equal(out, x[tuple(idx)])


def test_gather_tile_select(rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    idx = np.array([[0, -1], [2, 1]], np.int64)
    out = run_op(lambda v, i: md.ops.gather(v, i, axis=1), x, idx)
    np.testing.assert_array_equal(out, np.take(x, idx, axis=1))
    out = run_op(lambda v: md.ops.tile(v, [2, 1, 1, 3]), x)
    np.testing.assert_array_equal(out, torch.from_numpy(x).tile((2, 1, 1, 3)).numpy())
    cond = rng.random((4, 1)) > 0.5
    y = rng.standard_normal((5,)).astype(np.float32)
    out = run_op(md.ops.select, cond, x, y)
    np.testing.assert_array_equal(out, torch.where(torch.from_numpy(cond), torch.from_numpy(x),
                                                   torch.from_numpy(y)).numpy())


def test_gather_out_of_range_fails_at_run_time():
    with pytest.raises(md.GraphError, match="index 7 is out of range"):
        run_op(lambda v, i: md.ops.gather(v, i), np.zeros((3, 2), np.float32),
               np.array([7], np.int64))


def test_select_needs_bool_cond():
    g = md.Graph("t", [md.TensorType("float32", (2,))] * 3)
    with pytest.raises(md.GraphError, match="cond must be bool"):
        md.ops.select(*g.inputs)


def test_expand_as_matches_torch_and_takes_symbolic_dims():
    """``expand_as(x, like)`` is torch's ``x.expand_as(like)``; the shape may be symbolic
    (a [CLS] row broadcast over a batch of n images); a dim that is neither 1 nor like's
    is refused when the node is made, and a float repeat count for ``tile`` is too."""
    import torch

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 1)).astype(np.float32)
    like = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    g = md.Graph("t", [md.TensorType("float32", (1, 3, 1)),
                       md.TensorType("float32", ("n", "s", 3, 5))])
    y = md.ops.expand_as(*g.inputs)
    assert y.type.shape == ("n", "s", 3, 5)
    g.output(y)
    (out,) = g.execute(x, like)
    want = torch.from_numpy(x).expand_as(torch.from_numpy(like)).numpy()
    assert out.tobytes() == np.ascontiguousarray(want).tobytes()
    u = md.Graph("u", [md.TensorType("float32", (2, 3, 1)),
                       md.TensorType("float32", ("n", 4, 5))])
    with pytest.raises(md.GraphError, match=r"x\[2, 3, 1\] does not broadcast to"):
        md.ops.expand_as(*u.inputs)
    with pytest.raises(md.GraphError, match="tile repeats must be non-negative ints"):
        md.ops.tile(g.inputs[0], repeats=[2.5, 1, 1])


def test_reshape_sizes_symbolic_dims_by_name_not_position():
    """[a, b] -> [b, a] swaps the sizes (a reshape, not a transpose: the elements keep
    their order), and a later reduction sees the type's shape; size-1 axes put between
    symbolic dims keep each dim's size."""
    g = md.Graph("t", [md.TensorType("float32", ("a", "b"))])
    y = md.ops.reshape(g.inputs[0], shape=("b", "a"))
    g.output([y, md.ops.sum(y, axis=1)])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y_run, s_run = md.compile(g)(x)
    np.testing.assert_array_equal(y_run, x.reshape(3, 2))
    np.testing.assert_array_equal(s_run, x.reshape(3, 2).sum(axis=1))
    g = md.Graph("t", [md.TensorType("float32", ("n", "s"))])
    g.output(md.ops.reshape(g.inputs[0], shape=("n", 1, "s", 1)))
    assert md.compile(g)(np.zeros((2, 5), np.float32))[0].shape == (2, 1, 5, 1)


def test_reshape_symbolic_dims_the_input_does_not_size_are_refused():
    g = md.Graph("t", [md.TensorType("float32", ("n", "m * 4"))])
    g.output(md.ops.reshape(g.inputs[0], shape=("n", "m", 2, 2)))
    assert md.compile(g)(np.zeros((3, 8), np.float32))[0].shape == (3, 2, 2, 2)   # m: -1
    g = md.Graph("t", [md.TensorType("float32", ("n", "m * k"))])
    with pytest.raises(md.GraphError, match="at most one dim may be left to infer"):
        md.ops.reshape(g.inputs[0], shape=("n", "m", "k"))      # refused when built
    from maxdecl.kernels.shape import resolve_dims              # and when run
    with pytest.raises(ValueError, match="do not follow from the input's dims"):
        resolve_dims(("n", "m", "k"), ("n", "m * k"), (3, 8))


def test_reshape_infers_a_dim_through_a_conv_output_length():
    """A strided conv over a symbolic length gives an opaque ``win(...)`` dim; products
    keep it a factor, so -1 is inferred through it and the runtime sizes it."""
    g = md.Graph("t", [md.TensorType("float32", ("n", 1, "samples", 1))])
    w = g.weight("w", md.TensorType("float32", (4, 1, 3, 1)))
    y = md.ops.conv2d(g.inputs[0], w, stride=[2, 1], input_layout="NCHW",
                      filter_layout="FCRS")                            # [n, 4, win(...), 1]
    z = md.ops.reshape(md.ops.transpose(y, perm=(0, 2, 1, 3)), shape=("n", -1, 4))
    assert z.type.shape[1].startswith("win(")
    g.output(z)
    out = md.compile(g, {"w": np.ones((4, 1, 3, 1), np.float32)})(
        np.ones((2, 1, 11, 1), np.float32))[0]
    assert out.shape == (2, 5, 4) and np.all(out == 3)


def test_unflatten_takes_sizes_from_another_value():
    """Tokens [n, H*W, C] back to the feature map a strided conv made ([n, H, W, C],
    H and W opaque win(...) dims): the sizes come from the map, by name at run time."""
    g = md.Graph("t", [md.TensorType("float32", ("n", "h", "w", 2))])
    w = g.weight("w", md.TensorType("float32", (2, 2, 2, 3)))                 # RSCF
    fmap = md.ops.conv2d(g.inputs[0], w, stride=2)                               # [n, H, W, 3]
    tokens = md.ops.reshape(fmap, shape=("n", -1, 3))                            # [n, H*W, 3]
    back = md.ops.unflatten(md.ops.relu(tokens), fmap, axis=1, like_axes=[1, 2])
    assert back.type.shape == fmap.type.shape
    g.output([back, fmap])
    x = np.random.default_rng(0).standard_normal((2, 7, 9, 2)).astype(np.float32)
    out, ref = md.compile(g, {"w": np.ones((2, 2, 2, 3), np.float32)})(x)
    np.testing.assert_array_equal(out, np.maximum(ref, 0))


@pytest.mark.parametrize("kw, match", [({"axis": 1, "like_axes": [0]}, "not the product"),
                                       ({"axis": 3, "like_axes": [0]}, "not an axis of x"),
                                       ({"axis": 0, "like_axes": []}, "must name axes")])
def test_unflatten_refuses_sizes_that_do_not_fit(kw, match):
    g = md.Graph("t", [md.TensorType("float32", (6, 4)), md.TensorType("float32", (2, 3))])
    with pytest.raises(md.GraphError, match=match):
        md.ops.unflatten(*g.inputs, **kw)


@pytest.mark.parametrize("shifts, axes", [([2], [0]), ([-1, 3], [1, 2]), ([5, -7], [-1, 0])])
def test_roll_matches_torch(shifts, axes):
    x = np.arange(2 * 5 * 4, dtype=np.float32).reshape(2, 5, 4)
    out = run_op(lambda v: md.ops.roll(v, shifts=shifts, axes=axes), x)
    np.testing.assert_array_equal(out, torch.roll(torch.from_numpy(x), shifts, axes).numpy())


def test_roll_needs_a_shift_per_axis():
    g = md.Graph("t", [md.TensorType("float32", (2, 3))])
    with pytest.raises(md.GraphError, match="one shift per axis"):
        md.ops.roll(g.inputs[0], shifts=[1, 2], axes=[0])


@pytest.mark.parametrize("xs, ids, axis", [((5, 8), (5, 3), 1), ((5, 8), (2, 8), 0),
                                           ((2, 4, 6), (2, 4, 6), -1), ((3, 1, 6), (3, 4, 2), 2),
                                           ((4, 7), (1, 3), 1)])
def test_take_along_axis_matches_torch_gather(xs, ids, axis):
    import torch

    rng = np.random.default_rng(len(xs) + axis)
    x = rng.standard_normal(xs).astype(np.float32)
    idx = rng.integers(0, xs[axis], ids).astype(np.int64)
    out = run_op(lambda a, b: md.ops.take_along_axis(a, b, axis=axis), x, idx)
    shape = [max(a, b) for a, b in zip(xs, ids)]
    shape[axis] = xs[axis]
    ref = torch.gather(torch.from_numpy(x).expand(*shape), axis, torch.from_numpy(idx)
                       .expand(*[s if i != axis % len(xs) else ids[axis] for i, s in
                                 enumerate(shape)]))
    np.testing.assert_array_equal(out, ref.numpy())


def test_take_along_axis_refuses_bad_indices():
    g = md.Graph("t", [md.TensorType("float32", (4, 5)), md.TensorType("int64", (4,)),
                       md.TensorType("int64", (3, 2)), md.TensorType("int64", (4, 2))])
    with pytest.raises(md.GraphError, match="indices must have x.s rank"):
        md.ops.take_along_axis(g.inputs[0], g.inputs[1], axis=1)
    with pytest.raises(md.GraphError, match="do not broadcast"):
        md.ops.take_along_axis(g.inputs[0], g.inputs[2], axis=1)
    g.output(md.ops.take_along_axis(g.inputs[0], g.inputs[3], axis=1))
    x = np.zeros((4, 5), np.float32)
    with pytest.raises(md.GraphError, match="index 5 is out of range for axis 1 of size 5"):
        g.execute(x, np.zeros(4, np.int64), np.zeros((3, 2), np.int64),
                  np.full((4, 2), 5, np.int64))


def test_arange_like_counts_along_a_symbolic_axis():
    """The positions of a decoder's keys: the cached ones from the cache's length, then
    this step's (T5's relative bias over every key)."""
    g = md.Graph("t", [md.TensorType("float32", (2, "past", 1, 4)),
                       md.TensorType("int64", ("seq",))])
    cached = md.ops.arange_like(g.inputs[0], axis=1)
    assert cached.type.shape == ("past",) and cached.type.dtype == md.DType.int64
    keys = md.ops.concat([cached, g.inputs[1]], axis=0)
    g.output([keys, md.ops.arange_like(g.inputs[1], start=5)])
    keys, later = g.execute(np.zeros((2, 3, 1, 4), np.float32), np.array([3, 4]))
    assert keys.tolist() == [0, 1, 2, 3, 4] and later.tolist() == [5, 6]
    with pytest.raises(md.GraphError, match="start must be an int"):
        md.ops.arange_like(g.inputs[1], start=1.5)


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pads, axes, torch_pads", [
    ([1, 2, 3, 0], [1, 2], (0, 0, 3, 0, 1, 2)),        # NHWC: H by (1, 2), W by (3, 0)
    ([2, 1], None, (2, 1)),                              # the last axis
    ([0, 0, 1, 1], [0, -1], (1, 1))])                   # a zero pair on the batch axis
def test_pad_matches_torch(mode, pads, axes, torch_pads):
    import torch.nn.functional as F

    x = np.random.default_rng(3).standard_normal((2, 5, 6, 3)).astype(np.float32)
    out = run_op(lambda v: md.ops.pad(v, pads, axes=axes, mode=mode, value=0.5), x)
    t = torch.from_numpy(x)
    kw = {"value": 0.5} if mode == "constant" else {}
    if mode == "constant":
        ref = F.pad(t, torch_pads, mode=mode, **kw)
    elif len(torch_pads) == 2:                         # torch: the last axis of [B, C, L]
        ref = F.pad(t.reshape(-1, 1, 3), torch_pads, mode=mode).reshape(2, 5, 6, -1)
    else:                                              # torch: spatial dims of NCHW
        ref = F.pad(t.permute(0, 3, 1, 2), torch_pads[2:6], mode=mode).permute(0, 2, 3, 1)
    np.testing.assert_array_equal(out, ref.numpy())


def test_pad_symbolic_sizes_and_refusals():
    g = md.Graph("t", [md.TensorType("float32", (1, "h", 4))])
    y = md.ops.pad(g.inputs[0], [1, 2], axes=[1])
    assert y.type.shape == (1, "h+3", 4)
    for kw, match in ((dict(pads=[1]), "pair per axis"), (dict(pads=[-1, 0]), "non-negative"),
                      (dict(pads=[1, 1], axes=[0, 1]), "need 1 axes"),
                      (dict(pads=[4, 0], mode="reflect"), "must be less than the size 4"),
                      (dict(pads=[5, 0], mode="circular"), "wraps more"),
                      (dict(pads=[1, 1], mode="edge"), "mode must be one of")):
        with pytest.raises(md.GraphError, match=match):
            md.ops.pad(g.inputs[0], **kw)
    g.output(md.ops.pad(g.inputs[0], [3, 0], axes=[1], mode="reflect"))
    with pytest.raises(md.GraphError, match="must be less than the size 2"):
        g.execute(np.zeros((1, 2, 4), np.float32))


def test_unflatten_by_fixed_sizes_over_static_and_symbolic_axes():
    """torch's x.unflatten(axis, (-1, p)): sizes with one -1; over a symbolic length the
    quotient (2*h / 2 is h) or an opaque div(h,p) dim, checked when it runs."""
    g = md.Graph("t", [md.TensorType("float32", (1, "2*h", 6, 3)),
                       md.TensorType("float32", (1, "w", 3))])
    a = md.ops.unflatten(g.inputs[0], axis=1, sizes=[-1, 2])
    b = md.ops.unflatten(g.inputs[0], axis=2, sizes=[3, 2])
    c = md.ops.unflatten(g.inputs[1], axis=1, sizes=[-1, 4])
    assert a.type.shape == (1, "h", 2, 6, 3) and b.type.shape == (1, "2*h", 3, 2, 3)
    assert c.type.shape == (1, "div(w,4)", 4, 3)
    g.output([a, c])
    x = np.arange(1 * 4 * 6 * 3, dtype=np.float32).reshape(1, 4, 6, 3)
    y = np.arange(1 * 8 * 3, dtype=np.float32).reshape(1, 8, 3)
    out_a, out_c = g.execute(x, y)
    np.testing.assert_array_equal(out_a, torch.from_numpy(x).unflatten(1, (-1, 2)).numpy())
    np.testing.assert_array_equal(out_c, torch.from_numpy(y).unflatten(1, (-1, 4)).numpy())
    with pytest.raises(md.GraphError, match="do not fit the axis length 6"):
        g.execute(x, np.zeros((1, 6, 3), np.float32))
    empty = np.zeros((1, 4, 0, 3), np.float32)           # another axis empty: -1 still 2
    g2 = md.Graph("t", [md.TensorType("float32", (1, 4, "n", 3))])
    g2.output(md.ops.unflatten(g2.inputs[0], axis=1, sizes=[-1, 2]))
    assert g2.execute(empty)[0].shape == torch.from_numpy(empty).unflatten(1, (-1, 2)).shape
    for kw, match in ((dict(sizes=[-1, -1]), "one of them -1 at most"),
                      (dict(sizes=[4, 4]), "multiply to 16"), (dict(sizes=[0, -1]), "positive"),
                      (dict(), "either the input like with like_axes, or sizes")):
        with pytest.raises(md.GraphError, match=match):
            md.ops.unflatten(g.inputs[0], axis=2, **kw)


@pytest.mark.parametrize("shape,axis", [((1, 3, 1), 0), ((1, 3, 1), [0, -1]), ((4, 1), -1),
                                        ((2, 1, 1, 5), [2, 1])])
def test_squeeze_matches_torch(rng, shape, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    out = run_op(lambda v: md.ops.squeeze(v, axis=axis), x)
    want = torch.from_numpy(x).squeeze(axis if isinstance(axis, int) else tuple(axis))
    assert out.shape == tuple(want.shape)
    np.testing.assert_array_equal(out, want.numpy())


@pytest.mark.parametrize("shape,axis", [((3,), 0), ((3,), -1), ((2, 3), [0, 3]),
                                        ((2, 3), [-1, 1])])
def test_unsqueeze_matches_numpy_and_torch(rng, shape, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    out = run_op(lambda v: md.ops.unsqueeze(v, axis=axis), x)
    want = np.expand_dims(x, axis if isinstance(axis, int) else tuple(axis))
    assert out.shape == want.shape
    np.testing.assert_array_equal(out, want)
    if isinstance(axis, int):
        np.testing.assert_array_equal(out, torch.from_numpy(x).unsqueeze(axis).numpy())


def test_squeeze_checks_sizes_when_known_and_when_run():
    g = md.Graph("t", [md.TensorType("float32", (2, "n"))])
    with pytest.raises(md.GraphError, match="squeeze axis 0 of x\\[2, n\\] has size 2"):
        md.ops.squeeze(g.inputs[0], axis=0)
    assert md.ops.squeeze(g.inputs[0], axis=1).shape == (2,)    # n: checked when it runs
    with pytest.raises(md.GraphError, match="names an axis twice"):
        md.ops.unsqueeze(g.inputs[0], axis=[1, -3])
    g.output(md.ops.squeeze(g.inputs[0], axis=-1))
    with pytest.raises(md.GraphError, match="has size 3, not 1"):
        md.compile(g)(np.zeros((2, 3), np.float32))
    (y,) = md.compile(g)(np.zeros((2, 1), np.float32))
    assert y.shape == (2,)


def test_identity_is_its_input(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = run_op(md.ops.identity, x)
    np.testing.assert_array_equal(out, x)
    g = md.Graph("t", [md.TensorType("int64", ("n",))])
    assert md.ops.identity(g.inputs[0]).type == g.inputs[0].type


@pytest.mark.parametrize("shape,repeats,axis", [((3,), 2, 0), ((2, 3, 4), 3, 1),
                                                ((2, 3), 1, -1), ((2, 3), 0, 0)])
def test_repeat_interleave_matches_torch(rng, shape, repeats, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    out = run_op(lambda v: md.ops.repeat_interleave(v, repeats=repeats, axis=axis), x)
    want = torch.from_numpy(x).repeat_interleave(repeats, dim=axis).numpy()
    assert out.shape == want.shape
    np.testing.assert_array_equal(out, want)


def test_repeat_interleave_types():
    g = md.Graph("t", [md.TensorType("float32", ("seq", 4))])
    assert md.ops.repeat_interleave(g.inputs[0], repeats=2, axis=0).shape == ("2*seq", 4)
    with pytest.raises(md.GraphError, match="repeats must be a non-negative int"):
        md.ops.repeat_interleave(g.inputs[0], repeats=-1)


@pytest.mark.parametrize("shape, axis, size, step", [
    ((2, 9, 4), 1, 5, 1), ((2, 9, 4), 1, 3, 2), ((7,), 0, 7, 3), ((3, 4, 10), -1, 4, 3),
    ((2, 6, 5), 0, 1, 1)])
def test_unfold_matches_torch(shape, axis, size, step, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    out = run_op(md.ops.unfold, x, axis=axis, size=size, step=step)
    want = torch.from_numpy(x).unfold(axis, size, step).numpy()
    assert out.shape == want.shape and out.tobytes() == want.tobytes()


def test_unfold_sizes_symbolic_axes():
    """A padded symbolic axis unfolded with step 1 keeps its name (seq + 4 padded, windows
    of 5: seq); other steps give an opaque window dim; too short an axis is refused."""
    g = md.Graph("t", [md.TensorType("float32", ("batch", "seq", 8))])
    padded = md.ops.pad(g.inputs[0], pads=[2, 2], axes=[1])
    w = md.ops.unfold(padded, axis=1, size=5)
    assert w.shape == ("batch", "seq", 8, 5)
    other = md.Graph("o", [md.TensorType("float32", ("batch", "seq", 8))])
    assert md.ops.unfold(other.inputs[0], axis=1, size=4, step=2).shape[1].startswith("win(")
    g.output(w)
    (out,) = g.execute(np.ones((2, 3, 8), np.float32))
    assert out.shape == (2, 3, 8, 5)
    with pytest.raises(md.GraphError, match="windows of 3 do not fit axis 0 of size 2"):
        md.ops.unfold(md.Graph("u", [md.TensorType("float32", (2, 5))]).inputs[0], axis=0,
                      size=3)
    short = md.Graph("v", [md.TensorType("float32", ("n",))])
    short.output(md.ops.unfold(short.inputs[0], axis=0, size=3))
    with pytest.raises(md.GraphError, match="windows of 3 do not fit"):
        short.execute(np.ones(2, np.float32))


def test_full_like_never_reads_the_values():
    """torch.full_like: x's shape, its dtype or the one given; inf and NaN in x do not
    leak in (mul(x, 0.0) would give NaN)."""
    x = np.array([[np.inf, np.nan, -1.5]], np.float32)
    zeros = run_op(md.ops.full_like, x)
    sevens = run_op(lambda v: md.ops.full_like(v, value=7, dtype="int64"), x)
    assert zeros.dtype == np.float32 and zeros.tolist() == [[0.0, 0.0, 0.0]]
    assert sevens.dtype == np.int64 and sevens.tolist() == [[7, 7, 7]]
    want = torch.full_like(torch.from_numpy(x), 2.5).numpy()
    assert run_op(lambda v: md.ops.full_like(v, value=2.5), x).tobytes() == want.tobytes()
    g = md.Graph("t", [md.TensorType("float32", ("n",))])
    with pytest.raises(md.GraphError, match="not a whole number for int64"):
        md.ops.full_like(g.inputs[0], value=0.5, dtype="int64")


@pytest.mark.parametrize("shape, multiples, axes", [((2, 9, 14, 3), (7, 7), (1, 2)),
                                                     ((5, 8), 4, None), ((1, 10), (3,), (1,))])
def test_pad_to_multiple_matches_torch(shape, multiples, axes, rng):
    """Zeros (or value) after each axis up to its multiple, as Swin's F.pad(0, pad_r,
    0, pad_b); an axis already a multiple is unchanged."""
    x = rng.standard_normal(shape).astype(np.float32)
    out = run_op(lambda v: md.ops.pad_to_multiple(v, multiples=multiples, axes=axes,
                                                  value=-2.0), x)
    ms = (multiples,) if isinstance(multiples, int) else multiples
    ax = axes or tuple(range(-len(ms), 0))
    width = [0] * (2 * x.ndim)
    for a, m in zip(ax, ms):
        a %= x.ndim
        width[2 * (x.ndim - 1 - a) + 1] = (-x.shape[a]) % m
    want = torch.nn.functional.pad(torch.from_numpy(x), width, value=-2.0).numpy()
    assert out.shape == want.shape and out.tobytes() == want.tobytes()


def test_pad_to_multiple_splits_symbolic_maps_into_windows():
    """A symbolic [n, h, w, c] map padded to whole 7x7 windows is cut into them by
    unflatten (Swin's window partition at any image size)."""
    g = md.Graph("t", [md.TensorType("float32", ("n", "h", "w", 3))])
    y = md.ops.pad_to_multiple(g.inputs[0], multiples=(7, 7), axes=(1, 2))
    z = md.ops.unflatten(md.ops.unflatten(y, axis=1, sizes=[-1, 7]), axis=3, sizes=[-1, 7])
    win = md.ops.reshape(md.ops.transpose(z, perm=[0, 1, 3, 2, 4, 5]), shape=[-1, 49, 3])
    g.output(win)
    for h, w in [(9, 14), (7, 7), (1, 20)]:
        (out,) = g.execute(np.ones((2, h, w, 3), np.float32))
        assert out.shape == (2 * -(-h // 7) * -(-w // 7), 49, 3)
        assert out.sum() == 2 * h * w * 3


def test_axis_size_is_an_int64_scalar_known_at_run_time(rng):
    g = md.Graph("t", [md.TensorType("float32", ("batch", "seq", 4))])
    sizes = [md.ops.axis_size(g.inputs[0], axis=a) for a in (0, 1, -1)]
    assert all(s.shape == () and s.dtype == md.DType.int64 for s in sizes)
    g.output(sizes)
    got = g.execute(rng.standard_normal((2, 7, 4)).astype(np.float32))
    assert [int(v) for v in got] == [2, 7, 4] and all(v.dtype == np.int64 for v in got)
    with pytest.raises(md.GraphError, match="rank >= 1"):
        md.ops.axis_size(md.ops.axis_size(g.inputs[0]))
    with pytest.raises(md.GraphError, match="out of range"):
        md.ops.axis_size(g.inputs[0], axis=3)


def test_check_passes_x_through_or_stops_the_run_with_its_message(tmp_path):
    spec = tmp_path / "fit.yaml"
    spec.write_text("""\
maxdecl: 1
name: fit
variants:
  tiny: {window: 4}
dims: {h: map height}
inputs:
  x: {dtype: float32, shape: [h, 3]}
constants:
  win: {value: "{window}", dtype: int64}
layers:
  - name: stage
    layers:
      - {op: axis_size, in: x, attrs: {axis: 0}, out: n}
      - {op: greater_equal, in: [n, win], out: fits}
      - {op: check, in: [x, fits], attrs: {message: "a map of fewer than {window} rows"}, out: x}
      - {op: neg, in: x, out: y}
outputs: [y]
""")
    run = md.compile(md.build(str(spec)))
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(run(x)[0], -x)
    with pytest.raises(md.GraphError) as err:
        run(x[:3])
    assert str(err.value).endswith("stage: check: a map of fewer than 4 rows")
    g = md.Graph("t", [md.TensorType("float32", (2,)), md.TensorType("int64", (2,))])
    with pytest.raises(md.GraphError, match="bool condition"):
        md.ops.check(g.inputs[0], g.inputs[1], message="m")
    with pytest.raises(md.GraphError, match="one line"):
        md.ops.check(g.inputs[0], md.ops.greater(g.inputs[1], g.inputs[1]), message="a\nb")


@pytest.mark.parametrize("shape,start,end", [((2, 3, 4, 5), 2, -1), ((2, 3, 4, 5), 0, 1),
                                             ((2, 3, 4), 0, -1), ((2, 0, 4), 1, 2),
                                             ((6,), 0, 0)])
def test_flatten_matches_torch(rng, shape, start, end):
    x = rng.standard_normal(shape).astype(np.float32)
    got = run_op(lambda v: md.ops.flatten(v, start_axis=start, end_axis=end), x)
    want = torch.flatten(torch.from_numpy(x), start, end).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_flatten_multiplies_symbolic_dims_and_undoes_unflatten():
    g = md.Graph("t", [md.TensorType("float32", ("b", "seq", 4, 8))])
    y = md.ops.flatten(g.inputs[0], start_axis=1, end_axis=2)
    assert y.shape == ("b", "4*seq", 8)
    z = md.ops.flatten(g.inputs[0], start_axis=2)
    assert z.shape == ("b", "seq", 32)
    with pytest.raises(md.GraphError, match="comes before"):
        md.ops.flatten(g.inputs[0], start_axis=2, end_axis=1)


def test_expand_as_with_axes_takes_only_those_sizes_from_like(rng):
    """A learned table [1, N, D] takes like's batch (Perceiver's latents), whatever
    like's other sizes; as torch's ``table.expand(batch, -1, -1)``."""
    table = rng.standard_normal((1, 5, 4)).astype(np.float32)
    like = np.zeros((3, 7, 4), np.float32)
    got = run_op(lambda t, l: md.ops.expand_as(t, l, axes=[0]), table, like)
    np.testing.assert_array_equal(got, torch.from_numpy(table).expand(3, -1, -1).numpy())
    g = md.Graph("t", [md.TensorType("float32", (2, 5, 4)),
                       md.TensorType("float32", ("batch", "seq", 4))])
    for kwargs, message in [(dict(axes=[0]), "axis 0 of x\\[2, 5, 4\\] is not 1"),
                            (dict(axes=[0, 0]), "repeat an axis"), (dict(axes=[]), "non-empty")]:
        with pytest.raises(md.GraphError, match=message):
            md.ops.expand_as(*g.inputs, **kwargs)


def test_strided_slices_of_a_padded_symbolic_axis_keep_one_length(rng):
    """``x[:, 0::2]`` and ``x[:, 1::2]`` of a map padded to even (Swin's patch merging)
    both type as half the padded length, so they concat; as torch at odd and even sizes."""
    g = md.Graph("t", [md.TensorType("float32", ("n", "h", "w", 3))])
    x = md.ops.pad_to_multiple(g.inputs[0], axes=[1, 2], multiples=[2, 2])
    parts = [md.ops.slice(x, starts=[r, c], ends=[None, None], axes=[1, 2], steps=[2, 2])
             for r, c in ((0, 0), (1, 0), (0, 1), (1, 1))]
    assert len({p.shape for p in parts}) == 1
    y = md.ops.concat(parts, axis=-1)
    g.output(y)
    for h, w in ((4, 6), (5, 3), (1, 1)):
        a = rng.standard_normal((2, h, w, 3)).astype(np.float32)
        t = torch.nn.functional.pad(torch.from_numpy(a), (0, 0, 0, w % 2, 0, h % 2))
        want = torch.cat([t[:, 0::2, 0::2], t[:, 1::2, 0::2], t[:, 0::2, 1::2],
                          t[:, 1::2, 1::2]], -1).numpy()
        np.testing.assert_array_equal(g.execute(a)[0], want)
    odd = md.ops.slice(g.inputs[0], starts=[1], ends=[None], axes=[1], steps=[2])
    assert odd.shape[1] != "h" and "[" in odd.shape[1]        # not a multiple of 2: opaque


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_to_multiple_modes_match_torch_pad(mode):
    """Swin2SR reflect-pads a map up to whole windows: each mode as torch's F.pad with
    the amounts up to the multiples."""
    import torch.nn.functional as F

    x = np.arange(2 * 5 * 7, dtype=np.float32).reshape(2, 5, 7)
    out = run_op(lambda v: md.ops.pad_to_multiple(v, multiples=[4, 4], axes=[1, 2],
                                                  mode=mode), x)
    ref = F.pad(torch.from_numpy(x)[None], (0, 1, 0, 3), mode=mode)[0].numpy()
    np.testing.assert_array_equal(out, ref)


def test_an_empty_slice_of_a_symbolic_axis_is_zero_long():
    """x[:, 0:0] starts a value that a repeat grows with concat: its axis types as 0,
    not as an opaque slice of n, so the grown axis is the pieces' sum."""
    g = md.Graph("t", [md.TensorType("float32", ("b", "n", 4))])
    x = g.inputs[0]
    empty = md.ops.slice(x, [0], [0], [1])
    assert empty.type.shape == ("b", 0, 4)
    assert md.ops.slice(x, [-1], [-3], [1]).type.shape == ("b", 0, 4)
    grown = md.ops.concat([empty, x, x], axis=1)
    assert grown.type.shape == ("b", "2*n", 4)
    g.output(grown)
    (out,) = g.execute(np.ones((2, 3, 4), np.float32))
    assert out.shape == (2, 6, 4)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_repeat_interleave_counts_is_torch(rng, axis):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    n = x.shape[axis]
    counts = rng.integers(0, 4, n).astype(np.int64)
    g = md.Graph("t", [md.TensorType("float32", (3, 4, 5)), md.TensorType("int64", (n,))])
    y = md.ops.repeat_interleave(g.inputs[0], g.inputs[1], axis=axis, length="frames")
    assert y.shape[axis % 3] == "frames"
    g.output(y)
    (out,) = g.execute(x, counts)
    want = torch.repeat_interleave(torch.from_numpy(x), torch.from_numpy(counts), dim=axis)
    np.testing.assert_array_equal(out, want.numpy())


def test_repeat_interleave_counts_errors(rng):
    g = md.Graph("t", [md.TensorType("float32", ("seq", 4)), md.TensorType("int64", ("seq",)),
                       md.TensorType("int64", (3,))])
    x, c, c3 = g.inputs
    with pytest.raises(md.GraphError, match="name it with `length`"):
        md.ops.repeat_interleave(x, c)
    with pytest.raises(md.GraphError, match="not both"):
        md.ops.repeat_interleave(x, c, repeats=2, length="frames")
    y = md.ops.repeat_interleave(x, c, length="frames")
    g.output(y)
    xs = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(md.GraphError, match=">= 0"):
        g.execute(xs, np.array([1, -1, 2]), np.zeros(3, np.int64))
    with pytest.raises(md.GraphError, match="more than"):
        g.execute(xs, np.array([1, 1 << 40, 2]), np.zeros(3, np.int64))
    (out,) = g.execute(xs, np.array([0, 0, 0]), np.zeros(3, np.int64))
    assert out.shape == (0, 4)
