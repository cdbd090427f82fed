"""Symbolic dims as polynomials of names (maxdecl.dims), checked against plain arithmetic."""

import random

import pytest

from maxdecl import dims


def test_sums_and_products_are_canonical():
    assert dims.add("past", "seq") == dims.add("seq", "past") == "past+seq"
    assert dims.mul(4, "seq") == dims.mul("seq", 4) == "4*seq"
    assert dims.add("seq", 0) == "seq" and dims.mul("seq", 1) == "seq"
    assert dims.add(3, 4) == 7 and dims.mul(3, 4) == 12
    assert dims.poly("past+seq") == dims.poly("seq + past")
    assert dims.mul("seq", 64, 4) == dims.mul("256*seq")


def test_differ_only_when_no_sizes_can_make_them_equal():
    assert dims.differ(256, 264)
    assert dims.differ("seq", "seq+1")
    assert dims.differ(dims.mul("seq", 256), dims.mul("seq", 255))
    assert not dims.differ("seq", 4)            # seq may be 4: checked at run time
    assert not dims.differ("seq", "past")
    assert not dims.differ("4*seq", "seq*4")


def test_divide_keeps_the_quotient_symbolic():
    assert dims.divide(dims.mul("seq", 4, 64), 256) == "seq"
    assert dims.divide(dims.mul("seq", 256), "seq") == 256
    assert dims.divide("seq", 3) is None
    assert dims.divide(dims.add("past", "seq"), 2) is None


def test_opaque_names_stay_whole():
    assert dims.names("seq[1:3:1]") == {"seq[1:3:1]"}
    assert dims.add("seq[-1:]", "past") == "past+seq[-1:]"


def test_polynomials_agree_with_integer_arithmetic():
    rng = random.Random(0)
    for _ in range(300):
        sizes = {"a": rng.randint(0, 9), "b": rng.randint(0, 9), "c": rng.randint(0, 9)}
        terms = [rng.choice(["a", "b", "c", rng.randint(0, 5)]) for _ in range(rng.randint(1, 4))]
        total = dims.add(*terms)
        assert dims.evaluate(total, sizes) == sum(sizes.get(t, t) for t in terms)
        prod = dims.mul(*terms)
        expect = 1
        for t in terms:
            expect *= sizes.get(t, t)
        assert dims.evaluate(prod, sizes) == expect


@pytest.mark.parametrize("bad", [True, 1.5, None, ["seq"]])
def test_non_dims_are_rejected(bad):
    with pytest.raises(TypeError):
        dims.poly(bad)


def test_opaque_factors_multiply_and_divide_like_names():
    w = "win(win(samples,10,5,1,0,0),3,2,1,0,0)"
    prod = dims.mul("n", 1, w, 24)
    assert dims.poly(prod) == {("n", w): 24}
    assert dims.divide(prod, dims.mul(24, "n")) == w
    assert dims.evaluate(prod, {"n": 2, w: 7}) == 336
    assert dims.poly("f(a*b, c)") == {("f(a*b, c)",): 1}      # one opaque name, kept whole
