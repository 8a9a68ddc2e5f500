#include "fake_model.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace kvpush::testing {
namespace {

uint64_t Mix(uint64_t h, uint64_t v) {
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void LogitsFromHash(uint64_t h, std::span<float> out) {
  for (size_t v = 0; v < out.size(); ++v) {
    out[v] = static_cast<float>((Mix(h, v) >> 40) % 1000) / 100.0f;
  }
}

void AtomicMax(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load();
  while (v > cur && !a.compare_exchange_weak(cur, v)) {
  }
}

}  // namespace

ModelConfig FakeModelConfig(int32_t context) {
  ModelConfig c;
  c.architecture = "fake";
  c.name = "fake-model";
  c.dim = 2;
  c.hidden_dim = 2;
  c.num_layers = 2;
  c.num_heads = 1;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.vocab_size = 64;
  c.context_length = context;
  c.bos_id = 1;
  c.eos_id = 2;
  c.fingerprint = 0x1234;
  return c;
}

std::vector<float> FakeLogits(std::span<const int32_t> tokens, int32_t vocab) {
  uint64_t h = 0;
  for (size_t j = 0; j < tokens.size(); ++j) h = Mix(h, Mix(static_cast<uint64_t>(tokens[j]), j));
  std::vector<float> out(static_cast<size_t>(vocab));
  LogitsFromHash(h, out);
  return out;
}

std::vector<int32_t> FakeGreedy(std::vector<int32_t> prompt, int32_t n, int32_t vocab) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    auto l = FakeLogits(prompt, vocab);
    auto t = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    out.push_back(t);
    prompt.push_back(t);
  }
  return out;
}

FakeExecutor::FakeExecutor(std::shared_ptr<FakeProbe> probe, int32_t context)
    : config_(FakeModelConfig(context)), probe_(std::move(probe)) {}

Status FakeExecutor::Execute(std::span<const SequenceChunk> batch, KvCache& kv,
                             std::span<float> logits, LayerObserver* observer) {
  const KvLayout& L = kv.layout();
  const int32_t bs = L.block_size;
  int64_t step_tokens = 0;
  size_t need_logits = 0;
  for (const auto& c : batch) need_logits += static_cast<size_t>(c.logit_rows());
  if (logits.size() < need_logits * static_cast<size_t>(config_.vocab_size)) {
    return InvalidArgument("logits span too small");
  }
  // Write phase: every token's (id, position + 1) into every layer's K and V.
  for (const auto& c : batch) {
    const int32_t n = static_cast<int32_t>(c.tokens.size());
    if (n < 1) return InvalidArgument("empty chunk");
    const int32_t end = c.start_pos + n;
    if (static_cast<int64_t>(c.block_table.size()) * bs < end) {
      return InvalidArgument("block table too short");
    }
    step_tokens += n;
    if (probe_ && c.start_pos > 0 && n > 1) probe_->chunked_prefills++;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t pos = c.start_pos + i;
      const int32_t tok = c.tokens[static_cast<size_t>(i)];
      if (tok < 0 || tok >= config_.vocab_size) return InvalidArgument("bad token id");
      const BlockId b = c.block_table[static_cast<size_t>(pos / bs)];
      if (b < 0 || b >= L.num_blocks) return InvalidArgument("bad block id");
      for (int32_t layer = 0; layer < L.num_layers; ++layer) {
        for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
          float* slot = kv.chunk_f32(layer, kind, b) + (pos % bs) * 2;
          slot[0] = static_cast<float>(tok);
          slot[1] = static_cast<float>(pos + 1);
        }
      }
    }
  }
  if (observer != nullptr) {
    for (int32_t layer = 0; layer < L.num_layers; ++layer) observer->OnLayerDone(layer);
  }
  // Read phase: logits from the cache content of positions [0, p] for each scored position p (the
  // chunk's last, or every one with all_logits).
  size_t row = 0;
  for (const auto& c : batch) {
    const int32_t end = c.start_pos + static_cast<int32_t>(c.tokens.size());
    const auto rows = static_cast<int32_t>(c.logit_rows());
    if (rows == 0) continue;
    uint64_t h = 0;
    for (int32_t pos = 0; pos < end; ++pos) {
      const BlockId b = c.block_table[static_cast<size_t>(pos / bs)];
      const float* k = kv.chunk_f32(L.num_layers - 1, KvKind::kValue, b) + (pos % bs) * 2;
      if (k[1] != static_cast<float>(pos + 1)) {
        return Internal("fake executor: position " + std::to_string(pos) + " of seq " +
                        std::to_string(c.seq_id) + " was never written to its block");
      }
      h = Mix(h, Mix(static_cast<uint64_t>(k[0]), static_cast<uint64_t>(pos)));
      if (pos < end - rows) continue;
      LogitsFromHash(h, logits.subspan(row * static_cast<size_t>(config_.vocab_size),
                                       static_cast<size_t>(config_.vocab_size)));
      ++row;
    }
  }
  if (probe_) {
    probe_->steps++;
    AtomicMax(probe_->max_step_tokens, step_tokens);
    AtomicMax(probe_->max_batch_seqs, static_cast<int64_t>(batch.size()));
    if (int32_t d = probe_->step_delay_us.load(); d > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(d));
    }
  }
  return Status::Ok();
}

FakeTokenizer::FakeTokenizer() {
  pieces_ = {"<unk>", "<s>", "</s>"};
  for (char ch = 'a'; ch <= 'z'; ++ch) pieces_.push_back(std::string(1, ch));  // 3..28
  for (const char* p : {" ",
                        "th",
                        "he",
                        "in",
                        "er",
                        "an",
                        "re",
                        "on",
                        "at",
                        "en",
                        "nd",
                        " the",
                        " cat",
                        " dog",
                        " sat",
                        " on",
                        " mat",
                        " and",
                        " a",
                        ".",
                        "\n",
                        ",",
                        " is",
                        " big",
                        " red",
                        "!",
                        " once",
                        " upon",
                        " time",
                        " lily",
                        " \xC3\xA9t\xC3\xA9",
                        "\xC3"}) {
    pieces_.push_back(p);  // 29..60
  }
  pieces_.push_back("\xA9");      // 61: second byte of U+00E9 (with 60)
  pieces_.push_back("\xE2\x82");  // 62: first two bytes of U+20AC (euro)
  pieces_.push_back("\xAC");      // 63: its last byte
}

Result<std::vector<int32_t>> FakeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < text.size()) {
    int32_t best = -1;
    size_t best_len = 0;
    for (size_t id = 3; id < pieces_.size(); ++id) {
      const std::string& p = pieces_[id];
      if (p.size() > best_len && text.substr(i, p.size()) == p) {
        best = static_cast<int32_t>(id);
        best_len = p.size();
      }
    }
    if (best < 0) {  // lossy byte fallback: any other byte maps onto a letter token
      out.push_back(3 + static_cast<unsigned char>(text[i]) % 26);
      ++i;
      continue;
    }
    out.push_back(best);
    i += best_len;
  }
  return out;
}

std::string FakeTokenizer::TokenBytes(int32_t id) const {
  if (id < 3 || id >= static_cast<int32_t>(pieces_.size())) return {};
  return pieces_[static_cast<size_t>(id)];
}

}  // namespace kvpush::testing
