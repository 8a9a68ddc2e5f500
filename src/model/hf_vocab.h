// Reading a Hugging Face tokenizer.json (byte-level BPE) into a GGUF vocabulary, as llama.cpp's
// convert_hf_to_gguf.py does for "gpt2"-type tokenizers: used by `kvpush gen-model --vocab-from`.
//
// Format source: HF tokenizers' serialization (model.type "BPE", model.vocab {piece: id},
// model.merges as "a b" strings or [a, b] pairs, added_tokens [{id, content, special}]) and
// transformers' tokenizer_config.json (bos_token, eos_token, add_bos_token, chat_template).
#pragma once

#include <string>

#include "common/status.h"
#include "model/bpe_tokenizer.h"
#include "model/gguf_writer.h"

namespace kvpush {

/// A vocabulary ready to be written into a GGUF file.
struct HfVocab {
  BpeVocab vocab;             ///< pieces, types, merges, pre, bos/eos, add_bos
  std::string chat_template;  ///< tokenizer_config.json chat_template ("" when absent)
};

/// Vocabulary defaults of a model family (`--arch`): "qwen3" / "qwen2" -> pre "qwen2", no BOS
/// added, BOS = EOS = <|endoftext|> unless tokenizer_config.json names them; "llama3" -> pre
/// "llama-bpe", BOS <|begin_of_text|> added, EOS <|end_of_text|> (or the config's).
/// Errors: kInvalidArgument for another family name.
Status CheckVocabFamily(const std::string& arch);

/// Reads `tokenizer_json_path` and, when present beside it, tokenizer_config.json. Pieces are the
/// vocab plus added tokens by id; ids missing from both become "[PAD<id>]" of type kUnused.
/// Added tokens are kControl when "special" or spelled "<|...|>" (llama.cpp's converter), else
/// kUserDefined; the rest kNormal.
/// Errors: kNotFound / kIoError (file), kInvalidArgument (not JSON, not a BPE model, an id out of
/// range, a token named by the config that is not in the vocabulary), plus CheckVocabFamily's.
Result<HfVocab> ReadHfTokenizerJson(const std::string& tokenizer_json_path,
                                    const std::string& arch);

/// Writes tokenizer.ggml.{model = "gpt2", pre, tokens, token_type, merges, bos_token_id,
/// eos_token_id, add_bos_token} and tokenizer.chat_template (when non-empty).
void WriteBpeVocab(const HfVocab& v, GgufWriter& w);

}  // namespace kvpush
