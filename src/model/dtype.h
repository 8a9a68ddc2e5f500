// Tensor element types of GGUF files (the ggml type ids) and their conversions to/from f32.
//
// Formats (ggml's public type table; GGUF spec,
// github.com/ggerganov/ggml/blob/master/docs/gguf.md):
//   F32  (0): IEEE binary32.      F16 (1): IEEE binary16.      BF16 (30): top 16 bits of binary32.
//   Q8_0 (8): blocks of 32 values: a binary16 scale d, then 32 int8 q; value = d * q. 34 bytes.
//   Q4_K (12), Q6_K (14): super-blocks of 256 values, 144 and 210 bytes (layouts in quant.h).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"

namespace kvpush {

/// ggml tensor type ids that kvpush reads and writes. Other ids are refused by name/number.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ6_K = 14,
  kBF16 = 30
};

/// Values per Q8_0 block, and bytes per block.
inline constexpr int64_t kQ8BlockValues = 32;
inline constexpr int64_t kQ8BlockBytes = 34;

/// True for the ids above.
bool IsSupportedGgmlType(uint32_t type);

/// "f32", "f16", "bf16", "q8_0", "q4_k", "q6_k", or "ggml type <n>" for anything else.
std::string GgmlTypeName(uint32_t type);

/// Bytes of a row of `n` values of `type`. Errors: kUnimplemented (type), kDataLoss (Q8_0 row
/// length not a multiple of 32, Q4_K / Q6_K not a multiple of 256).
Result<size_t> GgmlRowBytes(GgmlType type, int64_t n);

/// binary16 <-> binary32 (round to nearest even; NaN/Inf preserved; subnormals exact).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
/// bfloat16 <-> binary32 (round to nearest even; NaN stays NaN).
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);

/// Converts `out.size()` values stored as `type` in `src` (little-endian) into f32.
/// `src.size()` must equal GgmlRowBytes(type, out.size()). Errors: as GgmlRowBytes, kDataLoss on a
/// size mismatch.
Status DequantizeToF32(GgmlType type, std::span<const uint8_t> src, std::span<float> out);

/// Encodes f32 values as `type` into `dst` (sized GgmlRowBytes(type, src.size())), rounding to
/// nearest. Q8_0 uses the symmetric absmax scale d = max|x| / 127, q = round(x / d) (ggml's
/// quantize_row_q8_0_ref); Q4_K / Q6_K as QuantizeRowQ4K / QuantizeRowQ6K (quant.h).
/// Errors: as GgmlRowBytes.
Status QuantizeFromF32(GgmlType type, std::span<const float> src, std::span<uint8_t> dst);

}  // namespace kvpush
