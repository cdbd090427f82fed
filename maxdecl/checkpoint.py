"""maxdecl checkpoints: a TensorDict in a safetensors file, quantized tensors kept packed.

What goes where (any safetensors reader can open the file)::

    float/int arrays        as themselves (F64 F32 F16 I64 ... U8 BOOL), logical shape
    bf16 QuantizedTensor    as a native BF16 tensor of its logical shape
    other QuantizedTensor   as U8 bytes of its packed shape [..., K // block_elements * block_bytes]
    __metadata__            "maxdecl.version":   "1"  (format version of this layout)
                            "maxdecl.encodings": JSON {name: {"encoding": "q4_k", "shape": [N, K]}}
                            "maxdecl.metadata":  JSON of TensorDict.metadata (GGUF keys, config...)

``load`` memory-maps the file: arrays are read-only views into it and
``view(name).unsafe_ptr()`` points into the mapping. A plain safetensors file
from another tool loads too (BF16 tensors as ``bf16`` QuantizedTensors).

Example::

    md.checkpoint.save(td, "model.safetensors")     # atomic
    td2 = md.checkpoint.load("model.safetensors")   # same keys, same bytes
"""

from __future__ import annotations

import json
import os

import numpy as np

from .errors import MaxdeclError, WeightsError
from .tensors import QuantizedTensor, TensorDict
from .weights import safetensors_io as st
from .weights._checks import check_shape, load_json

__all__ = ["save", "load", "FORMAT_VERSION"]

FORMAT_VERSION = 1
_VERSION_KEY = "maxdecl.version"
_ENCODINGS_KEY = "maxdecl.encodings"
_METADATA_KEY = "maxdecl.metadata"
FORMAT_KEY = "maxdecl.format"   # TensorDict.metadata key naming the source format


def save(td, path, *, tokenizer=None, params=None) -> None:
    """Write ``td`` (a TensorDict or a mapping of names to tensors) to ``path``.

    Everything is checked before the first byte is written; the write goes to a
    temporary file in the same directory that is fsynced and renamed over
    ``path``, so ``path`` ends up either complete or untouched. The temporary
    (``.NAME.<pid>.<hex>.tmp``) is removed on any failure, and a save first removes
    those that killed saves of the same ``path`` left (writer gone or idle for
    ``safetensors_io.STALE_AFTER`` seconds); no other file is touched.

    Args:
        tokenizer: a Tokenizer or a tokenizer path (``.gguf``, ``tokenizer.bin``,
            ``tokenizer.json``/HF dir) to carry in the metadata, so that
            ``md.load_model(spec, path)`` and ``md.load_tokenizer(path)`` find it
            (see ``pipelines.tokenizer_embed``).
        params: resolved hyperparameters ``{name: value}`` to carry (metadata
            ``"params"``), read back by ``md.load_model`` instead of the variant's.

    Raises:
        WeightsError: a tensor cannot be stored (unsupported dtype), metadata is
            not JSON-serialisable, or the file cannot be written.
    """
    path = os.fspath(path)
    extra = {}
    if tokenizer is not None:
        from .pipelines.tokenizer_embed import tokenizer_to_metadata

        extra.update(tokenizer_to_metadata(tokenizer))
    if params is not None:
        extra["params"] = dict(params)
    tensors = []
    encodings = {}
    for name, value in td.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise WeightsError(f"{path}: cannot save a tensor named {name!r}")
        if isinstance(value, QuantizedTensor):
            if value.encoding == "bf16":
                arr = np.ascontiguousarray(value.data).view("<u2").reshape(value.shape)
                tensors.append((name, "BF16", value.shape, arr))
            else:
                encodings[name] = {"encoding": value.encoding, "shape": list(value.shape)}
                tensors.append((name, "U8", value.data.shape, value.data))
            continue
        arr = np.asarray(value)
        dt = st.dtype_name(arr)
        if dt is None or arr.dtype.kind not in "fiub":
            raise WeightsError(
                f"{path}: tensor {name!r}: dtype {arr.dtype} cannot be stored in a checkpoint "
                "(supported: float64/32/16, int/uint 8-64, bool, QuantizedTensor)")
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        tensors.append((name, dt, arr.shape, arr))
    metadata = {_VERSION_KEY: str(FORMAT_VERSION)}
    if encodings:
        metadata[_ENCODINGS_KEY] = json.dumps(encodings, separators=(",", ":"))
    user = {k: v for k, v in getattr(td, "metadata", {}).items() if k != FORMAT_KEY}
    user.update(extra)
    if user:
        try:
            metadata[_METADATA_KEY] = json.dumps(user, default=_jsonable,
                                                 separators=(",", ":"), allow_nan=True)
        except (TypeError, ValueError) as e:
            raise WeightsError(
                f"{path}: TensorDict.metadata cannot be saved as JSON: {e}") from None
    st.write(path, tensors, metadata)


