// llama2.c formats: the `.bin` checkpoint and the `tokenizer.bin` vocabulary (e.g. tok512.bin).
//
// Checkpoint (karpathy/llama2.c run.c, "legacy" version 0 export): seven little-endian int32
// (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len), then float32 tensors:
// token embedding [vocab, dim]; for all layers rms_att [L, dim], wq [L, dim, dim],
// wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim],
// w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim]; rms_final [dim]; two obsolete
// RoPE tables [seq_len, head_size / 2] each (skipped); and, only when vocab_size < 0, a separate
// classifier [vocab, dim] (a positive vocab_size means the classifier is the embedding).
// Conventions: RoPE on adjacent pairs, theta 10000, RMSNorm eps 1e-5, BOS 1, EOS 2.
//
// Tokenizer: uint32 max_token_length, then per token: float32 score, uint32 length, bytes.
// Pieces use a real space (no U+2581); BOS/EOS pieces are "\n<s>\n" / "\n</s>\n".
#pragma once

#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "model/llama_weights.h"
#include "model/spm_tokenizer.h"

namespace kvpush {

/// Parses a llama2.c checkpoint from memory. Errors: kDataLoss (bad header, wrong size).
Result<LlamaWeights> ParseLlama2cCheckpoint(std::span<const uint8_t> bytes);

/// Parses a llama2.c tokenizer file with `vocab_size` tokens (the checkpoint's; the file does not
/// store it). Token 0 is <unk>, 1 BOS, 2 EOS (control); "<0xNN>" pieces are byte tokens; the
/// space piece is ' '. Errors: kDataLoss (truncated, implausible lengths).
Result<std::unique_ptr<SpmTokenizer>> ParseLlama2cTokenizer(std::span<const uint8_t> bytes,
                                                            int32_t vocab_size);

}  // namespace kvpush
