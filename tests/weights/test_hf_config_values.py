"""``formats.hf.config`` alternatives: a key, an expression over config.json keys (only
the keys its taken branch reads must be there), a constant; tried in order."""

import dataclasses
import os
from types import MappingProxyType

import maxdecl as md
from maxdecl.weights.for_spec import params_from_metadata

SPEC = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "specs", "llama3.yaml")


def _with_config(config: dict):
    spec = md.load_spec(SPEC)
    formats = {k: dict(v) for k, v in spec.formats.items()}
    formats["hf"]["config"] = config
    return dataclasses.replace(spec, formats=MappingProxyType(formats))


def test_an_expression_needs_only_the_keys_of_its_taken_branch():
    spec = _with_config({
        "n_heads": "{num_heads if num_heads else absent_key}",      # taken: num_heads
        "n_kv_heads": ["{absent_key}", "{absent_key if False else 2}"],
        "dim": ["{absent_key * 2}", "hidden_size"],
        "rope_theta": 10000.0,                                     # a constant
    })
    meta = {"maxdecl.format": "hf", "num_heads": 8, "hidden_size": 64}
    got = params_from_metadata(spec, meta)
    assert got == {"n_heads": 8, "n_kv_heads": 2, "dim": 64, "rope_theta": 10000.0}


def test_a_param_none_of_whose_alternatives_gives_a_value_is_left_out():
    spec = _with_config({"n_heads": ["{absent_key}", "other_absent_key"]})
    assert params_from_metadata(spec, {"maxdecl.format": "hf", "num_heads": 8}) == {}


def test_a_constant_none_sets_none_where_a_key_gives_none_falls_through():
    """``[key, "{None}"]``: the key's value, else None (not the variant's value, as for a
    GGUF constant); a key or expression that gives None tries the next alternative."""
    spec = _with_config({"context": ["max_position_embeddings", "{None}"],
                         "n_kv_heads": ["{num_kv if num_kv else None}", 2],
                         "rope_theta": ["rope_theta", "{None if absent_key else 5.0}"]})
    got = params_from_metadata(spec, {"maxdecl.format": "hf", "num_kv": 0, "absent_key": 1})
    assert got["n_kv_heads"] == 2 and "rope_theta" not in got
    assert "context" in got and got["context"] is None
    got = params_from_metadata(spec, {"maxdecl.format": "hf", "max_position_embeddings": 64,
                                      "num_kv": 4})
    assert got["context"] == 64 and got["n_kv_heads"] == 4


def test_special_floats_of_transformers_5_read_as_floats(tmp_path):
    """transformers 5 writes inf and NaN as {"__float__": "Infinity"} (Mamba-2's
    time_step_limit): config.json gives floats; any other such dict stays as it is."""
    import json
    import math

    from maxdecl.weights.hf import read_hf_config

    (tmp_path / "config.json").write_text(json.dumps({
        "time_step_limit": [0.0, {"__float__": "Infinity"}], "low": {"__float__": "-Infinity"},
        "odd": {"__float__": "bogus"}, "nested": {"a": [{"__float__": "NaN"}]}}))
    cfg = read_hf_config(tmp_path)
    assert cfg["time_step_limit"] == [0.0, math.inf] and cfg["low"] == -math.inf
    assert cfg["odd"] == {"__float__": "bogus"} and math.isnan(cfg["nested"]["a"][0])