def _jsonable(v):
    from .weights.strings import StringArray

    if isinstance(v, (np.ndarray, StringArray)):      # StringArray: a GGUF's string arrays
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("latin-1")
    if isinstance(v, (set, frozenset, tuple)):
        return list(v)
    raise TypeError(f"{type(v).__name__} is not JSON serializable")


def load(path) -> TensorDict:
    """Memory-map a checkpoint (or any safetensors file) into a TensorDict.

    Returns:
        TensorDict with the file's keys in header order; arrays are read-only
        views of the mapped file; ``metadata`` holds the saved metadata and
        ``metadata["maxdecl.format"]`` is ``"maxdecl"`` (or ``"safetensors"`` for
        a file another tool wrote, whose ``__metadata__`` strings become the metadata).

    Raises:
        WeightsError: missing, truncated, corrupted or foreign file.
    """
    path = os.fspath(path)
    _refuse_foreign(path)
    arrays, entries, raw_meta = st.read(path)
    ours = _VERSION_KEY in raw_meta
    encodings = {}
    if ours:
        version = raw_meta[_VERSION_KEY]
        if not version.isdigit() or int(version) > FORMAT_VERSION:
            raise WeightsError(f"{path}: maxdecl checkpoint format version {version!r} is not "
                               f"supported (this maxdecl reads up to {FORMAT_VERSION})")
        encodings = _json_field(path, raw_meta, _ENCODINGS_KEY)
        metadata = _json_field(path, raw_meta, _METADATA_KEY)
        metadata[FORMAT_KEY] = "maxdecl"
    else:
        metadata = dict(raw_meta)
        metadata[FORMAT_KEY] = "safetensors"
    missing = [n for n in encodings if n not in arrays]
    if missing:
        raise WeightsError(f"{path}: corrupted checkpoint: encodings are recorded for tensors "
                           f"that are not in the file: {', '.join(map(repr, missing[:5]))}")
    td = TensorDict(metadata=metadata)
    for name, arr in arrays.items():
        try:
            td[name] = _tensor(path, name, arr, entries[name].dtype, encodings.get(name))
        except WeightsError:
            raise
        except MaxdeclError as e:
            raise WeightsError(f"{path}: tensor {name!r}: {e}") from None
    return td


def _refuse_foreign(path: str) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return  # st.read reports it
    if head[:4] == b"GGUF":
        raise WeightsError(f"{path}: is a GGUF file, not a maxdecl checkpoint "
                           "(load it with md.load_weights)")


def _json_field(path: str, meta: dict, key: str) -> dict:
    if key not in meta:
        return {}
    value = load_json(f"{path}: corrupted checkpoint: {key}", meta[key].encode("utf-8",
                                                                               "surrogatepass"))
    if not isinstance(value, dict):
        raise WeightsError(f"{path}: corrupted checkpoint: {key} must be a JSON object")
    return value


def _tensor(path: str, name: str, arr: np.ndarray, dtype: str, enc):
    """The TensorDict value for one safetensors tensor."""
    if enc is not None:
        if (not isinstance(enc, dict) or not isinstance(enc.get("encoding"), str)
                or not isinstance(enc.get("shape"), list)
                or not all(type(d) is int and d >= 0 for d in enc["shape"])):
            raise WeightsError(f"{path}: tensor {name!r}: corrupted encoding record {enc!r}")
        check_shape(f"{path}: tensor {name!r}: encoding record", enc["shape"], 4)  # float32
        if dtype != "U8":
            raise WeightsError(f"{path}: tensor {name!r}: quantized tensors are stored as U8, "
                               f"found {dtype}")
        return QuantizedTensor(arr, tuple(enc["shape"]), enc["encoding"])
    if dtype == "BF16":
        if arr.ndim == 0:
            # A bf16 scalar: no row to quantize along; widen it exactly to float32.
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return bf16_tensor(arr)
    return arr


def bf16_tensor(u16: np.ndarray) -> QuantizedTensor:
    """Wrap bf16 values held as a uint16 array (no copy) as a ``bf16`` QuantizedTensor."""
    shape = u16.shape
    data = u16.view(np.uint8).reshape(*shape[:-1], shape[-1] * 2)
    return QuantizedTensor(data, shape, "bf16")
