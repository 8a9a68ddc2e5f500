#include "model/llama_weights.h"

#include <xxhash.h>

#include "model/gguf.h"

namespace kvpush {

namespace {

size_t Bytes(const std::vector<float>& v) {
  return v.size() * sizeof(float);
}

Status CheckSize(const std::vector<float>& v, int64_t rows, int64_t cols, const std::string& name) {
  if (static_cast<int64_t>(v.size()) != rows * cols) {
    return DataLoss("tensor '" + name + "' has " + std::to_string(v.size()) + " values, expected " +
                    std::to_string(rows) + " x " + std::to_string(cols));
  }
  return Status::Ok();
}

/// Reads tensor `name` and checks its GGUF shape is [cols, rows] (ne0 = cols innermost).
Result<std::vector<float>> ReadMatrix(const GgufFile& file, const std::string& name, int64_t rows,
                                      int64_t cols) {
  const GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr) return NotFound("tensor '" + name + "' is missing");
  const bool vector_ok = rows == 1 && t->ne.size() == 1 && t->ne[0] == cols;
  const bool matrix_ok = t->ne.size() == 2 && t->ne[0] == cols && t->ne[1] == rows;
  if (!vector_ok && !matrix_ok) {
    std::string shape;
    for (int64_t d : t->ne) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    return DataLoss("tensor '" + name + "' has shape [" + shape + "], expected [" +
                    std::to_string(cols) + (rows == 1 ? "" : ", " + std::to_string(rows)) + "]");
  }
  return file.ReadTensorF32(*t);
}

Result<int32_t> PositiveInt(const GgufFile& file, const std::string& key, int64_t fallback) {
  KVP_ASSIGN_OR_RETURN(int64_t v, fallback < 0 ? file.GetInt(key) : file.GetIntOr(key, fallback));
  if (v <= 0 || v > (int64_t{1} << 30)) {
    return DataLoss("GGUF key '" + key + "' = " + std::to_string(v) + " is out of range");
  }
  return static_cast<int32_t>(v);
}

}  // namespace

size_t LlamaWeights::weight_bytes() const {
  size_t b = Bytes(token_embd) + Bytes(output_norm) + Bytes(output);
  for (const auto& l : layers) {
    b += Bytes(l.attn_norm) + Bytes(l.wq) + Bytes(l.wk) + Bytes(l.wv) + Bytes(l.wo) +
         Bytes(l.ffn_norm) + Bytes(l.w_gate) + Bytes(l.w_down) + Bytes(l.w_up);
  }
  return b;
}

void LlamaWeights::ComputeFingerprint() {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const ModelConfig& c = config;
  const int32_t params[] = {c.dim,      c.hidden_dim, c.num_layers, c.num_heads, c.num_kv_heads,
                            c.head_dim, c.vocab_size, c.rope_dim,   c.bos_id,    c.eos_id};
  XXH3_64bits_update(st, params, sizeof(params));
  const float fparams[] = {c.rope_theta, c.rms_eps};
  XXH3_64bits_update(st, fparams, sizeof(fparams));
  auto add = [st](const std::vector<float>& v) { XXH3_64bits_update(st, v.data(), Bytes(v)); };
  add(token_embd);
  add(output_norm);
  add(classifier());
  for (const auto& l : layers) {
    for (const auto* v :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_down, &l.w_up}) {
      add(*v);
    }
  }
  config.fingerprint = XXH3_64bits_digest(st);
  XXH3_freeState(st);
}

