// Continuation (docs/reliability.md, "Continuation"): the checks of a request that resumes
// output an earlier instance generated (GenerationRequest::resume_output_tokens).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "engine/engine_config.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "model/executor.h"

namespace kvpush {

/// kInvalidArgument "<what> <id> is outside the vocabulary [0, vocab_size)" for the first id of
/// `ids` outside it; Ok otherwise. ValidateRequest (the prompt) and ValidateResume. Pure.
Status TokensInVocabulary(std::span<const int32_t> ids, int32_t vocab_size,
                          const std::string& what);

/// The parts of a continuation that need no text: token ids inside the vocabulary, no P/D role
/// but push (a migration: the leg pair that moves the context's KV, docs/reliability.md), and room left for one more token (fewer than max_tokens, prompt + resumed + 1 within
/// max_model_len); resume_text_bytes 0 without tokens. Errors: kInvalidArgument naming
/// kvpush_resume. Pure.
Status ValidateResume(const EngineConfig& config, const ModelConfig& model,
                      const GenerationRequest& request);

/// A continuation's output tokens fed through `text` (primed with the prompt) as the run that
/// generated them did, EOS (`eos_id`), stop ids and stop strings included. Errors
/// (kInvalidArgument, naming kvpush_resume): one of them would have ended that run, or the text
/// they emitted is not request.resume_text_bytes long.
Status ReplayResumedOutput(const GenerationRequest& request, int32_t eos_id,
                           OutputTextProcessor& text);

}  // namespace kvpush
