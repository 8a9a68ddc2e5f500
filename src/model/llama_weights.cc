#include "model/llama_weights.h"

#include <xxhash.h>

#include "model/gguf.h"

namespace kvpush {

namespace {

size_t Bytes(const std::vector<float>& v) {
  return v.size() * sizeof(float);
}

size_t Bytes(const WeightMatrix& m) {
  return m.bytes();
}

Status CheckSize(const WeightMatrix& m, int64_t rows, int64_t cols, const std::string& name) {
  if (m.rows() != rows || m.cols() != cols) {
    return DataLoss("tensor '" + name + "' is " + std::to_string(m.rows()) + " x " +
                    std::to_string(m.cols()) + ", expected " + std::to_string(rows) + " x " +
                    std::to_string(cols));
  }
  return Status::Ok();
}

Status CheckSize(const std::vector<float>& v, int64_t rows, int64_t cols, const std::string& name) {
  if (static_cast<int64_t>(v.size()) != rows * cols) {
    return DataLoss("tensor '" + name + "' has " + std::to_string(v.size()) + " values, expected " +
                    std::to_string(rows) + " x " + std::to_string(cols));
  }
  return Status::Ok();
}

/// Finds tensor `name` and checks its GGUF shape is [cols, rows] (ne0 = cols innermost; a 1-D
/// [cols] when rows == 1).
Result<const GgufTensorInfo*> FindShaped(const GgufFile& file, const std::string& name,
                                         int64_t rows, int64_t cols) {
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
  return t;
}

/// Reads tensor `name` ([cols, rows] in GGUF order) as f32 values.
Result<std::vector<float>> ReadMatrix(const GgufFile& file, const std::string& name, int64_t rows,
                                      int64_t cols) {
  KVP_ASSIGN_OR_RETURN(const GgufTensorInfo* t, FindShaped(file, name, rows, cols));
  return file.ReadTensorF32(*t);
}

/// Tensor `name` ([cols, rows] in GGUF order) as a matrix in its stored type, in place in the
/// file's mapping when it has one.
Result<WeightMatrix> ReadWeight(const GgufFile& file, const std::string& name, int64_t rows,
                                int64_t cols) {
  KVP_ASSIGN_OR_RETURN(const GgufTensorInfo* t, FindShaped(file, name, rows, cols));
  auto m = WeightMatrix::FromStored(t->type, rows, cols, t->data, file.mapping());
  if (!m.ok()) return m.status().WithContext("tensor '" + name + "'");
  return m;
}

Result<int32_t> PositiveInt(const GgufFile& file, const std::string& key, int64_t fallback) {
  KVP_ASSIGN_OR_RETURN(int64_t v, fallback < 0 ? file.GetInt(key) : file.GetIntOr(key, fallback));
  if (v <= 0 || v > (int64_t{1} << 30)) {
    return DataLoss("GGUF key '" + key + "' = " + std::to_string(v) + " is out of range");
  }
  return static_cast<int32_t>(v);
}

/// Hyper-parameters of a "llama" / "qwen2" / "qwen3" GGUF (keys prefixed with the architecture).
Result<ModelConfig> ReadConfig(const GgufFile& file, const std::string& arch) {
  ModelConfig c;
  c.architecture = arch;
  if (const GgufValue* name = file.Find("general.name"); name && name->type == GgufType::kString) {
    c.name = name->s;
  }
  const std::string a = arch + ".";
  KVP_ASSIGN_OR_RETURN(c.dim, PositiveInt(file, a + "embedding_length", -1));
  KVP_ASSIGN_OR_RETURN(c.hidden_dim, PositiveInt(file, a + "feed_forward_length", -1));
  KVP_ASSIGN_OR_RETURN(c.num_layers, PositiveInt(file, a + "block_count", -1));
  KVP_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(file, a + "attention.head_count", -1));
  KVP_ASSIGN_OR_RETURN(c.num_kv_heads,
                       PositiveInt(file, a + "attention.head_count_kv", c.num_heads));
  KVP_ASSIGN_OR_RETURN(c.context_length, PositiveInt(file, a + "context_length", 2048));
  if (c.num_heads % c.num_kv_heads != 0) {
    return DataLoss("model: head_count is not a multiple of head_count_kv");
  }
  // head_dim: attention.key_length when given (Qwen3: 128 with dim 1024 and 16 heads), else
  // dim / heads (llama.cpp n_embd_head_k).
  const int64_t even_split = c.dim % c.num_heads == 0 ? c.dim / c.num_heads : -1;
  if (file.Find(a + "attention.key_length") == nullptr && even_split < 0) {
    return DataLoss(
        "model: dim is not a multiple of head_count and attention.key_length is absent");
  }
  KVP_ASSIGN_OR_RETURN(c.head_dim, PositiveInt(file, a + "attention.key_length", even_split));
  KVP_ASSIGN_OR_RETURN(int32_t value_length,
                       PositiveInt(file, a + "attention.value_length", c.head_dim));
  if (value_length != c.head_dim) {
    return Unimplemented("attention.value_length " + std::to_string(value_length) +
                         " different from key_length " + std::to_string(c.head_dim));
  }
  KVP_ASSIGN_OR_RETURN(c.rope_dim, PositiveInt(file, a + "rope.dimension_count", c.head_dim));
  KVP_ASSIGN_OR_RETURN(double theta, file.GetFloatOr(a + "rope.freq_base", 10000.0));
  KVP_ASSIGN_OR_RETURN(double eps, file.GetFloatOr(a + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = static_cast<float>(theta);
  c.rms_eps = static_cast<float>(eps);
  c.rope_style = arch == "llama" ? RopeStyle::kNormal : RopeStyle::kNeox;
  if (file.Find(a + "rope.scaling.type") != nullptr) {
    KVP_ASSIGN_OR_RETURN(std::string scaling, file.GetString(a + "rope.scaling.type"));
    if (scaling != "none") return Unimplemented("RoPE scaling '" + scaling + "' is not supported");
  }
  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) return NotFound("tensor 'token_embd.weight' is missing");
  if (embd->ne.size() != 2 || embd->ne[1] > (int64_t{1} << 30)) {
    return DataLoss("tensor 'token_embd.weight' is not a [dim, vocab] matrix");
  }
  c.vocab_size = static_cast<int32_t>(embd->ne[1]);
  const GgufValue* tokens = file.Find("tokenizer.ggml.tokens");
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
  return c;
}

/// Reads `name` into `out` when the tensor exists (shape checked as ReadMatrix); else leaves
/// `out` empty.
Status ReadOptional(const GgufFile& file, const std::string& name, int64_t rows, int64_t cols,
                    std::vector<float>& out) {
  if (file.FindTensor(name) == nullptr) return Status::Ok();
  KVP_ASSIGN_OR_RETURN(out, ReadMatrix(file, name, rows, cols));
  return Status::Ok();
}

Status ReadOptional(const GgufFile& file, const std::string& name, int64_t rows, int64_t cols,
                    WeightMatrix& out) {
  if (file.FindTensor(name) == nullptr) return Status::Ok();
  KVP_ASSIGN_OR_RETURN(out, ReadWeight(file, name, rows, cols));
  return Status::Ok();
}

/// Every tensor of `w.config`'s architecture (llama.cpp names; see LoadLlamaWeightsFromGguf).
Status ReadTensors(const GgufFile& file, LlamaWeights& w) {
  const ModelConfig& c = w.config;
  const std::string& arch = c.architecture;
  const int64_t d = c.dim, q = int64_t{c.num_heads} * c.head_dim, hd = c.head_dim;
  const int64_t kv = int64_t{c.num_kv_heads} * c.head_dim, h = c.hidden_dim;
  KVP_ASSIGN_OR_RETURN(w.token_embd, ReadWeight(file, "token_embd.weight", c.vocab_size, d));
  KVP_ASSIGN_OR_RETURN(w.output_norm, ReadMatrix(file, "output_norm.weight", 1, d));
  KVP_RETURN_IF_ERROR(ReadOptional(file, "output.weight", c.vocab_size, d, w.output));
  if (arch == "llama") {
    KVP_RETURN_IF_ERROR(ReadOptional(file, "rope_freqs.weight", 1, c.rope_dim / 2, w.rope_freqs));
  } else if (file.FindTensor("rope_freqs.weight") != nullptr) {
    return Unimplemented("rope_freqs in a '" + arch + "' model is not supported");
  }
  // Each block has at least 9 tensors: a block count the file cannot hold is refused before
  // anything is allocated per block (a forged count would otherwise allocate without bound).
  constexpr size_t kTensorsPerBlock = 9;
  if (c.num_layers <= 0 ||
      static_cast<size_t>(c.num_layers) > file.tensors().size() / kTensorsPerBlock) {
    return DataLoss("model: " + std::to_string(c.num_layers) + " blocks declared, but the file " +
                    "holds " + std::to_string(file.tensors().size()) + " tensors (" +
                    std::to_string(kTensorsPerBlock) + " per block at least)");
  }
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    auto& l = w.layers[static_cast<size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    KVP_ASSIGN_OR_RETURN(l.attn_norm, ReadMatrix(file, p + "attn_norm.weight", 1, d));
    KVP_ASSIGN_OR_RETURN(l.wq, ReadWeight(file, p + "attn_q.weight", q, d));
    KVP_ASSIGN_OR_RETURN(l.wk, ReadWeight(file, p + "attn_k.weight", kv, d));
    KVP_ASSIGN_OR_RETURN(l.wv, ReadWeight(file, p + "attn_v.weight", kv, d));
    KVP_ASSIGN_OR_RETURN(l.wo, ReadWeight(file, p + "attn_output.weight", d, q));
    KVP_ASSIGN_OR_RETURN(l.ffn_norm, ReadMatrix(file, p + "ffn_norm.weight", 1, d));
    KVP_ASSIGN_OR_RETURN(l.w_gate, ReadWeight(file, p + "ffn_gate.weight", h, d));
    KVP_ASSIGN_OR_RETURN(l.w_down, ReadWeight(file, p + "ffn_down.weight", d, h));
    KVP_ASSIGN_OR_RETURN(l.w_up, ReadWeight(file, p + "ffn_up.weight", h, d));
    if (arch == "qwen2") {  // Q/K/V biases (llama.cpp LLM_ARCH_QWEN2: bq, bk, bv required)
      KVP_ASSIGN_OR_RETURN(l.bq, ReadMatrix(file, p + "attn_q.bias", 1, q));
      KVP_ASSIGN_OR_RETURN(l.bk, ReadMatrix(file, p + "attn_k.bias", 1, kv));
      KVP_ASSIGN_OR_RETURN(l.bv, ReadMatrix(file, p + "attn_v.bias", 1, kv));
    } else if (arch == "llama") {  // optional in llama.cpp's llama loader too
      KVP_RETURN_IF_ERROR(ReadOptional(file, p + "attn_q.bias", 1, q, l.bq));
      KVP_RETURN_IF_ERROR(ReadOptional(file, p + "attn_k.bias", 1, kv, l.bk));
      KVP_RETURN_IF_ERROR(ReadOptional(file, p + "attn_v.bias", 1, kv, l.bv));
    }
    if (arch == "qwen3") {  // per-head RMSNorm of q and k before RoPE
      KVP_ASSIGN_OR_RETURN(l.q_norm, ReadMatrix(file, p + "attn_q_norm.weight", 1, hd));
      KVP_ASSIGN_OR_RETURN(l.k_norm, ReadMatrix(file, p + "attn_k_norm.weight", 1, hd));
    }
  }
  return Status::Ok();
}

}  // namespace

size_t LlamaWeights::weight_bytes() const {
  size_t b = Bytes(token_embd) + Bytes(output_norm) + Bytes(output) + Bytes(rope_freqs);
  for (const auto& l : layers) {
    b += Bytes(l.attn_norm) + Bytes(l.wq) + Bytes(l.wk) + Bytes(l.wv) + Bytes(l.wo) +
         Bytes(l.ffn_norm) + Bytes(l.w_gate) + Bytes(l.w_down) + Bytes(l.w_up) + Bytes(l.bq) +
         Bytes(l.bk) + Bytes(l.bv) + Bytes(l.q_norm) + Bytes(l.k_norm);
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
  // Added only when not the Llama 2 default, so Llama 2 fingerprints are unchanged.
  if (c.rope_style != RopeStyle::kNormal) {
    const int32_t style = static_cast<int32_t>(c.rope_style);
    XXH3_64bits_update(st, &style, sizeof(style));
  }
  auto add = [st](const std::vector<float>& v) { XXH3_64bits_update(st, v.data(), Bytes(v)); };
  std::vector<float> row;
  auto add_matrix = [st, &row](const WeightMatrix& m) {
    if (m.type() == GgmlType::kF32) {
      XXH3_64bits_update(st, m.row_data(0), m.bytes());
      return;
    }
    row.resize(static_cast<size_t>(m.cols()));
    for (int64_t r = 0; r < m.rows(); ++r) {
      m.DequantizeRows(r, 1, row.data());
      XXH3_64bits_update(st, row.data(), Bytes(row));
    }
  };
  add_matrix(token_embd);
  add(output_norm);
  add_matrix(classifier());
  add(rope_freqs);
  for (const auto& l : layers) {
    add(l.attn_norm);
    for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo}) add_matrix(*m);
    add(l.ffn_norm);
    for (const auto* m : {&l.w_gate, &l.w_down, &l.w_up}) add_matrix(*m);
    for (const auto* v : {&l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm}) add(*v);
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
  const int64_t d = c.dim, q = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv = int64_t{c.num_kv_heads} * c.head_dim, h = c.hidden_dim, hd = c.head_dim;
  KVP_RETURN_IF_ERROR(CheckSize(w.token_embd, c.vocab_size, d, "token_embd"));
  if (!w.rope_freqs.empty())
    KVP_RETURN_IF_ERROR(CheckSize(w.rope_freqs, 1, c.rope_dim / 2, "rope_freqs"));
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
    const auto& l0 = w.layers[0];
    if (l.bq.empty() != l0.bq.empty() || l.bk.empty() != l0.bk.empty() ||
        l.bv.empty() != l0.bv.empty() || l.q_norm.empty() != l0.q_norm.empty() ||
        l.k_norm.empty() != l0.k_norm.empty()) {
      return DataLoss("model: " + p + "has a different set of biases / q,k norms than layer 0");
    }
    if (!l.bq.empty()) KVP_RETURN_IF_ERROR(CheckSize(l.bq, 1, q, p + "bq"));
    if (!l.bk.empty()) KVP_RETURN_IF_ERROR(CheckSize(l.bk, 1, kv, p + "bk"));
    if (!l.bv.empty()) KVP_RETURN_IF_ERROR(CheckSize(l.bv, 1, kv, p + "bv"));
    if (!l.q_norm.empty()) KVP_RETURN_IF_ERROR(CheckSize(l.q_norm, 1, hd, p + "q_norm"));
    if (!l.k_norm.empty()) KVP_RETURN_IF_ERROR(CheckSize(l.k_norm, 1, hd, p + "k_norm"));
  }
  return Status::Ok();
}

Result<LlamaWeights> LoadLlamaWeightsFromGguf(const GgufFile& file) {
  KVP_ASSIGN_OR_RETURN(std::string arch, file.GetString("general.architecture"));
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3") {
    return Unimplemented("unsupported architecture '" + arch +
                         "' (kvpush's CPU executor implements 'llama', 'qwen2' and 'qwen3')");
  }
  LlamaWeights w;
  KVP_ASSIGN_OR_RETURN(w.config, ReadConfig(file, arch));
  KVP_RETURN_IF_ERROR(ReadTensors(file, w));
  KVP_RETURN_IF_ERROR(ValidateLlamaWeights(w));
  w.ComputeFingerprint();
  return w;
}

}  // namespace kvpush
