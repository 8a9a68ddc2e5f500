// Native renderers of the chat template families (model/chat_template.h). Each renderer follows
// its Jinja template statement by statement; the Python string methods those templates call
// (strip, lstrip, rstrip, split, trim) are reproduced with Python's semantics, since vLLM and HF
// render with Python's jinja2.
#include "model/chat_template.h"

#include <algorithm>
#include <ctime>
#include <optional>
#include <regex>
#include <utility>

namespace kvpush {

namespace {

bool Contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

/// Decodes the UTF-8 code point at s[i] (invalid bytes as themselves); sets `len`.
uint32_t CodePointAt(std::string_view s, size_t i, size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? b : (b & (0x7F >> n));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  len = static_cast<size_t>(n);
  return cp;
}

/// Python's str.isspace for one code point (Unicode White_Space plus the ASCII separators).
bool IsPySpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

/// Python's str.strip() / lstrip() / rstrip() without arguments (Unicode whitespace).
std::string PyStrip(std::string_view s, bool left = true, bool right = true) {
  size_t b = 0;
  size_t e = s.size();
  while (left && b < e) {
    size_t len = 0;
    if (!IsPySpace(CodePointAt(s, b, len))) break;
    b += len;
  }
  while (right && e > b) {
    size_t start = e - 1;  // back up to the start of the last code point
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len = 0;
    const uint32_t cp = CodePointAt(s, start, len);
    if (start + len != e || !IsPySpace(cp)) break;
    e = start;
  }
  return std::string(s.substr(b, e - b));
}

/// Python's str.strip(chars) / lstrip(chars) / rstrip(chars) for ASCII `chars`.
std::string StripChars(std::string_view s, std::string_view chars, bool left, bool right) {
  size_t b = 0;
  size_t e = s.size();
  while (left && b < e && Contains(chars, s.substr(b, 1))) ++b;
  while (right && e > b && Contains(chars, s.substr(e - 1, 1))) --e;
  return std::string(s.substr(b, e - b));
}

/// Python's s.split(sep)[0] and s.split(sep)[-1].
std::string_view BeforeFirst(std::string_view s, std::string_view sep) {
  const size_t p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}
std::string_view AfterLast(std::string_view s, std::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

Status RoleError(std::string message) {
  return InvalidArgument(std::move(message));
}

constexpr const char* kAlternate =
    "Conversation roles must alternate user/assistant/user/assistant/...";

/// ChatML (Qwen2, Qwen2.5 and generic): the non-tool path of those templates.
std::string RenderChatMl(const ChatTemplate& t, const std::vector<ChatMessage>& m,
                         const ChatRenderOptions& o) {
  std::string out;
  const bool first_system = m.front().role == "system";
  if (!first_system && !t.default_system.empty()) {
    out += "<|im_start|>system\n" + t.default_system + "<|im_end|>\n";
  }
  for (const ChatMessage& msg : m) {
    out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
  }
  if (o.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

/// The index of Qwen3's "last query": the last user message that is not a tool response.
size_t Qwen3LastQuery(const std::vector<ChatMessage>& m) {
  for (size_t k = m.size(); k-- > 0;) {
    const std::string_view c = m[k].content;
    const bool tool_response = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (m[k].role == "user" && !tool_response) return k;
  }
  return m.size() - 1;
}

/// Qwen3 (Qwen3's tokenizer_config.json chat_template, non-tool path).
std::string RenderQwen3(const std::vector<ChatMessage>& m, const ChatRenderOptions& o) {
  std::string out;
  if (m.front().role == "system")
    out += "<|im_start|>system\n" + m.front().content + "<|im_end|>\n";
  const size_t last_query = Qwen3LastQuery(m);
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
      continue;
    }
    if (msg.role != "assistant") continue;
    std::string content = msg.content;
    std::string reasoning;
    if (Contains(msg.content, "</think>")) {
      content = StripChars(AfterLast(msg.content, "</think>"), "\n", true, false);
      reasoning = StripChars(
          AfterLast(StripChars(BeforeFirst(msg.content, "</think>"), "\n", false, true), "<think>"),
          "\n", true, false);
    }
    const bool last = i + 1 == m.size();
    if (i > last_query && (last || !reasoning.empty())) {
      out += "<|im_start|>assistant\n<think>\n" + StripChars(reasoning, "\n", true, true) +
             "\n</think>\n\n" + StripChars(content, "\n", true, false);
    } else {
      out += "<|im_start|>assistant\n" + content;
    }
    out += "<|im_end|>\n";
  }
  if (o.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (o.enable_thinking.has_value() && !*o.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::string TodayUtc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

/// Llama 3 (Meta-Llama-3-*-Instruct) and, with the date header, Llama 3.1+ (non-tool path).
std::string RenderLlama3(const ChatTemplate& t, const std::vector<ChatMessage>& m,
                         const ChatRenderOptions& o) {
  std::string out = t.bos_token;
  size_t begin = 0;
  if (t.llama3_date_header) {
    std::string system;
    if (m.front().role == "system") {
      system = PyStrip(m.front().content);
      begin = 1;
    }
    const std::string date =
        t.date_from_clock ? (o.today.empty() ? TodayUtc() : o.today) : t.date_string;
    out +=
        "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: " +
        date + "\n\n" + system + "<|eot_id|>";
  }
  for (size_t i = begin; i < m.size(); ++i) {
    out += "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n" + PyStrip(m[i].content) +
           "<|eot_id|>";
  }
  if (o.add_generation_prompt || !t.honours_add_generation_prompt) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

/// Llama 2 chat (meta-llama/Llama-2-*-chat-hf).
Result<std::string> RenderLlama2(const ChatTemplate& t, const std::vector<ChatMessage>& m) {
  std::string out;
  size_t begin = 0;
  std::optional<std::string> system;
  if (m.front().role == "system") {
    system = m.front().content;
    begin = 1;
  }
  for (size_t i = begin; i < m.size(); ++i) {
    const size_t k = i - begin;
    if ((m[i].role == "user") != (k % 2 == 0)) return RoleError(kAlternate);
    std::string content;
    if (k == 0 && system) {
      content += "<<SYS>>\n";
      content += *system;
      content += "\n<</SYS>>\n\n";
    }
    content += m[i].content;
    if (m[i].role == "user") {
      out += t.bos_token + "[INST] " + PyStrip(content) + " [/INST]";
    } else if (m[i].role == "assistant") {
      out += " " + PyStrip(content) + " " + t.eos_token;
    }
  }
  return out;
}

/// Mistral Instruct v0.1/v0.2 (mistralai/Mistral-7B-Instruct-v0.*).
Result<std::string> RenderMistral(const ChatTemplate& t, const std::vector<ChatMessage>& m) {
  std::string out = t.bos_token;
  for (size_t i = 0; i < m.size(); ++i) {
    if ((m[i].role == "user") != (i % 2 == 0)) return RoleError(kAlternate);
    if (m[i].role == "user") {
      out += "[INST] " + m[i].content + " [/INST]";
    } else if (m[i].role == "assistant") {
      out += m[i].content + t.eos_token;
    } else {
      return RoleError("Only user and assistant roles are supported!");
    }
  }
  return out;
}

std::string PlainTemplate(const std::vector<ChatMessage>& messages, bool generation_prompt) {
  std::string out;
  for (const auto& m : messages) {
    out += m.role == "system" ? "System: " : m.role == "assistant" ? "Assistant: " : "User: ";
    out += m.content;
    out += "\n";
  }
  if (generation_prompt) out += "Assistant:";
  return out;
}

}  // namespace

const char* ChatTemplateFormatName(ChatTemplateFormat f) {
  switch (f) {
    case ChatTemplateFormat::kPlain:
      return "plain";
    case ChatTemplateFormat::kChatMl:
      return "chatml";
    case ChatTemplateFormat::kQwen3:
      return "qwen3";
    case ChatTemplateFormat::kLlama3:
      return "llama3";
    case ChatTemplateFormat::kLlama2:
      return "llama2";
    case ChatTemplateFormat::kMistral:
      return "mistral";
  }
  return "plain";
}

Result<std::optional<ChatTemplateFormat>> ParseChatTemplateFormat(std::string_view name) {
  if (name == "auto") return std::optional<ChatTemplateFormat>();
  for (auto f :
       {ChatTemplateFormat::kPlain, ChatTemplateFormat::kChatMl, ChatTemplateFormat::kQwen3,
        ChatTemplateFormat::kLlama3, ChatTemplateFormat::kLlama2, ChatTemplateFormat::kMistral}) {
    if (name == ChatTemplateFormatName(f)) return std::optional<ChatTemplateFormat>(f);
  }
  return InvalidArgument(
      "--chat-template-format must be auto, plain, chatml, qwen3, llama3, "
      "llama2 or mistral (got '" +
      std::string(name) + "')");
}

DetectedChatTemplate DetectChatTemplate(std::string_view jinja) {
  DetectedChatTemplate d;
  ChatTemplate& t = d.chat_template;
  d.recognised = true;
  if (Contains(jinja, "<|im_start|>")) {
    const bool qwen3 = Contains(jinja, "enable_thinking") || Contains(jinja, "</think>");
    t.format = qwen3 ? ChatTemplateFormat::kQwen3 : ChatTemplateFormat::kChatMl;
    // A literal default system message: '<|im_start|>system\nTEXT<|im_end|>' with no expression
    // between (the written escape \n, as the template source spells it).
    static const std::regex kDefaultSystem(R"(<\|im_start\|>system\\n([^'"+<]*)<\|im_end\|>)");
    std::cmatch mt;
    const std::string s(jinja);
    if (!qwen3 && std::regex_search(s.c_str(), mt, kDefaultSystem)) t.default_system = mt[1].str();
  } else if (Contains(jinja, "<|start_header_id|>")) {
    t.format = ChatTemplateFormat::kLlama3;
    t.llama3_date_header = Contains(jinja, "Cutting Knowledge Date");
    t.date_from_clock = Contains(jinja, "strftime_now");
    static const std::regex kDate(R"re(date_string\s*=\s*"([^"]*)")re");
    std::cmatch mt;
    const std::string s(jinja);
    if (std::regex_search(s.c_str(), mt, kDate)) t.date_string = mt[1].str();
    t.honours_add_generation_prompt = Contains(jinja, "add_generation_prompt");
  } else if (Contains(jinja, "[INST]")) {
    t.format =
        Contains(jinja, "<<SYS>>") ? ChatTemplateFormat::kLlama2 : ChatTemplateFormat::kMistral;
  } else {
    d.recognised = false;
  }
  return d;
}

Result<std::string> RenderChat(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                               const ChatRenderOptions& options) {
  if (messages.empty()) return InvalidArgument("'messages' is empty");
  switch (t.format) {
    case ChatTemplateFormat::kPlain:
      return PlainTemplate(messages, options.add_generation_prompt);
    case ChatTemplateFormat::kChatMl:
      return RenderChatMl(t, messages, options);
    case ChatTemplateFormat::kQwen3:
      return RenderQwen3(messages, options);
    case ChatTemplateFormat::kLlama3:
      return RenderLlama3(t, messages, options);
    case ChatTemplateFormat::kLlama2:
      return RenderLlama2(t, messages);
    case ChatTemplateFormat::kMistral:
      return RenderMistral(t, messages);
  }
  return PlainTemplate(messages, options.add_generation_prompt);
}

std::string ApplyDefaultChatTemplate(const std::vector<ChatMessage>& messages) {
  return PlainTemplate(messages, /*generation_prompt=*/true);
}

ChatPromptTokenizer::ChatPromptTokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.IsControl(id)) continue;
    std::string text = tokenizer.ControlText(id);
    if (text.empty()) continue;
    first_byte_[static_cast<unsigned char>(text[0])] = true;
    specials_.emplace_back(std::move(text), id);
  }
  // Longest first, so "<|im_start|>" wins over a shorter control text it starts with.
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

ChatPromptBuilder::ChatPromptBuilder(ChatTemplate t, const Tokenizer& tokenizer)
    : template_(std::move(t)), tokenizer_(tokenizer), special_(tokenizer) {
  if (template_.bos_token.empty()) template_.bos_token = tokenizer.ControlText(tokenizer.bos_id());
  if (template_.eos_token.empty()) template_.eos_token = tokenizer.ControlText(tokenizer.eos_id());
}

Result<std::vector<int32_t>> ChatPromptBuilder::Build(const std::vector<ChatMessage>& messages,
                                                      const ChatTemplateOptions& options) const {
  ChatRenderOptions o;
  o.add_generation_prompt = options.add_generation_prompt;
  o.enable_thinking = options.enable_thinking;
  KVP_ASSIGN_OR_RETURN(std::string text, RenderChat(template_, messages, o));
  if (template_.format == ChatTemplateFormat::kPlain) {
    return TokenizePrompt(tokenizer_, text, /*add_special_tokens=*/true);
  }
  return special_.Encode(text);
}

Result<std::vector<int32_t>> ChatPromptTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t start = 0;  // start of the pending text fragment
  auto flush = [&](size_t end) -> Status {
    if (end > start) {
      KVP_ASSIGN_OR_RETURN(auto piece, tokenizer_.Encode(text.substr(start, end - start)));
      ids.insert(ids.end(), piece.begin(), piece.end());
    }
    return Status::Ok();
  };
  for (size_t i = 0; i < text.size();) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    if (first_byte_[static_cast<unsigned char>(text[i])]) {
      for (const auto& sp : specials_) {
        if (text.substr(i).starts_with(sp.first)) {
          hit = &sp;
          break;
        }
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    KVP_RETURN_IF_ERROR(flush(i));
    ids.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  KVP_RETURN_IF_ERROR(flush(text.size()));
  return ids;
}

}  // namespace kvpush
