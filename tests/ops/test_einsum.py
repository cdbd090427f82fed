"""``einsum`` against ``torch.einsum``: contractions, diagonals, sums, ellipses, implicit
outputs, float16, symbolic dims; and the one-line errors of malformed equations."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import maxdecl as md
from ophelp import close, run_op

CASES = [
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),       # attention scores
    ("bhqk,bhkd->bhqd", [(2, 3, 4, 6), (2, 3, 6, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),                              # implicit output: "ik"
    ("i,j->ij", [(3,), (4,)]),                                # outer product
    ("ii->i", [(4, 4)]),                                      # diagonal
    ("ii", [(4, 4)]),                                         # trace
    ("ij->", [(3, 4)]),                                       # sum of all
    ("ij->ji", [(3, 4)]),                                     # transpose
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),       # broadcast ellipsis
    ("b...d,d->b...", [(2, 3, 4, 5), (5,)]),
    ("...d", [(2, 3, 5)]),                                    # implicit: "...d"
    ("bi,bj,bk->bijk", [(2, 3), (2, 4), (2, 2)]),             # three inputs
    ("nlhd,lrd->nhlr", [(2, 5, 3, 4), (5, 6, 4)]),            # relative positions
    ("bij,bij->b", [(3, 4, 5), (3, 4, 5)]),
    ("i j , j k -> i k", [(3, 4), (4, 5)]),                   # spaces
    ("bi,bi->b", [(3, 1), (1, 4)]),                           # a size-1 letter broadcasts
]


@pytest.mark.parametrize("equation,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_torch(rng, equation, shapes):
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = run_op(lambda *vs: md.ops.einsum(list(vs), equation=equation), *xs)
    want = torch.einsum(equation, *[torch.from_numpy(x) for x in xs]).numpy()
    close(got, want, atol=1e-5, rtol=1e-5, label=equation)
    assert got.flags.c_contiguous and not any(np.shares_memory(got, x) for x in xs)


def test_einsum_float16_sums_in_float32(rng):
    a = (rng.standard_normal((4, 64)) * 4).astype(np.float16)
    b = (rng.standard_normal((64, 3)) * 4).astype(np.float16)
    got = run_op(lambda x, y: md.ops.einsum([x, y], equation="ik,kj->ij"), a, b)
    want = torch.einsum("ik,kj->ij", torch.from_numpy(a).float(), torch.from_numpy(b).float())
    assert got.dtype == np.float16
    close(got, want.half().numpy(), atol=1e-2, rtol=1e-3)


def test_einsum_keeps_symbolic_dims_and_checks_them_at_run_time(rng):
    g = md.Graph("t", [md.TensorType("float32", ("batch", "seq", 8)),
                       md.TensorType("float32", (8, 16))])
    y = md.ops.einsum(list(g.inputs), equation="bsd,de->bse")
    assert y.shape == ("batch", "seq", 16)
    z = md.ops.einsum([y], equation="bse->be")
    assert z.shape == ("batch", 16)
    g.output([y, z])
    a = rng.standard_normal((2, 7, 8)).astype(np.float32)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    ys, zs = g.execute(a, w)
    close(ys, a @ w, atol=1e-4)
    close(zs, (a @ w).sum(1), atol=1e-4)


@pytest.mark.parametrize("equation,shapes,message", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "letter 'j' is 4 in one place and 5"),
    ("ij,jk->ix", [(3, 4), (4, 5)], "output letter 'x' is in no input"),
    ("ij->jj", [(3, 4)], "output letter 'j' appears twice"),
    ("ii->i", [(3, 4)], "letter 'i' is 3 and 4 in input 0"),
    ("ijk->i", [(3, 4)], "has rank 2, but its term 'ijk' names 3"),
    ("ij", [(3, 4), (4, 5)], "1 input term(s) for 2 input(s)"),
    ("i.j->i", [(3, 4)], "a '.' that is not one '...'"),
    ("...ij->ij", [(2, 3, 4)], "the output needs '...'"),
    ("ij->...", [(3, 4)], "'...' in the output but in no input"),
    ("i1->i", [(3, 4)], "unexpected character '1'"),
    ("ij->i->j", [(3, 4)], "more than one '->'"),
    ("i-j", [(3, 4)], "a '-' or '>' outside '->'"),
    ("", [(3, 4)], "non-empty string"),
])
def test_einsum_errors_name_the_problem(equation, shapes, message):
    g = md.Graph("t", [md.TensorType("float32", s) for s in shapes])
    with pytest.raises(md.GraphError, match="einsum") as err:
        md.ops.einsum(list(g.inputs), equation=equation)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_einsum_refuses_bfloat16_ints_and_mixed_dtypes():
    for types, message in [(["bfloat16"], "bfloat16 is storage only"),
                           (["int32"], "float inputs"),
                           (["float32", "float16"], "dtypes differ")]:
        g = md.Graph("t", [md.TensorType(t, (3, 3)) for t in types])
        with pytest.raises(md.GraphError, match=message):
            md.ops.einsum(list(g.inputs), equation=",".join(["ij"] * len(types)) + "->i")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_generated_contractions_match_torch(data):
    """Random equations over two inputs: each letter kept, summed, shared or repeated."""
    letters = "abcde"
    n_a = data.draw(st.integers(1, 4))
    n_b = data.draw(st.integers(1, 4))
    ta = data.draw(st.lists(st.sampled_from(letters), min_size=n_a, max_size=n_a))
    tb = data.draw(st.lists(st.sampled_from(letters), min_size=n_b, max_size=n_b))
    used = sorted(set(ta) | set(tb))
    out = data.draw(st.lists(st.sampled_from(used), unique=True, max_size=len(used)))
    sizes = {c: data.draw(st.integers(1, 4)) for c in letters}
    eq = f"{''.join(ta)},{''.join(tb)}->{''.join(out)}"
    rng = np.random.default_rng(len(eq))
    a = rng.standard_normal([sizes[c] for c in ta]).astype(np.float32)
    b = rng.standard_normal([sizes[c] for c in tb]).astype(np.float32)
    got = run_op(lambda x, y: md.ops.einsum([x, y], equation=eq), a, b)
    want = torch.einsum(eq, torch.from_numpy(a), torch.from_numpy(b)).numpy()
    close(got, want, atol=1e-4, rtol=1e-4, label=eq)
