#include "model/random_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numbers>

namespace kvpush {

namespace {

constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581

// Built-in training text for the demo vocabulary's merges (written for kvpush).
constexpr char kCorpus[] =
    "Once upon a time there was a little robot who lived in a quiet town by the sea. "
    "Every morning the robot walked to the market and helped the people carry their bags. "
    "The people of the town liked the robot because it was kind and it always said hello. "
    "One day a storm came over the sea and the wind was very strong. The little robot saw that "
    "the boats were in danger, so it ran to the harbour and pulled the ropes with all its "
    "strength. When the storm was over, the town had a party for the robot. They sang songs, "
    "they shared bread and apples, and they told the story of the brave little robot to their "
    "children. The robot was happy. It learned that helping others is the best thing you can do. "
    "The server receives a request, the scheduler puts it in a batch, the model computes the "
    "prompt and writes the key and value cache into blocks, and the decoder generates one token "
    "after another until the answer is complete. Prefill and decode can run on different "
    "machines; the cache is pushed from one to the other while the prompt is still computed.";

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Uniform values with standard deviation `std` (half-width std * sqrt(3)).
std::vector<float> RandomValues(uint64_t& state, size_t n, float std) {
  std::vector<float> v(n);
  const double a = static_cast<double>(std) * std::sqrt(3.0);
  for (float& x : v) {
    const double u = static_cast<double>(SplitMix(state) >> 11) * 0x1.0p-53;  // [0, 1)
    x = static_cast<float>((2.0 * u - 1.0) * a);
  }
  return v;
}

}  // namespace

std::vector<float> Llama31RopeFactors(int32_t rope_dim, float theta) {
  constexpr double kFactor = 8.0, kLow = 1.0, kHigh = 4.0, kOriginal = 8192.0;
  const double low_wavelen = kOriginal / kLow, high_wavelen = kOriginal / kHigh;
  std::vector<float> f(static_cast<size_t>(rope_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    const double freq =
        1.0 / std::pow(static_cast<double>(theta), static_cast<double>(2 * i) / rope_dim);
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double factor = 1.0;
    if (wavelen > low_wavelen) {
      factor = kFactor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (kOriginal / wavelen - kLow) / (kHigh - kLow);
      factor = 1.0 / ((1.0 - smooth) / kFactor + smooth);
    }
    f[i] = static_cast<float>(factor);
  }
  return f;
}

Status RandomLlamaOptions::Validate() const {
  auto positive = [](int32_t v, const char* flag) -> Status {
    if (v <= 0) return InvalidArgument(std::string("--") + flag + " must be > 0");
    return Status::Ok();
  };
  KVP_RETURN_IF_ERROR(positive(dim, "dim"));
  KVP_RETURN_IF_ERROR(positive(layers, "layers"));
  KVP_RETURN_IF_ERROR(positive(heads, "heads"));
  KVP_RETURN_IF_ERROR(positive(kv_heads, "kv-heads"));
  KVP_RETURN_IF_ERROR(positive(hidden_dim, "hidden-dim"));
  KVP_RETURN_IF_ERROR(positive(context, "context"));
  if (arch != "llama" && arch != "llama3" && arch != "qwen2" && arch != "qwen3") {
    return InvalidArgument("--arch must be llama, llama3, qwen2 or qwen3, got '" + arch + "'");
  }
  if (head_dim < 0) return InvalidArgument("--head-dim must be >= 0");
  if (head_dim == 0 && dim % heads != 0) {
    return InvalidArgument("--dim must be a multiple of --heads (or give --head-dim)");
  }
  if (heads % kv_heads != 0) return InvalidArgument("--heads must be a multiple of --kv-heads");
  if (effective_head_dim() % 2 != 0) return InvalidArgument("head dimension must be even");
  if (bpe_vocab == nullptr && vocab < 355) {
    return InvalidArgument("--vocab must be >= 355 (specials + bytes + ASCII)");
  }
  if (dtype == GgmlType::kQ8_0 &&
      (dim % 32 != 0 || hidden_dim % 32 != 0 || (heads * effective_head_dim()) % 32 != 0)) {
    return InvalidArgument("q8_0 needs --dim, --hidden-dim and heads * head_dim multiples of 32");
  }
  if ((dtype == GgmlType::kQ4_K || dtype == GgmlType::kQ6_K) &&
      (dim % 256 != 0 || hidden_dim % 256 != 0 || (heads * effective_head_dim()) % 256 != 0)) {
    return InvalidArgument(
        "q4_k and q6_k need --dim, --hidden-dim and heads * head_dim multiples of 256");
  }
  return Status::Ok();
}

Result<SpmVocab> BuildDemoVocab(int32_t vocab_size) {
  if (vocab_size < 355) return InvalidArgument("demo vocabulary needs >= 355 tokens");
  SpmVocab v;
  auto add = [&v](std::string piece, float score, TokenType type) {
    v.pieces.push_back(std::move(piece));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0.0f, TokenType::kUnknown);
  add("<s>", 0.0f, TokenType::kControl);
  add("</s>", 0.0f, TokenType::kControl);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    add(buf, 0.0f, TokenType::kByte);
  }
  add(kSpace, 0.0f, TokenType::kNormal);
  for (int ch = 33; ch < 127; ++ch)
    add(std::string(1, static_cast<char>(ch)), 0.0f, TokenType::kNormal);

  // Words of the corpus as symbol sequences ("▁" + word), with counts.
  std::map<std::vector<std::string>, int> words;
  {
    std::string text = kCorpus;
    size_t i = 0;
    while (i < text.size()) {
      size_t j = text.find(' ', i);
      if (j == std::string::npos) j = text.size();
      std::vector<std::string> syms = {kSpace};
      for (size_t k = i; k < j; ++k) syms.emplace_back(1, text[k]);
      ++words[syms];
      i = j + 1;
    }
  }
  int rank = 0;
  while (static_cast<int32_t>(v.pieces.size()) < vocab_size) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& [syms, count] : words) {
      for (size_t k = 0; k + 1 < syms.size(); ++k) pairs[{syms[k], syms[k + 1]}] += count;
    }
    auto best = pairs.end();
    for (auto it = pairs.begin(); it != pairs.end(); ++it) {
      if (best == pairs.end() || it->second > best->second) best = it;
    }
    if (best == pairs.end() || best->second < 2) break;
    const std::string merged = best->first.first + best->first.second;
    add(merged, -static_cast<float>(++rank), TokenType::kNormal);
    std::map<std::vector<std::string>, int> next;
    for (const auto& [syms, count] : words) {
      std::vector<std::string> out;
      for (size_t k = 0; k < syms.size(); ++k) {
        if (k + 1 < syms.size() && syms[k] == best->first.first &&
            syms[k + 1] == best->first.second) {
          out.push_back(merged);
          ++k;
        } else {
          out.push_back(syms[k]);
        }
      }
      next[out] += count;
    }
    words = std::move(next);
  }
  for (int i = 0; static_cast<int32_t>(v.pieces.size()) < vocab_size; ++i) {
    add("<unused" + std::to_string(i) + ">", -1e9f, TokenType::kUnused);
  }
  return v;
}

