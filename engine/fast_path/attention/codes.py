"""Integer KV codes into the tensor-core dots without conversion instructions (Triton
helpers of the cold-prefix kernel's fast loop).

Converting int8 codes to bf16 costs about 2.5 instructions a code, and the int8
kernel was bound by instruction issue, not memory (1,599 instructions per 64-token
tile against the hot loop's 672, read in SASS compiled offline). So with bf16/fp16
queries int8 keys are not converted at all (the queries are quantized to int8 per
row and the scores come from an int8 dot), and values (int8, and int4 with one scale
per head, keys too) become exact fp16 by bit arithmetic. On the H200 at 32k x 8 one
layer's int8 attention took 239 us with codes converted to bf16, 190 us with fp16 by
bit arithmetic and 169 us with int8 keys (same launch; 2026-11-29, the measurements
behind BENCHMARKS.md's cold-KV figures).
"""
from __future__ import annotations

from ..availability import has_triton

if has_triton():
    import triton
    import triton.language as tl

    @triton.jit
    def int8_to_fp16(x):
        """Exact fp16 of int8 codes: code + 128 as the low byte under fp16's exponent byte
        0x64 is the fp16 1024 + 128 + code."""
        return (x.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0

    @triton.jit
    def int8_values_to_fp16(x, PTX: tl.constexpr):
        """int8_to_fp16 for the P.V operand, done where the codes were loaded. Triton moves
        a pure conversion of a dot operand behind its change to the dot's layout, and for
        int8 values that change is a transpose: single-byte shared loads, one per code (int8
        has no transposing ldmatrix; ~290 of the int8 loop's 914 instructions a tile, offline
        SASS). Not marked pure, this conversion stays put: 16-byte shared loads, the codes
        converted four at a time, and fp16 goes through shared memory to ldmatrix.trans."""
        if PTX:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 r, c; xor.b32 r, $2, 0x80808080; mov.b32 c, 0x64806480;"
                " prmt.b32 $0, r, 0x64646464, 0x5140; prmt.b32 $1, r, 0x64646464, 0x7362;"
                " sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; }",
                "=r,=r,r", [x], dtype=tl.float16, is_pure=False, pack=4)
        return int8_to_fp16(x)

    @triton.jit
    def int4_to_fp16(x):
        """Exact fp16 of packed int4 codes (two a byte, even dims in the low nibble, stored
        as code + 8): the nibble under fp16's exponent byte 0x64 is 1024 + 8 + code."""
        x = x.to(tl.int32)
        return (tl.interleave(x & 0xF, x >> 4) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1032.0

    @triton.jit
    def int4_values_to_fp16(x, PTX: tl.constexpr):
        """int4_to_fp16 for the P.V operand, converted where loaded (as int8_values_to_fp16):
        each byte's low nibbles and high nibbles as two fp16 tensors, interleaved."""
        if PTX:
            low, high = tl.inline_asm_elementwise(
                "{ .reg .b32 l, h, c; and.b32 l, $4, 0x0F0F0F0F; shr.b32 h, $4, 4; and.b32 h, h, 0x0F0F0F0F;"
                " mov.b32 c, 0x64086408;"
                " prmt.b32 $0, l, 0x64646464, 0x5140; prmt.b32 $1, l, 0x64646464, 0x7362;"
                " prmt.b32 $2, h, 0x64646464, 0x5140; prmt.b32 $3, h, 0x64646464, 0x7362;"
                " sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; sub.f16x2 $2, $2, c; sub.f16x2 $3, $3, c; }",
                "=r,=r,=r,=r,r", [x], dtype=(tl.float16, tl.float16), is_pure=False, pack=4)
            return tl.interleave(low, high)
        return int4_to_fp16(x)

    @triton.jit
    def quantize_rows_int8(q):
        """q [rows, dim] as int8 codes with a scale per row (symmetric, round half away)."""
        qf = q.to(tl.float32)
        q_scale = tl.max(tl.abs(qf), 1) / 127.0
        q_scale = tl.where(q_scale > 0, q_scale, 1.0)
        x = qf / q_scale[:, None]
        return tl.where(x >= 0, x + 0.5, x - 0.5).to(tl.int8), q_scale
