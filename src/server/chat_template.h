// The default chat template (kvpush does not run Jinja templates; docs/server.md).
#pragma once

#include <string>
#include <vector>

#include "server/openai_request.h"

namespace kvpush::server {

/// Renders chat messages as plain text:
///   for each message: "<Role>: <content>\n"   (Role = System | User | Assistant)
///   then the generation prompt "Assistant:"
/// The server tokenizes the result with BOS prepended. Pure; thread-safe.
std::string ApplyDefaultChatTemplate(const std::vector<ChatMessage>& messages);

}  // namespace kvpush::server