namespace {

/// The hyper-parameter keys of `o` (general.*, A.*).
void WriteHyperParameters(const RandomLlamaOptions& o, GgufWriter& w) {
  const std::string a = o.gguf_arch() + ".";
  const int32_t hd = o.effective_head_dim();
  w.SetString("general.architecture", o.gguf_arch());
  w.SetString("general.name", o.name);
  w.SetU32(a + "context_length", static_cast<uint32_t>(o.context));
  w.SetU32(a + "embedding_length", static_cast<uint32_t>(o.dim));
  w.SetU32(a + "block_count", static_cast<uint32_t>(o.layers));
  w.SetU32(a + "feed_forward_length", static_cast<uint32_t>(o.hidden_dim));
  w.SetU32(a + "attention.head_count", static_cast<uint32_t>(o.heads));
  w.SetU32(a + "attention.head_count_kv", static_cast<uint32_t>(o.kv_heads));
  if (o.arch == "qwen3" || o.head_dim > 0) {  // llama.cpp's converter writes these for Qwen3
    w.SetU32(a + "attention.key_length", static_cast<uint32_t>(hd));
    w.SetU32(a + "attention.value_length", static_cast<uint32_t>(hd));
  }
  if (o.arch == "llama" || o.arch == "llama3") {  // Qwen GGUFs leave it to key_length
    w.SetU32(a + "rope.dimension_count", static_cast<uint32_t>(hd));
  }
  w.SetF32(a + "rope.freq_base", o.rope_freq_base);
  w.SetF32(a + "attention.layer_norm_rms_epsilon", o.arch == "llama" ? 1e-5f : 1e-6f);
}

/// The demo SentencePiece vocabulary or `o.bpe_vocab`.
Status WriteVocab(const RandomLlamaOptions& o, GgufWriter& w) {
  if (o.bpe_vocab != nullptr) {
    WriteBpeVocab(*o.bpe_vocab, w);
    return Status::Ok();
  }
  KVP_ASSIGN_OR_RETURN(SpmVocab vocab, BuildDemoVocab(o.vocab));
  w.SetString("tokenizer.ggml.model", "llama");
  w.SetStringArray("tokenizer.ggml.tokens", vocab.pieces);
  w.SetF32Array("tokenizer.ggml.scores", vocab.scores);
  std::vector<int32_t> types;
  for (TokenType t : vocab.types) types.push_back(static_cast<int32_t>(t));
  w.SetI32Array("tokenizer.ggml.token_type", types);
  w.SetU32("tokenizer.ggml.bos_token_id", 1);
  w.SetU32("tokenizer.ggml.eos_token_id", 2);
  w.SetU32("tokenizer.ggml.unknown_token_id", 0);
  return Status::Ok();
}

}  // namespace

