"""TensorDict + metadata -> a GGUF v3 file, through gguf-py's ``GGUFWriter``.

Tensors keep their encoding: a QuantizedTensor whose encoding is a GGML type
(q4_0, q5_0, q8_0, q4_k, q6_k, bf16, ...) is written as that type with its packed
bytes copied as they are; float32/float16 arrays as F32/F16, float64 as F32,
integer arrays as themselves. Another encoding (a user's own) is refused, naming it.

Metadata values get the GGUF types llama.cpp reads them with (it checks them):

    tokenizer.ggml.tokens / merges      [str]        tokenizer.ggml.scores   [f32]
    tokenizer.ggml.token_type           [i32]        tokenizer.ggml.*_id     u32
    tokenizer.ggml.add_*                bool         general.file_type etc.  u32
    other int    u32 (i32 if negative, 64-bit if larger)    other float   f32
    str          str (bytes kept: a vocabulary's invalid UTF-8 survives)
    numpy array  its own dtype          list         by its first element, as gguf-py

The file is written to a temporary file in the same folder and renamed over
``path``; on failure the temporary file is removed and ``path`` is untouched.
"""

from __future__ import annotations

import os
import secrets

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..blocks import GGML_BLOCKS
from ..errors import WeightsError
from ..tensors import QuantizedTensor
from .strings import StringArray

__all__ = ["write_gguf", "ggml_type", "value_type", "LLAMA_FILE_TYPES"]

V = GGUFValueType
_FIXED = {
    "tokenizer.ggml.tokens": (V.ARRAY, V.STRING), "tokenizer.ggml.merges": (V.ARRAY, V.STRING),
    "tokenizer.ggml.scores": (V.ARRAY, V.FLOAT32),
    "tokenizer.ggml.token_type": (V.ARRAY, V.INT32),
    "general.file_type": (V.UINT32, None), "general.quantization_version": (V.UINT32, None),
    "general.alignment": (V.UINT32, None),
}
_NUMPY = {np.dtype(k): v for k, v in (
    ("u1", V.UINT8), ("i1", V.INT8), ("<u2", V.UINT16), ("<i2", V.INT16),
    ("<u4", V.UINT32), ("<i4", V.INT32), ("<u8", V.UINT64), ("<i8", V.INT64),
    ("<f4", V.FLOAT32), ("<f8", V.FLOAT64), ("?", V.BOOL))}
# llama.cpp's llama_ftype for a file whose matrices are all of one type.
LLAMA_FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8,
                    "q5_1": 9, "q2_k": 10, "q3_k": 12, "q4_k": 15, "q5_k": 17, "q6_k": 18,
                    "iq4_nl": 25, "iq4_xs": 30, "bf16": 32, "tq1_0": 36, "tq2_0": 37}


def value_type(key: str, value) -> tuple:
    """(GGUF value type, array item type or None) for one metadata value (see the table)."""
    if key in _FIXED:
        return _FIXED[key]
    if key.startswith("tokenizer.ggml."):
        if key.endswith("_token_id"):
            return V.UINT32, None
        if key.split(".")[-1].startswith("add_"):
            return V.BOOL, None
    if isinstance(value, np.ndarray):
        if value.dtype.newbyteorder("<") not in _NUMPY:
            raise WeightsError(f"metadata {key!r}: arrays of {value.dtype} have no GGUF type")
        return V.ARRAY, _NUMPY[value.dtype.newbyteorder("<")]
    if isinstance(value, np.generic):
        return _NUMPY[value.dtype.newbyteorder("<")], None
    if isinstance(value, (list, tuple, StringArray)):
        if not len(value):
            raise WeightsError(f"metadata {key!r}: GGUF cannot store an empty array")
        return V.ARRAY, value_type("", value[0])[0]
    return _scalar_type(key, value), None


def _scalar_type(key: str, v) -> GGUFValueType:
    if isinstance(v, bool):
        return V.BOOL
    if isinstance(v, int):
        if 0 <= v < 1 << 32:
            return V.UINT32
        if -(1 << 31) <= v < 0:
            return V.INT32
        return V.UINT64 if v > 0 else V.INT64
    if isinstance(v, float):
        return V.FLOAT32
    if isinstance(v, (str, bytes)):
        return V.STRING
    raise WeightsError(f"metadata {key!r}: a {type(v).__name__} has no GGUF type")


