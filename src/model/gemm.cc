#include "model/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace kvpush {

void InvariantGemm::Run(const float* x, int64_t rows, int64_t k, const float* w, int64_t n,
                        float* y) {
  const auto kk = static_cast<blasint>(k), nn = static_cast<blasint>(n);
  const auto tile = static_cast<blasint>(kTileRows);
  int64_t m = 0;
  for (; m + kTileRows <= rows; m += kTileRows) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tile, nn, kk, 1.0f, x + m * k, kk, w, kk,
                0.0f, y + m * n, nn);
  }
  const int64_t rest = rows - m;
  if (rest == 0) return;
  pad_x_.assign(static_cast<size_t>(kTileRows * k), 0.0f);
  pad_y_.resize(static_cast<size_t>(kTileRows * n));
  std::memcpy(pad_x_.data(), x + m * k, static_cast<size_t>(rest * k) * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tile, nn, kk, 1.0f, pad_x_.data(), kk, w, kk,
              0.0f, pad_y_.data(), nn);
  std::memcpy(y + m * n, pad_y_.data(), static_cast<size_t>(rest * n) * sizeof(float));
}

int SetBlasThreads(int threads) {
  openblas_set_num_threads(std::max(1, threads));
  return openblas_get_num_threads();
}

const char* BlasCoreName() {
  return openblas_get_corename();
}

}  // namespace kvpush