Status ValidateLlamaWeights(const LlamaWeights& w) {
  const ModelConfig& c = w.config;
  auto positive = [](int32_t v, const char* name) -> Status {
    if (v <= 0)
      return DataLoss(std::string("model: ") + name + " must be > 0, got " + std::to_string(v));
    return Status::Ok();
  };
  KVP_RETURN_IF_ERROR(positive(c.dim, "dim"));
  KVP_RETURN_IF_ERROR(positive(c.hidden_dim, "hidden_dim"));
  KVP_RETURN_IF_ERROR(positive(c.num_layers, "num_layers"));
  KVP_RETURN_IF_ERROR(positive(c.num_heads, "num_heads"));
  KVP_RETURN_IF_ERROR(positive(c.num_kv_heads, "num_kv_heads"));
  KVP_RETURN_IF_ERROR(positive(c.head_dim, "head_dim"));
  KVP_RETURN_IF_ERROR(positive(c.vocab_size, "vocab_size"));
  KVP_RETURN_IF_ERROR(positive(c.context_length, "context_length"));
  if (static_cast<int64_t>(c.num_heads) * c.head_dim != c.dim) {
    return DataLoss("model: num_heads * head_dim != dim");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return DataLoss("model: num_heads (" + std::to_string(c.num_heads) +
                    ") is not a multiple of num_kv_heads (" + std::to_string(c.num_kv_heads) + ")");
  }
  if (c.rope_dim <= 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return DataLoss("model: rope dimension " + std::to_string(c.rope_dim) +
                    " must be even and <= head_dim " + std::to_string(c.head_dim));
  }
  if (!(c.rope_theta > 0.0f) || !(c.rms_eps >= 0.0f)) {
    return DataLoss("model: rope_theta must be > 0 and rms_eps >= 0");
  }
  if (c.bos_id < 0 || c.bos_id >= c.vocab_size || c.eos_id < 0 || c.eos_id >= c.vocab_size) {
    return DataLoss("model: bos/eos id outside the vocabulary");
  }
  const int64_t d = c.dim, q = c.dim, kv = int64_t{c.num_kv_heads} * c.head_dim, h = c.hidden_dim;
  KVP_RETURN_IF_ERROR(CheckSize(w.token_embd, c.vocab_size, d, "token_embd"));
  KVP_RETURN_IF_ERROR(CheckSize(w.output_norm, 1, d, "output_norm"));
  if (!w.output.empty()) KVP_RETURN_IF_ERROR(CheckSize(w.output, c.vocab_size, d, "output"));
  if (static_cast<int32_t>(w.layers.size()) != c.num_layers) {
    return DataLoss("model: " + std::to_string(w.layers.size()) + " layers loaded, expected " +
                    std::to_string(c.num_layers));
  }
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const auto& l = w.layers[i];
    const std::string p = "layer " + std::to_string(i) + " ";
    KVP_RETURN_IF_ERROR(CheckSize(l.attn_norm, 1, d, p + "attn_norm"));
    KVP_RETURN_IF_ERROR(CheckSize(l.wq, q, d, p + "wq"));
    KVP_RETURN_IF_ERROR(CheckSize(l.wk, kv, d, p + "wk"));
    KVP_RETURN_IF_ERROR(CheckSize(l.wv, kv, d, p + "wv"));
    KVP_RETURN_IF_ERROR(CheckSize(l.wo, d, q, p + "wo"));
    KVP_RETURN_IF_ERROR(CheckSize(l.ffn_norm, 1, d, p + "ffn_norm"));
    KVP_RETURN_IF_ERROR(CheckSize(l.w_gate, h, d, p + "w_gate"));
    KVP_RETURN_IF_ERROR(CheckSize(l.w_down, d, h, p + "w_down"));
    KVP_RETURN_IF_ERROR(CheckSize(l.w_up, h, d, p + "w_up"));
  }
  return Status::Ok();
}

