// vLLM's `vllm serve` spellings on `kvpush serve` (docs/configuration.md, "vLLM's flags"): a team
// that launches vLLM keeps its launch lines. Each flag either has kvpush's meaning of vLLM's
// semantics, or is refused with a message naming kvpush's equivalent.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "apps/serve_options.h"
#include "common/status.h"
#include "model/chat_template.h"

namespace kvpush::apps {

/// Adds to `cmd`: the positional MODEL, --config FILE.yaml (vLLM's YAML of flag: value, expanded
/// before parsing by main.cc through apps/yaml_config.h; listed here for --help), --seed, --dtype, --kv-cache-dtype, --api-key (default: $VLLM_API_KEY),
/// --chat-template, --enforce-eager (accepted: kvpush never captures CUDA graphs),
/// --disable-log-requests / --enable-log-requests, and --gpu-memory-utilization (refused, naming
/// --kv-cache-memory-bytes). `o` must outlive `cmd`'s parse.
void AddVllmServeFlags(CLI::App* cmd, ServeOptions* o);

/// After parsing: the model path from --model or the positional MODEL (both given: they must be
/// equal). Errors: kInvalidArgument.
Status ResolveServeModelPath(ServeOptions& o);

/// The chat template of --chat-template (`flag`: a file's path, or the template's text when it
/// contains "{{" or "{%", as vLLM reads it): its family, detected as the model's own template
/// is. Errors: kNotFound (no such file), kInvalidArgument (a template of no family kvpush
/// renders, named in the message with the families it knows).
Result<ChatTemplate> LoadChatTemplateFlag(const std::string& flag);

}  // namespace kvpush::apps
