#include "server/chat_template.h"

namespace kvpush::server {

std::string ApplyDefaultChatTemplate(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const auto& m : messages) {
    if (m.role == "system") {
      out += "System: ";
    } else if (m.role == "assistant") {
      out += "Assistant: ";
    } else {
      out += "User: ";
    }
    out += m.content;
    out += "\n";
  }
  out += "Assistant:";
  return out;
}

}  // namespace kvpush::server
