"""A torch ``state_dict`` saved as one ``.safetensors`` file loads for every
mixture-of-experts spec: transformers 5 keeps each layer's experts fused in memory
(``experts.gate_up_proj [E, 2F, D]``, ``experts.down_proj [E, D, F]``) under module
names that ``save_pretrained`` renames, so each spec maps both spellings (the fused
gate/up by a ``split`` entry). The tensors mapped from the state_dict equal those the
model's saved folder gives."""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import hf_state, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _makers():
    from test_deepseek2_hf import make_deepseek2
    from test_granitemoe_hf import make_granitemoe
    from test_jamba_hf import make_jamba
    from test_moe_hf import make_mixtral, make_qwen3_moe
    from test_olmoe_hf import make_olmoe
    from test_qwen2_moe_hf import make_qwen2_moe

    return {"mixtral": make_mixtral, "qwen3_moe": make_qwen3_moe,
            "qwen2_moe": make_qwen2_moe, "deepseek2": make_deepseek2, "jamba": make_jamba,
            "granitemoe": make_granitemoe, "olmoe": make_olmoe}


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "qwen2_moe", "deepseek2", "jamba",
                                  "granitemoe", "olmoe"])
def test_state_dict_maps_like_the_saved_folder(arch, tmp_path):
    from maxdecl.weights.for_spec import prepare_weights

    model = _makers()[arch]()
    folder = save_hf(model, tmp_path)
    spec = md.load_spec(spec_path(arch), variant="tiny")
    ours = md.load_model(spec, folder, variant="tiny")
    sd = hf_state(model)
    assert any("gate_up_proj" in k for k in sd), "transformers keeps these experts apart"
    td = md.TensorDict(metadata={"maxdecl.format": "safetensors"})
    for k, v in sd.items():
        td[k] = v
    got = prepare_weights(spec, td, dict(ours.params))
    want = md.load_weights(folder, spec=spec_path(arch), variant="tiny")
    # a tied model's state_dict also holds lm_head.weight (the embedding's storage)
    assert set(want.keys()) <= set(got.keys()) <= set(want.keys()) | {"output.weight"}
    for name in want.keys():
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]),
                                      err_msg=f"{arch}: {name}")
