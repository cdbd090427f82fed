"""GGML's other block encodings, so GGUF files of any common llama.cpp type load:
Q4_1 and Q5_1 (scale and minimum per 32 floats), the K-quants Q2_K, Q3_K and Q5_K,
IQ4_NL and IQ4_XS (a fixed non-linear 4-bit grid), and the ternary TQ1_0 / TQ2_0
(BitNet b1.58). Byte layouts: ``maxdecl/kernels/block_rows.py``; quantizers:
``maxdecl/kernels/codec_legacy.py`` and the ``codec_*`` modules named below.
"""

from __future__ import annotations

from . import register
from ._kernel_codec import KernelCodec

Q4_1 = register(KernelCodec("q4_1", "codec_legacy:_q4_1_quantize",
                            "d, m fp16 | 16 bytes of 4-bit q; x = d * q + m"))
Q5_1 = register(KernelCodec("q5_1", "codec_legacy:_q5_1_quantize",
                            "d, m fp16 | qh u32 (5th bits) | 16 bytes of nibbles; x = d * q + m"))
Q2_K = register(KernelCodec("q2_k", "codec_q2_k:_q2_k_quantize",
                            "16 x (4-bit scale, 4-bit min) | 64 bytes of 2-bit q | d, dmin fp16"))
Q3_K = register(KernelCodec("q3_k", "codec_q3_k:_q3_k_quantize",
                            "32 bytes of high bits | 64 bytes of 2-bit q | 16 6-bit scales | d"))
Q5_K = register(KernelCodec("q5_k", "codec_q5_k:_q5_k_quantize",
                            "d, dmin | 8 x (6-bit scale, 6-bit min) | 32 bytes high bits | "
                            "128 bytes of nibbles"))
IQ4_NL = register(KernelCodec("iq4_nl", "codec_iq4:_iq4_nl_quantize",
                              "d fp16 | 16 bytes of nibbles indexing GGML's 16-value grid"))
IQ4_XS = register(KernelCodec("iq4_xs", "codec_iq4:_iq4_xs_quantize",
                              "d fp16 | 8 6-bit scales | 128 bytes of grid nibbles"))
TQ1_0 = register(KernelCodec("tq1_0", "codec_legacy:_tq1_0_quantize",
                             "52 bytes of base-3 packed ternary digits | d fp16"))
TQ2_0 = register(KernelCodec("tq2_0", "codec_legacy:_tq2_0_quantize",
                             "64 bytes of 2-bit ternary digits | d fp16"))