Result<LlamaWeights> LoadLlamaWeightsFromGguf(const GgufFile& file) {
  KVP_ASSIGN_OR_RETURN(std::string arch, file.GetString("general.architecture"));
  if (arch != "llama") {
    return Unimplemented("unsupported architecture '" + arch +
                         "' (kvpush's CPU executor implements 'llama')");
  }
  LlamaWeights w;
  ModelConfig& c = w.config;
  c.architecture = arch;
  if (const GgufValue* name = file.Find("general.name"); name && name->type == GgufType::kString) {
    c.name = name->s;
  }
  KVP_ASSIGN_OR_RETURN(c.dim, PositiveInt(file, "llama.embedding_length", -1));
  KVP_ASSIGN_OR_RETURN(c.hidden_dim, PositiveInt(file, "llama.feed_forward_length", -1));
  KVP_ASSIGN_OR_RETURN(c.num_layers, PositiveInt(file, "llama.block_count", -1));
  KVP_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(file, "llama.attention.head_count", -1));
  KVP_ASSIGN_OR_RETURN(c.num_kv_heads,
                       PositiveInt(file, "llama.attention.head_count_kv", c.num_heads));
  KVP_ASSIGN_OR_RETURN(c.context_length, PositiveInt(file, "llama.context_length", 2048));
  if (c.dim % c.num_heads != 0) return DataLoss("model: dim is not a multiple of head_count");
  c.head_dim = c.dim / c.num_heads;
  KVP_ASSIGN_OR_RETURN(int32_t key_length,
                       PositiveInt(file, "llama.attention.key_length", c.head_dim));
  KVP_ASSIGN_OR_RETURN(int32_t value_length,
                       PositiveInt(file, "llama.attention.value_length", c.head_dim));
  if (key_length != c.head_dim || value_length != c.head_dim) {
    return Unimplemented("attention key/value length different from dim / head_count");
  }
  KVP_ASSIGN_OR_RETURN(c.rope_dim, PositiveInt(file, "llama.rope.dimension_count", c.head_dim));
  KVP_ASSIGN_OR_RETURN(double theta, file.GetFloatOr("llama.rope.freq_base", 10000.0));
  KVP_ASSIGN_OR_RETURN(double eps, file.GetFloatOr("llama.attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = static_cast<float>(theta);
  c.rms_eps = static_cast<float>(eps);
  if (file.Find("llama.rope.scaling.type") != nullptr) {
    KVP_ASSIGN_OR_RETURN(std::string scaling, file.GetString("llama.rope.scaling.type"));
    if (scaling != "none") return Unimplemented("RoPE scaling '" + scaling + "' is not supported");
  }
  if (file.FindTensor("rope_freqs.weight") != nullptr) {
    return Unimplemented("rope_freqs (Llama 3.1 RoPE frequency factors) is not supported");
  }
  const GgufValue* tokens = file.Find("tokenizer.ggml.tokens");
  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) return NotFound("tensor 'token_embd.weight' is missing");
  if (embd->ne.size() != 2 || embd->ne[1] > (int64_t{1} << 30)) {
    return DataLoss("tensor 'token_embd.weight' is not a [dim, vocab] matrix");
  }
  c.vocab_size = static_cast<int32_t>(embd->ne[1]);
  if (tokens != nullptr && tokens->array_size() != static_cast<size_t>(c.vocab_size)) {
    return DataLoss("tokenizer has " + std::to_string(tokens->array_size()) +
                    " tokens but token_embd has " + std::to_string(c.vocab_size) + " rows");
  }
  KVP_ASSIGN_OR_RETURN(int64_t bos, file.GetIntOr("tokenizer.ggml.bos_token_id", 1));
  KVP_ASSIGN_OR_RETURN(int64_t eos, file.GetIntOr("tokenizer.ggml.eos_token_id", 2));
  if (bos < 0 || bos >= c.vocab_size || eos < 0 || eos >= c.vocab_size) {
    return DataLoss("bos/eos token id outside the vocabulary");
  }
  c.bos_id = static_cast<int32_t>(bos);
  c.eos_id = static_cast<int32_t>(eos);
  if (c.num_heads % c.num_kv_heads != 0) {
    return DataLoss("model: head_count is not a multiple of head_count_kv");
  }

  const int64_t d = c.dim, kv = int64_t{c.num_kv_heads} * c.head_dim, h = c.hidden_dim;
  KVP_ASSIGN_OR_RETURN(w.token_embd, ReadMatrix(file, "token_embd.weight", c.vocab_size, d));
  KVP_ASSIGN_OR_RETURN(w.output_norm, ReadMatrix(file, "output_norm.weight", 1, d));
  if (file.FindTensor("output.weight") != nullptr) {
    KVP_ASSIGN_OR_RETURN(w.output, ReadMatrix(file, "output.weight", c.vocab_size, d));
  }
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    auto& l = w.layers[static_cast<size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    KVP_ASSIGN_OR_RETURN(l.attn_norm, ReadMatrix(file, p + "attn_norm.weight", 1, d));
    KVP_ASSIGN_OR_RETURN(l.wq, ReadMatrix(file, p + "attn_q.weight", d, d));
    KVP_ASSIGN_OR_RETURN(l.wk, ReadMatrix(file, p + "attn_k.weight", kv, d));
    KVP_ASSIGN_OR_RETURN(l.wv, ReadMatrix(file, p + "attn_v.weight", kv, d));
    KVP_ASSIGN_OR_RETURN(l.wo, ReadMatrix(file, p + "attn_output.weight", d, d));
    KVP_ASSIGN_OR_RETURN(l.ffn_norm, ReadMatrix(file, p + "ffn_norm.weight", 1, d));
    KVP_ASSIGN_OR_RETURN(l.w_gate, ReadMatrix(file, p + "ffn_gate.weight", h, d));
    KVP_ASSIGN_OR_RETURN(l.w_down, ReadMatrix(file, p + "ffn_down.weight", d, h));
    KVP_ASSIGN_OR_RETURN(l.w_up, ReadMatrix(file, p + "ffn_up.weight", h, d));
  }
  KVP_RETURN_IF_ERROR(ValidateLlamaWeights(w));
  w.ComputeFingerprint();
  return w;
}

}  // namespace kvpush
