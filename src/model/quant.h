// Row kernels for the ggml tensor types kvpush keeps in their stored form (F32, F16, BF16, Q8_0,
// Q4_K, Q6_K): unchecked row dequantization for the GEMM's per-tile path and the embedding lookup,
// and round-to-nearest quantizers for the K-quants.
//
// Block formats, as ggml defines them (ggml-common.h; dequantize_row_q4_K / dequantize_row_q6_K
// in ggml-quants.c), little-endian, QK_K = 256 values per super-block:
//   block_q4_K (144 bytes): fp16 d, fp16 dmin, u8 scales[12], u8 qs[128].
//     Sub-block j (32 values, j = 0..7) has a 6-bit scale sc_j and a 6-bit min m_j packed in
//     scales[]: j < 4: sc = scales[j] & 63, m = scales[j + 4] & 63; j >= 4:
//     sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4),
//     m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4).
//     Values 64i .. 64i + 31 are the low nibbles of qs[32i .. 32i + 31] (sub-block 2i), values
//     64i + 32 .. 64i + 63 their high nibbles (sub-block 2i + 1);
//     value = (d * sc) * q - (dmin * m), each product and the difference rounded to f32.
//   block_q6_K (210 bytes): u8 ql[128], u8 qh[64], i8 scales[16], fp16 d.
//     For each half h (128 values; ql + 64h, qh + 32h) and l = 0..31, the 6-bit codes of values
//     l, l + 32, l + 64, l + 96 of the half are (ql[l] & 15), (ql[l + 32] & 15), (ql[l] >> 4),
//     (ql[l + 32] >> 4) in the low 4 bits and bits 0-1, 2-3, 4-5, 6-7 of qh[l] on top;
//     value i of the block = (d * scales[i / 16]) * (code - 32), products rounded to f32.
//   block_q8_0 (34 bytes, 32 values): fp16 d, i8 q[32]; value = d * q.
// Every dequantized value depends only on the bytes of its own block, so the result is the same
// whichever rows, tiles or batch it is computed for (what batch invariance needs).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "model/dtype.h"

namespace kvpush {

/// Values and bytes per K-quant super-block.
inline constexpr int64_t kQkK = 256;
inline constexpr int64_t kQ4KBlockBytes = 144;
inline constexpr int64_t kQ6KBlockBytes = 210;

/// Dequantizes `n` values stored as `type` at `src` (exactly GgmlRowBytes(type, n) bytes, n a
/// multiple of the type's block) into `out[0, n)`. No checks: callers validated the sizes.
void DequantizeRowUnchecked(GgmlType type, const uint8_t* src, int64_t n, float* out);

/// Quantizes `n` values (a multiple of 256) into n / 256 Q4_K blocks at `dst`. Round to nearest:
/// per 32-value sub-block scale = (max - min') / 15 with min' = min(min, 0), stored as 6-bit
/// multiples of d = max scale / 63 and dmin = max |min'| / 63 (both rounded to fp16 first), then
/// each code = clamp(round((x + dmin * m) / (d * sc)), 0, 15). Not ggml's error-minimising search
/// (make_qkx2_quants), so its error is a little larger than llama-quantize's.
void QuantizeRowQ4K(const float* x, int64_t n, uint8_t* dst);

/// Quantizes `n` values (a multiple of 256) into n / 256 Q6_K blocks at `dst`. Round to nearest:
/// per 16-value sub-block scale = max |x| / 31, stored as int8 multiples of d = max scale / 127
/// (d rounded to fp16 first), each code = clamp(round(x / (d * sc)), -32, 31) + 32.
void QuantizeRowQ6K(const float* x, int64_t n, uint8_t* dst);

}  // namespace kvpush
