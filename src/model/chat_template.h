// Chat templates: turning /v1/chat/completions messages into the prompt text a model was trained
// on. kvpush runs no Jinja: it recognises the template family in the model's
// `tokenizer.chat_template` (GGUF metadata; HF tokenizer_config.json) and renders it natively, to
// the byte what the Jinja template renders (tests/model/chat_template_test.cc holds goldens
// rendered by @huggingface/jinja from the templates' text; docs/server.md "Chat templates").
//
// Families (`--chat-template-format`):
//   plain    "System: ..\nUser: ..\nAssistant:" — kvpush's default when a model has no template
//            (stories260K) or one that is not recognised; BOS is prepended as for a prompt.
//   chatml   <|im_start|>role\ncontent<|im_end|>\n per message (Qwen2, Qwen2.5, generic ChatML),
//            with the template's default system message when the first message is not a system
//            one (Qwen2.5: "You are Qwen, created by Alibaba Cloud. ...").
//   qwen3    ChatML plus Qwen3's reasoning rules: an assistant turn after the last user query is
//            written as <think>\nreasoning\n</think>\n\ncontent; `enable_thinking: false`
//            (chat_template_kwargs) appends an empty think block to the generation prompt.
//   llama3   Llama 3: bos + <|start_header_id|>role<|end_header_id|>\n\n trim(content) <|eot_id|>;
//            the 3.1+ form adds the system header "Cutting Knowledge Date: December 2023\nToday
//            Date: <date>\n\n".
//   llama2   Llama 2 chat: bos[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer eos..
//   mistral  Mistral Instruct v0.1/v0.2: bos[INST] user [/INST]answer eos..
// Every format but plain writes its own BOS (vLLM tokenizes chat prompts with
// add_special_tokens = false).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/tokenizer.h"

namespace kvpush {

/// One chat message after flattening content parts into text.
struct ChatMessage {
  std::string role;  ///< "system", "user" or "assistant" ("developer" is mapped to "system")
  std::string content;
};

/// How chat messages are rendered (vLLM's chat request fields `add_generation_prompt` and
/// `chat_template_kwargs`; model/chat_template.h).
struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  ///< chat_template_kwargs.enable_thinking (Qwen3)
};


enum class ChatTemplateFormat { kPlain, kChatMl, kQwen3, kLlama3, kLlama2, kMistral };

/// "plain", "chatml", ... as `--chat-template-format` spells them.
const char* ChatTemplateFormatName(ChatTemplateFormat f);

/// Parses a `--chat-template-format` value; "auto" gives nullopt (detect from the model).
/// Errors: kInvalidArgument naming the accepted values.
Result<std::optional<ChatTemplateFormat>> ParseChatTemplateFormat(std::string_view name);

/// A recognised template: its family and the literals the family's templates vary in.
struct ChatTemplate {
  ChatTemplateFormat format = ChatTemplateFormat::kPlain;
  /// chatml: the system message written when the conversation has none ("" = none).
  std::string default_system;
  /// llama3: the 3.1+ system header with the knowledge/today dates.
  bool llama3_date_header = false;
  /// llama3 date header: the template's `date_string` default ("26 Jul 2024"); when the template
  /// calls strftime_now (3.2+), today's date is used instead, as vLLM/HF define it.
  std::string date_string = "26 Jul 2024";
  bool date_from_clock = false;
  /// Whether the template honours add_generation_prompt (the first Llama 3 template always
  /// appends the assistant header).
  bool honours_add_generation_prompt = true;
  std::string bos_token;  ///< the vocabulary's BOS/EOS text ("<s>", "<|begin_of_text|>")
  std::string eos_token;
};

/// The template family of a Jinja template text, by the markers each family's templates carry
/// (<|im_start|>, enable_thinking/</think>, <|start_header_id|>, <<SYS>>, [INST]). `recognised`
/// is false (and the result plain) for an empty or unknown template.
struct DetectedChatTemplate {
  ChatTemplate chat_template;
  bool recognised = false;
};
DetectedChatTemplate DetectChatTemplate(std::string_view jinja);

/// Per-request rendering options (vLLM: add_generation_prompt, chat_template_kwargs).
struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  ///< chat_template_kwargs.enable_thinking
  std::string today;                    ///< "%d %b %Y" date for date_from_clock ("" = now, UTC)
};

/// Renders `messages` (roles system/user/assistant) with `t`. Errors: kInvalidArgument with the
/// template's own message where the Jinja template raises (llama2/mistral: roles must alternate
/// user/assistant; mistral: no system role). Pure; thread-safe.
Result<std::string> RenderChat(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                               const ChatRenderOptions& options);

/// Tokenizes rendered chat text the way HF tokenizers and llama.cpp (parse_special) do: the
/// vocabulary's control-token texts (<s>, </s>, <|im_start|>, ...) become their ids, the text
/// between them is encoded as prompt text. No BOS is added (the template writes it). Built once
/// per model (scans the vocabulary); thread-safe for concurrent const use.
class ChatPromptTokenizer {
 public:
  explicit ChatPromptTokenizer(const Tokenizer& tokenizer);

  /// Errors: those of Tokenizer::Encode.
  Result<std::vector<int32_t>> Encode(std::string_view text) const;

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::pair<std::string, int32_t>> specials_;  ///< longest first
  std::array<bool, 256> first_byte_{};                     ///< bytes a control text starts with
};

/// A model's chat prompts: its template and tokenizer together. Built once per server;
/// thread-safe for concurrent const use.
class ChatPromptBuilder {
 public:
  /// `t.bos_token` / `t.eos_token`, when empty, are taken from the vocabulary's control texts.
  ChatPromptBuilder(ChatTemplate t, const Tokenizer& tokenizer);

  /// The token ids the model receives for `messages`: plain renders kvpush's template and
  /// prepends BOS (as a prompt); every other format renders the model's template, which writes
  /// its own BOS, and tokenizes it with control texts parsed (ChatPromptTokenizer). Errors:
  /// those of RenderChat and Tokenizer::Encode (kInvalidArgument).
  Result<std::vector<int32_t>> Build(const std::vector<ChatMessage>& messages,
                                     const ChatTemplateOptions& options) const;

  const ChatTemplate& chat_template() const { return template_; }

 private:
  ChatTemplate template_;
  const Tokenizer& tokenizer_;
  ChatPromptTokenizer special_;
};

/// kvpush's plain template (format plain):
///   for each message: "<Role>: <content>\n"   (Role = System | User | Assistant)
///   then the generation prompt "Assistant:"
/// The server tokenizes the result with BOS prepended. Pure; thread-safe.
std::string ApplyDefaultChatTemplate(const std::vector<ChatMessage>& messages);

}  // namespace kvpush
