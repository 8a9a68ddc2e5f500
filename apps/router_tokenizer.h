// The router's prompt tokenizer (`kvpush router --tokenizer MODEL`): the model's tokenizer and
// chat template, loaded from the instances' model file, turning a completion or chat body into
// the token ids an instance would give the model (via server::HandleTokenize, the code behind an
// instance's POST /tokenize), for cache-aware routing and the local-prefill threshold.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "model/tokenizer.h"
#include "router/router.h"

namespace kvpush::apps {

/// The tokenizer of the model file at `path` (.gguf: the tokenizer metadata only, no weights; a
/// llama2.c checkpoint: the whole model, with its tokenizer beside it), and its chat template
/// (Jinja, "" when none) into `*chat_template` when not null. Errors: those of GgufFile::Open /
/// TokenizerFromGguf / LoadModel.
Result<std::unique_ptr<Tokenizer>> LoadTokenizerFile(const std::string& path,
                                                     std::string* chat_template);

/// Loads the tokenizer (and the chat template, detected as `kvpush serve` does with
/// --chat-template-format auto) of the model at `path` (.gguf: the tokenizer metadata only, no
/// weights; a llama2.c checkpoint: the whole model, with its tokenizer beside it). The returned
/// function is thread-safe. Errors: those of GgufFile::Open / TokenizerFromGguf / LoadModel.
Result<router::PromptTokenizer> LoadRouterTokenizer(const std::string& path);

}  // namespace kvpush::apps