Result<GgufWriter> BuildRandomLlamaGguf(const RandomLlamaOptions& options) {
  KVP_RETURN_IF_ERROR(options.Validate());
  RandomLlamaOptions o = options;
  if (o.bpe_vocab != nullptr) o.vocab = static_cast<int32_t>(o.bpe_vocab->vocab.pieces.size());
  GgufWriter w;
  WriteHyperParameters(o, w);
  KVP_RETURN_IF_ERROR(WriteVocab(o, w));

  uint64_t state = o.seed;
  const int64_t d = o.dim, hd = o.effective_head_dim(), q = int64_t{o.heads} * hd;
  const int64_t kv = int64_t{o.kv_heads} * hd, h = o.hidden_dim;
  const bool llama2 = o.arch == "llama";
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, GgmlType type) {
    auto values = RandomValues(state, static_cast<size_t>(rows * cols),
                               1.0f / std::sqrt(static_cast<float>(cols)));
    return w.AddTensor(name, {cols, rows}, type, values);
  };
  // Norm weights: ones (llama, as before) or 1 +- 0.3; biases: std 0.3. Always f32 (llama.cpp).
  auto vec = [&](const std::string& name, int64_t n, bool norm) {
    std::vector<float> v(static_cast<size_t>(n), 1.0f);
    if (!norm || !llama2) {
      const float std = norm ? 0.3f / std::sqrt(3.0f) : 0.3f;  // norms: uniform 1 +- 0.3
      v = RandomValues(state, static_cast<size_t>(n), std);
      if (norm) {
        for (float& x : v) x += 1.0f;
      }
    }
    return w.AddTensor(name, {n}, GgmlType::kF32, v);
  };
  // Embedding rows with std 1 (RMSNorm rescales anyway).
  {
    auto values = RandomValues(state, static_cast<size_t>(o.vocab * d), 1.0f);
    KVP_RETURN_IF_ERROR(w.AddTensor("token_embd.weight", {d, o.vocab}, o.dtype, values));
  }
  KVP_RETURN_IF_ERROR(vec("output_norm.weight", d, true));
  if (!o.tied_output) KVP_RETURN_IF_ERROR(matrix("output.weight", o.vocab, d, o.dtype));
  if (o.arch == "llama3") {
    KVP_RETURN_IF_ERROR(
        w.AddTensor("rope_freqs.weight", {hd / 2}, GgmlType::kF32,
                    Llama31RopeFactors(static_cast<int32_t>(hd), o.rope_freq_base)));
  }
  for (int32_t l = 0; l < o.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    KVP_RETURN_IF_ERROR(vec(p + "attn_norm.weight", d, true));
    KVP_RETURN_IF_ERROR(matrix(p + "attn_q.weight", q, d, o.dtype));
    KVP_RETURN_IF_ERROR(matrix(p + "attn_k.weight", kv, d, o.dtype));
    KVP_RETURN_IF_ERROR(matrix(p + "attn_v.weight", kv, d, o.dtype));
    if (o.arch == "qwen2") {
      KVP_RETURN_IF_ERROR(vec(p + "attn_q.bias", q, false));
      KVP_RETURN_IF_ERROR(vec(p + "attn_k.bias", kv, false));
      KVP_RETURN_IF_ERROR(vec(p + "attn_v.bias", kv, false));
    }
    if (o.arch == "qwen3") {
      KVP_RETURN_IF_ERROR(vec(p + "attn_q_norm.weight", hd, true));
      KVP_RETURN_IF_ERROR(vec(p + "attn_k_norm.weight", hd, true));
    }
    KVP_RETURN_IF_ERROR(matrix(p + "attn_output.weight", d, q, o.dtype));
    KVP_RETURN_IF_ERROR(vec(p + "ffn_norm.weight", d, true));
    KVP_RETURN_IF_ERROR(matrix(p + "ffn_gate.weight", h, d, o.dtype));
    KVP_RETURN_IF_ERROR(matrix(p + "ffn_down.weight", d, h, o.dtype));
    KVP_RETURN_IF_ERROR(matrix(p + "ffn_up.weight", h, d, o.dtype));
  }
  return w;
}

}  // namespace kvpush
