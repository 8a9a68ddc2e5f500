#include "model/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/gemm_kernels.h"
#include "model/int8_gemm.h"
#include "model/quant.h"
#include "model/worker_pool.h"

extern "C" char* openblas_get_corename(void);

namespace kvpush {

namespace gemm_internal {

float CanonicalTree(float* acc) {
  for (int i = 0; i < 8; ++i) acc[i] += acc[i + 8];
  for (int i = 0; i < 4; ++i) acc[i] += acc[i + 4];
  for (int i = 0; i < 2; ++i) acc[i] += acc[i + 2];
  return acc[0] + acc[1];
}

float CanonicalDot(const float* a, const float* b, int64_t k) {
  float acc[16] = {};
  for (int64_t kk = 0; kk < k; ++kk) acc[kk & 15] = std::fma(a[kk], b[kk], acc[kk & 15]);
  // Lanes past a k tail receive fma(0, 0, acc) = acc + 0 in the vector kernels.
  for (int64_t kk = k; (kk & 15) != 0; ++kk) acc[kk & 15] = std::fma(0.0f, 0.0f, acc[kk & 15]);
  return CanonicalTree(acc);
}

int FixedOrderIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) return 2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
  return 0;
}

void GemmScalar(const float* x, int64_t m_rows, int64_t k, const float* w, int64_t n_rows, float* y,
                int64_t ldy) {
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t n = 0; n < n_rows; ++n) {
      y[m * ldy + n] = CanonicalDot(x + m * k, w + n * k, k);
    }
  }
}

}  // namespace gemm_internal

InvariantGemm::InvariantGemm(GemmBackend backend, QuantMath quant)
    : backend_(backend), quant_(quant), q8_(std::make_unique<gemm_internal::Q8Rows>()) {
  if (backend_ == GemmBackend::kFixedOrder) isa_ = gemm_internal::FixedOrderIsa();
  if (backend_ != GemmBackend::kFixedOrderScalar) {
    if (gemm_internal::CpuHasAvx512Vnni()) {
      q8_isa_ = 2;
    } else if (gemm_internal::CpuHasAvx2FmaF16c()) {
      q8_isa_ = 1;
    }
  }
}

InvariantGemm::~InvariantGemm() = default;
InvariantGemm::InvariantGemm(InvariantGemm&&) noexcept = default;
InvariantGemm& InvariantGemm::operator=(InvariantGemm&&) noexcept = default;

std::string InvariantGemm::name() const {
  std::string q = "; q8_0/q4_k/q6_k dequantized f32";
  if (quant_ == QuantMath::kInt8) {
    q = q8_isa_ == 2   ? "; q8_0/q4_k/q6_k int8 avx512-vnni"
        : q8_isa_ == 1 ? "; q8_0/q4_k/q6_k int8 avx2"
                       : "; q8_0/q4_k/q6_k int8 scalar";
  }
  return GemmName() + q;
}

std::string InvariantGemm::GemmName() const {
  switch (backend_) {
    case GemmBackend::kFixedOrder:
      return isa_ == 2   ? "fixed-order avx512"
             : isa_ == 1 ? "fixed-order avx2"
                         : "fixed-order scalar";
    case GemmBackend::kFixedOrderScalar:
      return "fixed-order scalar";
    case GemmBackend::kOpenBlasTiles:
      return "openblas 8-row tiles";
  }
  return "?";
}

void InvariantGemm::Run(const float* x, int64_t rows, int64_t k, const float* w, int64_t n,
                        float* y) {
  RunStrided(x, rows, k, w, n, y, n);
}

namespace {
/// Row counts below this use the fused stored-type kernel (dequantizing per row of X); from it
/// on, tiles dequantized once for all rows are cheaper.
constexpr int64_t kFusedMaxRows = 4;
}  // namespace

gemm_internal::Q8GemmFn InvariantGemm::Int8Kernel(GgmlType type) const {
  namespace gi = gemm_internal;
  if (quant_ != QuantMath::kInt8) return nullptr;
  switch (type) {
    case GgmlType::kQ8_0:
      return q8_isa_ == 2 ? gi::Q8GemmAvx512Vnni : q8_isa_ == 1 ? gi::Q8GemmAvx2 : gi::Q8GemmScalar;
    case GgmlType::kQ4_K:
      return q8_isa_ == 2   ? gi::Q4KGemmAvx512Vnni
             : q8_isa_ == 1 ? gi::Q4KGemmAvx2
                            : gi::Q4KGemmScalar;
    case GgmlType::kQ6_K:
      return q8_isa_ == 2   ? gi::Q6KGemmAvx512Vnni
             : q8_isa_ == 1 ? gi::Q6KGemmAvx2
                            : gi::Q6KGemmScalar;
    default:
      return nullptr;
  }
}

int64_t InvariantGemm::WeightTileRows(int64_t k) {
  constexpr int64_t kTileFloats = 32 * 1024;  // 128 KiB of f32
  const int64_t rows = k > 0 ? kTileFloats / k : 64;
  return std::clamp<int64_t>(rows / 8 * 8, 8, 64);
}

