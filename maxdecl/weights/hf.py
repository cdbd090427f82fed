"""Hugging Face model directories (config.json + *.safetensors) -> TensorDict.

Tensors keep their Hugging Face names (``model.layers.0.self_attn.q_proj.weight``);
a spec's declared mapping (``maxdecl.weights.mapping.remap``) renames them.
Arrays are read-only memory maps of the shards. BF16 tensors, the usual dtype of
released checkpoints, stay packed as ``bf16`` QuantizedTensors (bf16 is an
encoding in maxdecl): no copy at load, ``.dequantize()`` gives float32.

Shards: ``model.safetensors.index.json`` (``{"weight_map": {name: shard file}}``)
when present, else every ``*.safetensors`` file in the directory.
"""

from __future__ import annotations

import os

from ..errors import WeightsError
from ._checks import load_json
from ..tensors import TensorDict

__all__ = ["load_hf", "read_hf_config", "load_safetensors", "INDEX_NAME"]

INDEX_NAME = "model.safetensors.index.json"
MAX_JSON_BYTES = 64 << 20     # config.json / the shard index (real ones are < 10 MB)


def read_hf_config(path) -> dict:
    """The parsed ``config.json`` of a Hugging Face model directory (or the file itself).

    Raises:
        WeightsError: no config.json, or it is not a JSON object.
    """
    path = os.fspath(path)
    cfg = os.path.join(path, "config.json") if os.path.isdir(path) else path
    data = _read_json(cfg)
    if not isinstance(data, dict):
        raise WeightsError(f"{cfg}: a JSON object expected, got {type(data).__name__}")
    return _special_floats(data)


_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _special_floats(value):
    """transformers 5 writes inf and NaN as ``{"__float__": "Infinity"}``: as floats."""
    if isinstance(value, dict):
        if len(value) == 1 and value.get("__float__") in _FLOATS:
            return _FLOATS[value["__float__"]]
        return {k: _special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_special_floats(v) for v in value]
    return value


def _read_json(path: str):
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such file") from None
    except OSError as e:
        raise WeightsError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise WeightsError(f"{path}: larger than {MAX_JSON_BYTES:,} bytes (MAX_JSON_BYTES)")
    return load_json(path, raw)


def load_safetensors(path) -> TensorDict:
    """Memory-map one safetensors file (a maxdecl checkpoint or any other).

    Same as ``md.checkpoint.load``: quantized tensors saved by maxdecl come back
    packed; a foreign file loads as plain arrays (BF16 as ``bf16`` QuantizedTensors).
    """
    from .. import checkpoint

    return checkpoint.load(path)


def load_hf(path) -> TensorDict:
    """Load a Hugging Face model directory: every tensor of its safetensors shards.

    Returns:
        TensorDict keyed by Hugging Face names; ``metadata`` is the config.json
        dict plus ``"maxdecl.format": "hf"``.

    Raises:
        WeightsError: no config.json, no safetensors shard, a shard listed in the
            index that is missing or lacks its tensors, a tensor in two shards, or
            any shard error.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise WeightsError(f"{path}: not a directory (a Hugging Face model is a directory "
                           "with config.json and *.safetensors)")
    config = read_hf_config(path)
    index_path = os.path.join(path, INDEX_NAME)
    expected: dict[str, str] | None = None
    if os.path.exists(index_path):
        index = _read_json(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise WeightsError(f"{index_path}: corrupted index: 'weight_map' must map tensor "
                               "names to shard file names")
        for shard in set(weight_map.values()):
            if os.path.basename(shard) != shard or shard in ("", ".", ".."):
                raise WeightsError(f"{index_path}: shard {shard!r} must be a file name in "
                                   "the model directory")
        shards = sorted(set(weight_map.values()))
        expected = weight_map
    else:
        shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not shards:
            others = [f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pth"))]
            hint = (f" (found {', '.join(sorted(others)[:3])}: PyTorch pickles are not "
                    "loaded; convert them to safetensors)") if others else ""
            raise WeightsError(f"{path}: no *.safetensors files{hint}")

    td = TensorDict(metadata={**config, "maxdecl.format": "hf"})
    origin: dict[str, str] = {}
    for shard in shards:
        part = load_safetensors(os.path.join(path, shard))
        for name in part.keys():
            if name in origin:
                raise WeightsError(f"{path}: tensor {name!r} appears in both {origin[name]} "
                                   f"and {shard}")
            if expected is not None and expected.get(name) != shard:
                continue  # the index names another shard (or none): trust the index
            origin[name] = shard
            td[name] = part[name]
    if expected is not None:
        lost = [n for n, s in expected.items() if n not in td]
        if lost:
            raise WeightsError(
                f"{index_path}: {len(lost)} tensors listed in the index are not in their "
                f"shards: {', '.join(map(repr, lost[:5]))}{' ...' if len(lost) > 5 else ''}")
    return td