def _packable(value, vtype, sub):
    """The value as GGUFWriter packs it: strings as bytes (surrogate escapes undone)."""
    if vtype == V.STRING:
        return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    if vtype == V.ARRAY:
        if isinstance(value, StringArray) and sub == V.STRING:    # the stored bytes
            return [value.item_bytes(i) for i in range(len(value))]
        items = value.tolist() if isinstance(value, np.ndarray) else list(value)
        if sub == V.STRING:
            return [s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s
                    for s in items]
        if sub in (V.FLOAT32, V.FLOAT64):
            return [float(x) for x in items]
        if sub == V.BOOL:
            return [bool(x) for x in items]
        return [int(x) for x in items]
    if vtype in (V.FLOAT32, V.FLOAT64):
        return float(value)
    if vtype == V.BOOL:
        return bool(value)
    return int(value)


def ggml_type(value) -> tuple:
    """(array to write, GGML type or None for gguf-py's own choice) for one tensor.

    Raises:
        WeightsError: an encoding GGML has no type for, or a dtype GGUF cannot hold.
    """
    if isinstance(value, QuantizedTensor):
        name = value.encoding.upper()
        try:
            gtype = GGMLQuantizationType[name]
        except KeyError:
            raise WeightsError(f"encoding {value.encoding!r} has no GGML type; re-encode it "
                               "(maxdecl quantize) to a GGML one: "
                               + ", ".join(sorted(GGML_BLOCKS))) from None
        data = np.ascontiguousarray(value.data)
        block_elements, block_bytes = GGML_QUANT_SIZES[gtype]
        want = int(np.prod(value.shape)) // block_elements * block_bytes
        if data.dtype != np.uint8 or data.nbytes != want:
            raise WeightsError(f"{value.encoding} tensor of shape {list(value.shape)}: "
                               f"{data.nbytes} bytes, GGML {name} needs {want}")
        return data.reshape(*value.shape[:-1], -1), gtype
    arr = np.asarray(value)
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    elif arr.dtype == np.bool_:
        arr = arr.astype(np.int8)
    elif arr.dtype.kind not in "fi" or arr.dtype.itemsize > 8:
        raise WeightsError(f"dtype {arr.dtype} cannot be stored in a GGUF file")
    arr = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False))
    return arr, None


def write_gguf(path, arch: str, metadata: dict, tensors) -> None:
    """Write ``tensors`` (name -> array or QuantizedTensor, in order) and ``metadata``.

    ``general.architecture`` is ``arch``; ``metadata`` must not repeat it. Keys whose
    value is None are left out.

    Raises:
        WeightsError: a value or tensor GGUF cannot hold, or the file cannot be written.

    Example::

        write_gguf("out.gguf", "llama", {"llama.block_count": 2}, td)
    """
    path = os.fspath(path)
    prepared = []
    for name, value in tensors.items():
        try:
            arr, gtype = ggml_type(value)
        except WeightsError as e:
            raise WeightsError(f"{path}: tensor {name!r}: {e}") from None
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.ndim > 4:
            raise WeightsError(f"{path}: tensor {name!r}: {arr.ndim} dimensions; GGUF holds 4")
        prepared.append((name, arr, gtype))
    kv = []
    for key, value in metadata.items():
        if value is None or key == "general.architecture":
            continue
        try:
            vtype, sub = value_type(key, value)
            kv.append((key, _packable(value, vtype, sub), vtype, sub))
        except (WeightsError, TypeError, ValueError, KeyError) as e:
            raise WeightsError(f"{path}: metadata {key!r}: {e}") from None

    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    writer = GGUFWriter(tmp, arch)
    try:
        if metadata.get("general.alignment") is not None:   # data laid out as the key says
            writer.data_alignment = int(metadata["general.alignment"])
        for key, value, vtype, sub in kv:
            writer.add_key_value(key, value, vtype, sub_type=sub)
        for name, arr, gtype in prepared:
            writer.add_tensor(name, arr, raw_dtype=gtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        for f in writer.fout or ():
            f.flush()
            os.fsync(f.fileno())
        writer.close()
        os.replace(tmp, path)
    except BaseException as e:
        writer.close()
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise WeightsError(f"{path}: cannot write: {e.strerror or e}") from None
        if isinstance(e, ValueError):
            raise WeightsError(f"{path}: {e}") from None
        raise