void InvariantGemm::Run(const float* x, int64_t rows, const WeightMatrix& w, float* y) {
  if (rows <= 0) return;
  const int64_t n = w.rows();
  const gemm_internal::Q8GemmFn int8 = Int8Kernel(w.type());
  if (int8 != nullptr) {
    // The K-quants pair with activations quantized per 256-value super-block (model/int8_gemm.h).
    const bool k_quant = w.type() == GgmlType::kQ4_K || w.type() == GgmlType::kQ6_K;
    q8_->Quantize(x, rows, w.cols(), k_quant ? kQkK : kQ8BlockValues);
  }
  // Parts are contiguous column ranges (multiples of 8 columns); every element is computed in
  // its canonical order whichever part it falls in, so the split changes no bit. OpenBLAS
  // threads itself (and its padding buffers are shared), so kOpenBlasTiles stays one part.
  const int parts = pool_ != nullptr && backend_ != GemmBackend::kOpenBlasTiles
                        ? static_cast<int>(std::min<int64_t>(pool_->threads(), (n + 7) / 8))
                        : 1;
  const int64_t chunk = ((n + parts - 1) / parts + 7) / 8 * 8;
  if (static_cast<int>(tiles_.size()) < parts) tiles_.resize(static_cast<size_t>(parts));
  auto part = [&](int p) {
    const int64_t n0 = std::min(n, p * chunk), n1 = std::min(n, n0 + chunk);
    if (n1 > n0) RunColumns(x, rows, w, int8, n0, n1, y, tiles_[static_cast<size_t>(p)]);
  };
  if (parts == 1) {
    part(0);
  } else {
    pool_->Run(parts, part);
  }
}

void InvariantGemm::RunColumns(const float* x, int64_t rows, const WeightMatrix& w,
                               gemm_internal::Q8GemmFn int8, int64_t n0, int64_t n1, float* y,
                               std::vector<float>& tile) {
  const int64_t k = w.cols(), n = w.rows(), nn = n1 - n0;
  if (const float* f = w.f32(); f != nullptr) {
    RunStrided(x, rows, k, f + n0 * k, nn, y + n0, n);
    return;
  }
  if (int8 != nullptr) {
    int8(*q8_, w.row_data(n0), w.row_bytes(), nn, y + n0, n);
    return;
  }
  // Decode-sized calls on AVX-512 read Q8_0 / F16 / BF16 directly (same bits as the tiles).
  if (backend_ == GemmBackend::kFixedOrder && isa_ == 2 && rows < kFusedMaxRows && k % 32 == 0) {
    const GgmlType t = w.type();
    if (t == GgmlType::kQ8_0 || t == GgmlType::kF16 || t == GgmlType::kBF16) {
      const auto st = t == GgmlType::kQ8_0  ? gemm_internal::StoredType::kQ8_0
                      : t == GgmlType::kF16 ? gemm_internal::StoredType::kF16
                                            : gemm_internal::StoredType::kBF16;
      gemm_internal::GemmStoredAvx512(st, x, rows, k, w.row_data(n0), w.row_bytes(), nn, y + n0, n);
      return;
    }
  }
  const int64_t tile_rows = WeightTileRows(k);
  if (static_cast<int64_t>(tile.size()) < tile_rows * k) {
    tile.resize(static_cast<size_t>(tile_rows * k));
  }
  for (int64_t c = n0; c < n1; c += tile_rows) {
    const int64_t cn = std::min(tile_rows, n1 - c);
    w.DequantizeRows(c, cn, tile.data());
    RunStrided(x, rows, k, tile.data(), cn, y + c, n);
  }
}

void InvariantGemm::RunStrided(const float* x, int64_t rows, int64_t k, const float* w, int64_t n,
                               float* y, int64_t ldy) {
  if (rows <= 0) return;
  if (backend_ == GemmBackend::kFixedOrder || backend_ == GemmBackend::kFixedOrderScalar) {
    gemm_internal::GemmFn fn = gemm_internal::GemmScalar;
    if (backend_ == GemmBackend::kFixedOrder && isa_ == 2) fn = gemm_internal::GemmAvx512;
    if (backend_ == GemmBackend::kFixedOrder && isa_ == 1) fn = gemm_internal::GemmAvx2;
    fn(x, rows, k, w, n, y, ldy);
    return;
  }
  const auto kk = static_cast<blasint>(k), nn = static_cast<blasint>(n);
  const auto ld = static_cast<blasint>(ldy);
  const auto tile = static_cast<blasint>(kTileRows);
  int64_t m = 0;
  for (; m + kTileRows <= rows; m += kTileRows) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tile, nn, kk, 1.0f, x + m * k, kk, w, kk,
                0.0f, y + m * ldy, ld);
  }
  const int64_t rest = rows - m;
  if (rest == 0) return;
  pad_x_.assign(static_cast<size_t>(kTileRows * k), 0.0f);
  pad_y_.resize(static_cast<size_t>(kTileRows * n));
  std::memcpy(pad_x_.data(), x + m * k, static_cast<size_t>(rest * k) * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tile, nn, kk, 1.0f, pad_x_.data(), kk, w, kk,
              0.0f, pad_y_.data(), nn);
  for (int64_t r = 0; r < rest; ++r) {
    std::memcpy(y + (m + r) * ldy, pad_y_.data() + r * n, static_cast<size_t>(n) * sizeof(float));
  }
}

int SetBlasThreads(int threads) {
  openblas_set_num_threads(std::max(1, threads));
  return openblas_get_num_threads();
}

const char* BlasCoreName() {
  return openblas_get_corename();
}

}  // namespace kvpush
