"""Write experimental copies of the cold-prefix module into .gpu/ (absolute imports)."""
import sys
src = open("engine/fast_path/triton_cold_prefix_attention.py").read()
src = src.replace("from .availability", "from engine.fast_path.availability").replace("from .triton_attention", "from engine.fast_path.triton_attention")
def rep(s, old, new):
    assert old in s, old[:80]
    return s.replace(old, new)
V = {}
# a: row sums of p kept per element through the cold loop and reduced once after it (no cross-warp sum per tile)
a = rep(src, """        l_i = l_i * alpha + tl.sum(p, 1)
        if tl.min(alpha, 0) < 1.0:
            acc = acc * alpha[:, None]
        acc = tl.dot((p * v_scale[None, :]).to(v.dtype), v, acc)
        return m_new, l_i, acc""", """        if tl.min(alpha, 0) < 1.0:
            acc = acc * alpha[:, None]
            l_i = l_i * alpha[:, None]
        l_i += p
        acc = tl.dot((p * v_scale[None, :]).to(v.dtype), v, acc)
        return m_new, l_i, acc""")
a = rep(a, """        if TABLES_AHEAD:
            page_c, slot_c""", """        if KIND == 1 and COLD_DOTS != 0:
            l_2d = tl.zeros([GROUP_PAD, TILE], tl.float32)
        if TABLES_AHEAD:
            page_c, slot_c""")
a = rep(a, "m_i, l_i, acc = _softmax_update_log2(s, _int8_values_to_fp16(v8, PTX), v_scale, m_i, l_i, acc, PTX)",
        "m_i, l_2d, acc = _softmax_update_log2(s, _int8_values_to_fp16(v8, PTX), v_scale, m_i, l_2d, acc, PTX)")
a = rep(a, """            m_i = m_i * _LN2  # the""", """            l_i = tl.sum(l_2d, 1)
            m_i = m_i * _LN2  # the""")
V["v_a"] = a
# b: accumulator always rescaled (no lazy test)
V["v_b"] = rep(src, """        if tl.min(alpha, 0) < 1.0:
            acc = acc * alpha[:, None]""", """        acc = acc * alpha[:, None]""")
# c (timing only, wrong values): no xor in the value conversion, as if codes were stored offset by 128
V["v_c"] = rep(src, '"{ .reg .b32 r, c; xor.b32 r, $2, 0x80808080;', '"{ .reg .b32 r, c; mov.b32 r, $2;')
V["v_ac"] = rep(V["v_a"], '"{ .reg .b32 r, c; xor.b32 r, $2, 0x80808080;', '"{ .reg .b32 r, c; mov.b32 r, $2;')
V["v_a8"] = rep(V["v_a"], "v8 = tl.load(cv_ptr + base[:, None] + d[None, :])",
                 "v8 = tl.load(cv_ptr + base[:, None] + tl.max_contiguous(tl.arange(0, HEAD_DIM), 8)[None, :])")
p = rep(V["v_a"], "v8 = tl.load(cv_ptr + base[:, None] + d[None, :])", "v8 = tl.load(cv_ptr + base[:, None] + dv[None, :])")
p = rep(p, "v = tl.load(v_ptr + offs[:, None] + d[None, :], mask", "v = tl.load(v_ptr + offs[:, None] + dv[None, :], mask")
p = rep(p, "_store_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, b, heads, is_head, d, split,", "_store_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, b, heads, is_head, dv, split,")
p = rep(p, "        d2 = tl.arange(0, HEAD_DIM // 2)\n", "        d2 = tl.arange(0, HEAD_DIM // 2)\n        dv = (d % 8) + ((d // 8) ^ 1) * 8\n")
V["v_ap"] = p
V["v_ab"] = rep(V["v_a"], """        if tl.min(alpha, 0) < 1.0:
            acc = acc * alpha[:, None]
            l_i = l_i * alpha[:, None]""", """        acc = acc * alpha[:, None]
        l_i = l_i * alpha[:, None]""")
noscale = lambda x: rep(rep(x, "k_scale = tl.load(cks_ptr + scale_base).to(tl.float32)", "k_scale = tl.full([TILE], 0.01, tl.float32)"),
                        "v_scale = tl.where(in_range, tl.load(cvs_ptr + scale_base).to(tl.float32), 1.0)", "v_scale = tl.where(in_range, 0.01, 1.0)")
V["v_as"] = noscale(V["v_a"])
V["v_abs"] = noscale(V["v_ab"])
V["v_abk"] = rep(rep(V["v_ab"], "k_scale = tl.load(cks_ptr + scale_base).to(tl.float32)", """NB: tl.constexpr = TILE // BLOCK_SIZE
                pb, sb = _cold_entries(tables_ptr, slots_ptr, b, start + tl.arange(0, NB) * BLOCK_SIZE, cold_hi, stride_tb, BLOCK_SIZE)
                sbase = pb * stride_sp + sb * stride_ss + kvh * stride_sh
                k_scale = tl.reshape(tl.broadcast_to(tl.load(cks_ptr + sbase)[:, None], (NB, BLOCK_SIZE)), (TILE,))"""),
    "v_scale = tl.where(in_range, tl.load(cvs_ptr + scale_base).to(tl.float32), 1.0)",
    "v_scale = tl.where(in_range, tl.reshape(tl.broadcast_to(tl.load(cvs_ptr + sbase)[:, None], (NB, BLOCK_SIZE)), (TILE,)), 1.0)")
