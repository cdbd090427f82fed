"""Block sizes of the storage encodings, defined once: ``name -> (block_elements, block_bytes)``.

GGML's block formats (``GGML_QUANT_SIZES`` in gguf-py): a block of ``block_elements``
floats along a row is stored in ``block_bytes`` bytes. ``f32``/``f16`` mean "stored
unquantized". Encodings registered at run time with ``md.codecs.register`` are found
through the codec registry once it is loaded. Plain Python: the spec layer reads it.
"""

from __future__ import annotations

import sys

GGML_BLOCKS: dict[str, tuple[int, int]] = {
    "bf16": (1, 2),        # one bfloat16
    "q4_0": (32, 18),      # d f16 + 16 bytes of nibbles
    "q5_0": (32, 22),      # d f16 + qh u32 + 16 bytes of nibbles
    "q8_0": (32, 34),      # d f16 + 32 int8
    "q4_k": (256, 144),    # d, dmin f16 + 12 bytes of 6-bit scales/mins + 128 bytes of nibbles
    "q6_k": (256, 210),    # 128 bytes low nibbles + 64 bytes high bits + 16 int8 scales + d f16
    "q4_1": (32, 20),      # d, m f16 + 16 bytes of nibbles
    "q5_1": (32, 24),      # d, m f16 + qh u32 + 16 bytes of nibbles
    "q2_k": (256, 84),     # 16 bytes of 4-bit scales/mins + 64 bytes of 2-bit quants + d, dmin
    "q3_k": (256, 110),    # 32 bytes high bits + 64 bytes of 2-bit quants + 12 bytes scales + d
    "q5_k": (256, 176),    # d, dmin + 12 bytes scales/mins + 32 bytes high bits + 128 nibbles
    "iq4_nl": (32, 18),    # d f16 + 16 bytes of nibbles indexing a fixed non-linear grid
    "iq4_xs": (256, 136),  # d f16 + 2 + 4 bytes of 6-bit scales + 128 bytes of grid nibbles
    "tq1_0": (256, 54),    # 52 bytes of base-3 packed ternary digits + d f16
    "tq2_0": (256, 66),    # 64 bytes of 2-bit ternary values + d f16
}
FLOAT_STORAGE: dict[str, tuple[int, int]] = {"f32": (1, 4), "f16": (1, 2)}


def known() -> dict[str, tuple[int, int]]:
    """Every encoding known now: the built-ins plus any registered with ``md.codecs``
    (read without importing NumPy when the codec registry is not loaded)."""
    out = {**FLOAT_STORAGE, **GGML_BLOCKS}
    codecs = sys.modules.get("maxdecl.codecs")
    if codecs is not None:
        for n in codecs.names():
            enc = codecs.get(n)
            out.setdefault(n, (int(enc.block_elements), int(enc.block_bytes)))
    return out


def block_size(name: str) -> tuple[int, int]:
    """``(block_elements, block_bytes)`` of encoding ``name``; ValueError if unknown."""
    key = str(name).lower()
    found = GGML_BLOCKS.get(key) or FLOAT_STORAGE.get(key) or known().get(key)
    if found is None:
        raise ValueError(f"unknown encoding {name!r} (known: {', '.join(sorted(known()))})")
    return found
