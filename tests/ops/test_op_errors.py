import pytest

import maxdecl as md


def test_nested_layer_shape_mismatch_names_path_op_and_shapes():
    g = md.Graph("m", [md.TensorType("float32", ("seq", 64)), md.TensorType("float32", (63, 16))])
    x, w = g.inputs
    with g.layer("blocks"):
        with g.layer(3):
            with g.layer("attn"):
                with pytest.raises(md.GraphError) as e:
                    md.ops.matmul(x, w)
    msg = str(e.value)
    assert "blocks.3.attn" in msg and "matmul" in msg
    assert "[seq, 64]" in msg and "[63, 16]" in msg


def test_run_time_failure_names_layer():
    import numpy as np
    g = md.Graph("m", [md.TensorType("float32", (3, 2)), md.TensorType("int64", (1,))])
    with g.layer("embed"):
        y = md.ops.gather(*g.inputs)
    g.output(y)
    with pytest.raises(md.GraphError, match=r"embed: gather: .*out of range"):
        g.execute(np.zeros((3, 2), np.float32), np.array([5]))