t = V["v_ab"]
t = rep(t, """            page_n, slot_n = _cold_entries(tables_ptr, slots_ptr, b, lo + TILE + tl.arange(0, TILE), cold_hi,
                                           stride_tb, BLOCK_SIZE)
""", """            page_n, slot_n = _cold_entries(tables_ptr, slots_ptr, b, lo + TILE + tl.arange(0, TILE), cold_hi,
                                           stride_tb, BLOCK_SIZE)
            tok0 = tl.arange(0, TILE) % BLOCK_SIZE
            sb0 = page_c * stride_sp + slot_c * stride_ss + tok0 * stride_st + kvh * stride_sh
            sb1 = page_n * stride_sp + slot_n * stride_ss + tok0 * stride_st + kvh * stride_sh
            ks_c, vs_c = tl.load(cks_ptr + sb0), tl.load(cvs_ptr + sb0)
            ks_n, vs_n = tl.load(cks_ptr + sb1), tl.load(cvs_ptr + sb1)
""")
t = rep(t, """                page_c, slot_c = tl.maximum(page_n, 0), tl.maximum(slot_n, 0)
""", """                page_c, slot_c = tl.maximum(page_n, 0), tl.maximum(slot_n, 0)
                k_scale_ahead, v_scale_ahead = ks_c, vs_c
                sb_a = page_a * stride_sp + slot_a * stride_ss + tok * stride_st + kvh * stride_sh
                ks_c, vs_c = tl.maximum(ks_n, 0.0), tl.maximum(vs_n, 0.0)
                ks_n, vs_n = tl.load(cks_ptr + sb_a), tl.load(cvs_ptr + sb_a)
""")
t = rep(t, "k_scale = tl.load(cks_ptr + scale_base).to(tl.float32)", "k_scale = k_scale_ahead.to(tl.float32)")
t = rep(t, "v_scale = tl.where(in_range, tl.load(cvs_ptr + scale_base).to(tl.float32), 1.0)", "v_scale = tl.where(in_range, v_scale_ahead.to(tl.float32), 1.0)")
V["v_abt"] = t
t = V["v_ab"]
t = rep(t, """            page_n, slot_n = _cold_entries(tables_ptr, slots_ptr, b, lo + TILE + tl.arange(0, TILE), cold_hi,
                                           stride_tb, BLOCK_SIZE)
""", """            page_n, slot_n = _cold_entries(tables_ptr, slots_ptr, b, lo + TILE + tl.arange(0, TILE), cold_hi,
                                           stride_tb, BLOCK_SIZE)
            NB: tl.constexpr = TILE // BLOCK_SIZE
            tb = tl.arange(0, NB) * BLOCK_SIZE
            pb_c, sb_c = _cold_entries(tables_ptr, slots_ptr, b, lo + tb, cold_hi, stride_tb, BLOCK_SIZE)
            pb_n, sb_n = _cold_entries(tables_ptr, slots_ptr, b, lo + TILE + tb, cold_hi, stride_tb, BLOCK_SIZE)
""")
t = rep(t, """                page_c, slot_c = tl.maximum(page_n, 0), tl.maximum(slot_n, 0)
""", """                page_c, slot_c = tl.maximum(page_n, 0), tl.maximum(slot_n, 0)
                pb, sb = pb_c, sb_c
                pb_a, sb_a = _cold_entries(tables_ptr, slots_ptr, b, start + TABLES_AHEAD * TILE + tb, cold_hi, stride_tb, BLOCK_SIZE)
                pb_c, sb_c = tl.maximum(pb_n, 0), tl.maximum(sb_n, 0)
                pb_n, sb_n = pb_a, sb_a
""")
t = rep(t, "k_scale = tl.load(cks_ptr + scale_base).to(tl.float32)", """sbase = pb * stride_sp + sb * stride_ss + kvh * stride_sh
                k_scale = tl.reshape(tl.broadcast_to(tl.load(cks_ptr + sbase)[:, None], (NB, BLOCK_SIZE)), (TILE,))""")
t = rep(t, "v_scale = tl.where(in_range, tl.load(cvs_ptr + scale_base).to(tl.float32), 1.0)",
    "v_scale = tl.where(in_range, tl.reshape(tl.broadcast_to(tl.load(cvs_ptr + sbase)[:, None], (NB, BLOCK_SIZE)), (TILE,)), 1.0)")
V["v_abk2"] = t
for name, s in V.items():
    open(f".gpu/{name}.py", "w").write(s)
print("wrote", list(V))
