#include "model/llama2c.h"

#include <cstring>

namespace kvpush {

namespace {

/// Bounds-checked sequential reader of little-endian values.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  size_t remaining() const { return b_.size() - pos_; }
  template <typename T>
  Result<T> Read(const char* what) {
    if (sizeof(T) > remaining()) return DataLoss(std::string("llama2.c file truncated at ") + what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  Status Floats(std::vector<float>& out, size_t n, const char* what) {
    if (n > remaining() / sizeof(float)) {
      return DataLoss(std::string("llama2.c checkpoint truncated in ") + what);
    }
    out.resize(n);
    std::memcpy(out.data(), b_.data() + pos_, n * sizeof(float));
    pos_ += n * sizeof(float);
    return Status::Ok();
  }
  Status Skip(size_t n, const char* what) {
    if (n > remaining()) return DataLoss(std::string("llama2.c checkpoint truncated in ") + what);
    pos_ += n;
    return Status::Ok();
  }
  std::string_view Bytes(size_t n) {
    std::string_view s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

}  // namespace

Result<LlamaWeights> ParseLlama2cCheckpoint(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  int32_t h[7];
  for (int32_t& field : h) {
    KVP_ASSIGN_OR_RETURN(field, r.Read<int32_t>("header"));
  }
  const bool shared = h[5] > 0;
  const int32_t vocab = shared ? h[5] : -h[5];
  for (int32_t v : {h[0], h[1], h[2], h[3], h[4], vocab, h[6]}) {
    if (v <= 0 || v > (1 << 24))
      return DataLoss("llama2.c header value " + std::to_string(v) + " is out of range");
  }
  LlamaWeights w;
  ModelConfig& c = w.config;
  c.architecture = "llama";
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.num_layers = h[2];
  c.num_heads = h[3];
  c.num_kv_heads = h[4];
  c.vocab_size = vocab;
  c.context_length = h[6];
  if (c.dim % c.num_heads != 0) return DataLoss("llama2.c: dim is not a multiple of n_heads");
  c.head_dim = c.dim / c.num_heads;
  c.rope_dim = c.head_dim;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-5f;
  c.bos_id = 1;
  c.eos_id = 2;
  if (c.num_kv_heads > c.num_heads || c.num_heads % c.num_kv_heads != 0 || c.bos_id >= vocab) {
    return DataLoss("llama2.c: inconsistent head counts or vocabulary");
  }
  // Check the exact size before allocating anything.
  const uint64_t d = static_cast<uint64_t>(c.dim), L = static_cast<uint64_t>(c.num_layers);
  const uint64_t kv = static_cast<uint64_t>(c.num_kv_heads) * static_cast<uint64_t>(c.head_dim);
  const uint64_t hd = static_cast<uint64_t>(c.hidden_dim), V = static_cast<uint64_t>(vocab);
  const uint64_t floats =
      V * d + L * (2 * d + 2 * d * d + 2 * kv * d + 3 * hd * d) + d +
      static_cast<uint64_t>(c.context_length) * static_cast<uint64_t>(c.head_dim) +
      (shared ? 0 : V * d);
  if (floats * 4 != r.remaining()) {
    return DataLoss("llama2.c checkpoint has " + std::to_string(r.remaining()) +
                    " bytes of weights, header implies " + std::to_string(floats * 4));
  }
  const size_t n = static_cast<size_t>(L);
  w.layers.resize(n);
  auto matrix = [&r](WeightMatrix& m, uint64_t rows, uint64_t cols, const char* what) -> Status {
    std::vector<float> v;
    KVP_RETURN_IF_ERROR(r.Floats(v, rows * cols, what));
    m = WeightMatrix::FromF32(std::move(v), static_cast<int64_t>(rows), static_cast<int64_t>(cols));
    return Status::Ok();
  };
  KVP_RETURN_IF_ERROR(matrix(w.token_embd, V, d, "token embedding"));
  for (auto& l : w.layers) KVP_RETURN_IF_ERROR(r.Floats(l.attn_norm, d, "rms_att"));
  for (auto& l : w.layers) KVP_RETURN_IF_ERROR(matrix(l.wq, d, d, "wq"));
  for (auto& l : w.layers) KVP_RETURN_IF_ERROR(matrix(l.wk, kv, d, "wk"));
  for (auto& l : w.layers) KVP_RETURN_IF_ERROR(matrix(l.wv, kv, d, "wv"));
  for (auto& l : w.layers) KVP_RETURN_IF_ERROR(matrix(l.wo, d, d, "wo"));
  for (auto& l : w.layers) KVP_RETURN_IF_ERROR(r.Floats(l.ffn_norm, d, "rms_ffn"));
  for (auto& l : w.layers) KVP_RETURN_IF_ERROR(matrix(l.w_gate, hd, d, "w1"));
  for (auto& l : w.layers) KVP_RETURN_IF_ERROR(matrix(l.w_down, d, hd, "w2"));
  for (auto& l : w.layers) KVP_RETURN_IF_ERROR(matrix(l.w_up, hd, d, "w3"));
  KVP_RETURN_IF_ERROR(r.Floats(w.output_norm, d, "rms_final"));
  KVP_RETURN_IF_ERROR(
      r.Skip(static_cast<size_t>(c.context_length) * c.head_dim * 4, "rope tables"));
  if (!shared) KVP_RETURN_IF_ERROR(matrix(w.output, V, d, "classifier"));
  KVP_RETURN_IF_ERROR(ValidateLlamaWeights(w));
  w.ComputeFingerprint();
  return w;
}

Result<std::unique_ptr<SpmTokenizer>> ParseLlama2cTokenizer(std::span<const uint8_t> bytes,
                                                            int32_t vocab_size) {
  if (vocab_size < 3) return DataLoss("llama2.c tokenizer: vocabulary smaller than 3");
  Reader r(bytes);
  KVP_ASSIGN_OR_RETURN(uint32_t max_len, r.Read<uint32_t>("max_token_length"));
  SpmVocab vocab;
  vocab.space_piece = " ";
  // Each token needs at least 8 bytes: cap the count before reserving.
  if (static_cast<size_t>(vocab_size) > r.remaining() / 8) {
    return DataLoss("llama2.c tokenizer: file too small for " + std::to_string(vocab_size) +
                    " tokens");
  }
  vocab.pieces.reserve(static_cast<size_t>(vocab_size));
  vocab.scores.reserve(static_cast<size_t>(vocab_size));
  for (int32_t i = 0; i < vocab_size; ++i) {
    KVP_ASSIGN_OR_RETURN(float score, r.Read<float>("token score"));
    KVP_ASSIGN_OR_RETURN(uint32_t len, r.Read<uint32_t>("token length"));
    if (len > max_len || len > r.remaining()) {
      return DataLoss("llama2.c tokenizer: token " + std::to_string(i) + " length " +
                      std::to_string(len) + " exceeds max_token_length or the file");
    }
    vocab.pieces.emplace_back(r.Bytes(len));
    vocab.scores.push_back(score);
  }
  return SpmTokenizer::Create(std::move(vocab));
}

}  // namespace kvpush
