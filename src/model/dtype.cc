#include "model/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "model/quant.h"

namespace kvpush {

bool IsSupportedGgmlType(uint32_t type) {
  return type == 0 || type == 1 || type == 8 || type == 12 || type == 14 || type == 30;
}

std::string GgmlTypeName(uint32_t type) {
  switch (type) {
    case 0:
      return "f32";
    case 1:
      return "f16";
    case 8:
      return "q8_0";
    case 12:
      return "q4_k";
    case 14:
      return "q6_k";
    case 30:
      return "bf16";
    default:
      return "ggml type " + std::to_string(type);
  }
}

Result<size_t> GgmlRowBytes(GgmlType type, int64_t n) {
  if (n < 0) return DataLoss("negative element count");
  switch (type) {
    case GgmlType::kF32:
      return static_cast<size_t>(n) * 4;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return static_cast<size_t>(n) * 2;
    case GgmlType::kQ8_0:
      if (n % kQ8BlockValues != 0) {
        return DataLoss("q8_0 row of " + std::to_string(n) + " values is not a multiple of 32");
      }
      return static_cast<size_t>(n / kQ8BlockValues) * kQ8BlockBytes;
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K:
      if (n % kQkK != 0) {
        return DataLoss(GgmlTypeName(static_cast<uint32_t>(type)) + " row of " + std::to_string(n) +
                        " values is not a multiple of 256");
      }
      return static_cast<size_t>(n / kQkK) *
             static_cast<size_t>(type == GgmlType::kQ4_K ? kQ4KBlockBytes : kQ6KBlockBytes);
  }
  return Unimplemented("unsupported tensor type " + GgmlTypeName(static_cast<uint32_t>(type)));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24, exact in binary32.
    float v = std::ldexp(static_cast<float>(mant), -24);
    bits = std::bit_cast<uint32_t>(v) | sign;
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> Inf
  if (absx < 0x38800000u) {
    // Result is subnormal (or zero) in binary16: round |f| * 2^24 to nearest even integer.
    float scaled = std::ldexp(std::bit_cast<float>(absx), 24);
    float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits, nearest even.
  uint32_t v = absx - (112u << 23);
  uint32_t rounded = v + 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded >> 13));
}

float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t FloatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {
void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}
}  // namespace

Status DequantizeToF32(GgmlType type, std::span<const uint8_t> src, std::span<float> out) {
  KVP_ASSIGN_OR_RETURN(size_t need, GgmlRowBytes(type, static_cast<int64_t>(out.size())));
  if (src.size() != need) {
    return DataLoss("tensor data is " + std::to_string(src.size()) + " bytes, expected " +
                    std::to_string(need));
  }
  DequantizeRowUnchecked(type, src.data(), static_cast<int64_t>(out.size()), out.data());
  return Status::Ok();
}

Status QuantizeFromF32(GgmlType type, std::span<const float> src, std::span<uint8_t> dst) {
  KVP_ASSIGN_OR_RETURN(size_t need, GgmlRowBytes(type, static_cast<int64_t>(src.size())));
  if (dst.size() != need) return InvalidArgument("quantize: destination size mismatch");
  uint8_t* p = dst.data();
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(p, src.data(), need);
      break;
    case GgmlType::kF16:
      for (size_t i = 0; i < src.size(); ++i) StoreU16(p + 2 * i, FloatToHalf(src[i]));
      break;
    case GgmlType::kBF16:
      for (size_t i = 0; i < src.size(); ++i) StoreU16(p + 2 * i, FloatToBf16(src[i]));
      break;
    case GgmlType::kQ8_0:
      for (size_t b = 0; b < src.size() / kQ8BlockValues; ++b) {
        const float* x = src.data() + b * kQ8BlockValues;
        float amax = 0.0f;
        for (int64_t j = 0; j < kQ8BlockValues; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float inv = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t* blk = p + b * kQ8BlockBytes;
        StoreU16(blk, FloatToHalf(d));
        for (int64_t j = 0; j < kQ8BlockValues; ++j) {
          blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * inv)));
        }
      }
      break;
    case GgmlType::kQ4_K:
      QuantizeRowQ4K(src.data(), static_cast<int64_t>(src.size()), p);
      break;
    case GgmlType::kQ6_K:
      QuantizeRowQ6K(src.data(), static_cast<int64_t>(src.size()), p);
      break;
  }
  return Status::Ok();
}

}  // namespace kvpush
