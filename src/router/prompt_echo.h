// Echo with logprobs on a P/D completion (docs/router.md, "Echo with logprobs"): the prompt's
// logprobs need its logits, which only P computes. P's leg keeps `echo` and `logprobs` and
// answers an internal `prompt_echo` (the prompt text and the prompt's part of the choice
// logprobs); D's leg gets "echo": false; the router puts P's part before each of D's choices,
// whole or in the choice's first streamed event, so the client gets the colocated answer.
// Pure functions over JSON, no I/O.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/status.h"

namespace kvpush::router {

/// P's `prompt_echo`, parsed.
struct PromptEcho {
  std::string text;         ///< what echo puts before each choice's text
  nlohmann::json logprobs;  ///< {tokens, token_logprobs, top_logprobs, text_offset} of the prompt
  int64_t text_offset_end = 0;  ///< where the generated tokens' text_offset continues
};

/// True when `body` of a request to `path` asks for echo with logprobs: /v1/completions, "echo"
/// true and "logprobs" a number (what the instances take as a request for logprobs; any other
/// value they answer themselves).
bool WantsPromptEcho(const std::string& path, const nlohmann::json& body);

/// P's answer's `prompt_echo`. Errors: kInvalidArgument when it is missing or malformed.
Result<PromptEcho> ParsePromptEcho(const nlohmann::json& prefill_answer);

/// Puts `echo` before one completion choice object: text = echo.text + text; each logprobs array
/// = echo's then the choice's, the choice's text offsets moved on by echo.text_offset_end (a
/// choice whose logprobs are null gets echo's).
void PrependPromptEcho(nlohmann::json& choice, const PromptEcho& echo);

/// Non-streamed answer: every choice of `answer` (D's body) gets `echo`.
void PrependPromptEchoToAnswer(nlohmann::json& answer, const PromptEcho& echo);

/// One streamed chunk of D: each choice whose index is not in `*echoed` gets `echo` (its first
/// event) and its index is added. Returns true when the chunk changed.
bool PrependPromptEchoToChunk(nlohmann::json& chunk, const PromptEcho& echo,
                              std::set<int64_t>* echoed);

}  // namespace kvpush::router
