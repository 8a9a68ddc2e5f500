// libFuzzer target: the GGUF reader and everything that consumes a parsed file (tensor
// dequantization, the SentencePiece vocabulary, Llama weight loading, one executor step).
// Any input must give a Status, never a crash, a sanitizer report, or a huge allocation.
#include <cstddef>
#include <cstdint>
#include <span>

#include "kv/kv_cache.h"
#include "model/gguf.h"
#include "model/llama_executor.h"
#include "model/llama_weights.h"
#include "model/spm_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpush;
  auto file = GgufFile::Parse(std::span<const uint8_t>(data, size));
  if (!file.ok()) return 0;
  for (const GgufTensorInfo& t : file->tensors()) {
    if (t.num_elements() <= (int64_t{1} << 20)) (void)file->ReadTensorF32(t);
  }
  auto tok = SpmTokenizer::FromGguf(*file);
  if (tok.ok()) {
    auto ids = (*tok)->Encode("Hello w\xC3\xB6rld  \xF0\x9F\x98\x80 <0x41>\xFF");
    if (ids.ok()) (void)DecodeTokens(**tok, *ids);
  }
  auto weights = LoadLlamaWeightsFromGguf(*file);
  if (!weights.ok()) return 0;
  auto ex = LlamaExecutor::Create(std::move(*weights));
  if (!ex.ok()) return 0;
  const ModelConfig& c = (*ex)->config();
  KvLayout layout;
  layout.num_layers = c.num_layers;
  layout.num_kv_heads = c.num_kv_heads;
  layout.head_dim = c.head_dim;
  layout.block_size = 4;
  layout.num_blocks = 1;
  auto kv = KvCache::Create(layout);
  if (!kv.ok()) return 0;
  const int32_t tokens[2] = {0, c.vocab_size - 1};
  const BlockId table[1] = {0};
  SequenceChunk ch;
  ch.tokens = tokens;
  ch.block_table = table;
  ch.want_logits = true;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  (void)(*ex)->Execute({&ch, 1}, **kv, logits, nullptr);
  return 0;
}
