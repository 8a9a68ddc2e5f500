#include "engine/continuation.h"

#include <string>

namespace kvpush {

Status TokensInVocabulary(std::span<const int32_t> ids, int32_t vocab_size,
                          const std::string& what) {
  for (int32_t t : ids) {
    if (t < 0 || t >= vocab_size) {
      return InvalidArgument(what + " " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(vocab_size) + ")");
    }
  }
  return Status::Ok();
}

Status ValidateResume(const EngineConfig& config, const ModelConfig& model,
                      const GenerationRequest& request) {
  const auto& resumed = request.resume_output_tokens;
  if (resumed.empty()) {
    if (request.resume_text_bytes != 0) {
      return InvalidArgument("kvpush_resume: text_bytes without token_ids");
    }
    return Status::Ok();
  }
  if (request.kv_transfer.role != pd::KvTransferParams::Role::kNone &&
      request.kv_transfer.mode != pd::KvTransferParams::Mode::kPush) {
    return InvalidArgument("kvpush_resume: a continuation's P/D legs are push legs (a migration "
                           "pushes the context's KV from the instance that holds it)");
  }
  KVP_RETURN_IF_ERROR(TokensInVocabulary(resumed, model.vocab_size, "kvpush_resume: token id"));
  const int64_t k = static_cast<int64_t>(resumed.size());
  const int64_t n = static_cast<int64_t>(request.prompt_tokens.size());
  if (k >= request.max_tokens || n + k + 1 > config.max_model_len) {
    return InvalidArgument("kvpush_resume: " + std::to_string(k) +
                           " output tokens already reach max_tokens or the context length: the "
                           "request had ended");
  }
  return Status::Ok();
}

Status ReplayResumedOutput(const GenerationRequest& request, int32_t eos_id,
                           OutputTextProcessor& text) {
  // The earlier run's ProcessSampled, token by token: what ended it there would have ended it.
  int64_t emitted = 0;
  int32_t k = 0;
  for (int32_t token : request.resume_output_tokens) {
    ++k;
    const TokenStop stop = CheckTokenStop(request, k, token, eos_id);
    OutputTextProcessor::Delta d;
    if (!stop.ends()) d = text.Append(token, stop.strings_allowed);
    if (stop.ends() || d.stopped) {
      return InvalidArgument("kvpush_resume: output token " + std::to_string(k) + " (id " +
                             std::to_string(token) + ") ended the request");
    }
    emitted += static_cast<int64_t>(d.text.size());
  }
  if (emitted != request.resume_text_bytes) {
    return InvalidArgument("kvpush_resume: text_bytes is " +
                           std::to_string(request.resume_text_bytes) + " but its token_ids' text "
                           "emitted so far is " + std::to_string(emitted) + " bytes");
  }
  return Status::Ok();
}

}  // namespace kvpush
