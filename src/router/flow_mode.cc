#include "router/flow_mode.h"

#include "http/api_error.h"

namespace kvpush::router {

using nlohmann::json;

const char* TransferModeName(TransferMode mode) {
  switch (mode) {
    case TransferMode::kPush:
      return "push";
    case TransferMode::kPull:
      return "pull";
    case TransferMode::kColocated:
      return "colocated";
  }
  return "unknown";
}

Result<ModeChoice> ParseModeHeader(const std::string& value,
                                   const std::string& default_pull_profile) {
  if (value == "push") return ModeChoice{TransferMode::kPush, ""};
  if (value == "pull") return ModeChoice{TransferMode::kPull, default_pull_profile};
  if (value == "pull-vllm") return ModeChoice{TransferMode::kPull, "vllm"};
  if (value == "pull-fast") return ModeChoice{TransferMode::kPull, "fast"};
  return InvalidArgument("x-kvpush-mode: '" + value +
                         "' is not one of push, pull, pull-vllm, pull-fast");
}

IdMinter::IdMinter() : rng_(std::random_device{}()) {}

std::string IdMinter::Hex32() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  id.reserve(32);
  MutexLock lock(mu_);
  for (int i = 0; i < 2; ++i) {
    uint64_t x = rng_();
    for (int k = 0; k < 16; ++k, x >>= 4) id += kHex[x & 15];
  }
  return id;
}

std::string IdMinter::RequestId(const std::string& prefix) {
  return prefix + Hex32();
}

std::string IdMinter::TransferId() {
  return Hex32();
}

uint64_t IdMinter::Seed() {
  MutexLock lock(mu_);
  return rng_() >> 11;
}

pd::KvTransferParams::Mode PdModeOf(TransferMode mode) {
  return mode == TransferMode::kPush ? pd::KvTransferParams::Mode::kPush
                                     : pd::KvTransferParams::Mode::kPull;
}

std::string ErrorJson(const std::string& message, const std::string& type, const std::string& code,
                      const std::string& param) {
  return http::ApiError{0, message, type, param, code}.ToJson();
}

}  // namespace kvpush::router
