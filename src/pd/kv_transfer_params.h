// The P/D request vocabulary (docs/pd_protocol.md §1): what a leg of a P/D request asks of an
// instance's KV connector (`kv_transfer_params`, vLLM's field), and what a pull producer answers.
// Plain value types and pure functions over them; the JSON both ways lives in this file's .cc and
// nowhere else (the router writes legs with ToJson, the server parses them with
// ParseKvTransferParams and embeds the PullAnswer once).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvpush::pd {

/// How a pull consumer (D) reads the prompt's KV: `kVllm` as vLLM's NixlConnector does by
/// default (the READ prepared and posted from the engine thread right before the next forward
/// pass; D recomputes the last prompt token); `kFast` posts the READ from the connector thread as
/// soon as blocks are allocated and takes P's first token instead of recomputing it.
enum class PullProfile : uint8_t { kVllm = 0, kFast = 1 };

/// "vllm" / "fast".
std::string_view PullProfileName(PullProfile profile);
/// The inverse of PullProfileName; nullopt for any other text.
std::optional<PullProfile> ParsePullProfile(std::string_view name);

/// What a P/D request asks of the KV connector (DESIGN.md §3). Parsed by the server from the
/// request's `kv_transfer_params`; the engine only carries it to the connector.
struct KvTransferParams {
  enum class Role : uint8_t {
    kNone = 0,  ///< colocated: no connector involvement
    kProducer,  ///< P leg (`do_remote_decode`): compute the prompt, hand the KV to D
    kConsumer,  ///< D leg (`do_remote_prefill`): receive the KV from P, then decode
  };
  enum class Mode : uint8_t { kPush = 0, kPull = 1 };
  Role role = Role::kNone;
  Mode mode = Mode::kPush;
  std::string transfer_id;  ///< 32 lowercase hex chars, minted by the router (IsValidTransferId)
  std::string remote_engine_id;  ///< the producer's agent name (pull consumer)
  std::string remote_host;       ///< the producer's HTTP host (consumer)
  int32_t remote_port = 0;       ///< the producer's HTTP port, [0, 65535]; 0 = not given
  /// The producer serves HTTPS (`"remote_scheme": "https"`, a kvpush field): the consumer's
  /// handshake with it goes over TLS. false: "http" or not given (vLLM's instances).
  bool remote_https = false;
  // Pull consumer only: what P returned.
  std::vector<int32_t> remote_block_ids;    ///< P's blocks holding the prompt, in order
  int32_t num_prompt_tokens = 0;            ///< 0 = not given
  uint64_t prompt_hash = 0;                 ///< PromptHash of the prompt (with num_prompt_tokens)
  int32_t first_token_id = -1;              ///< -1: not given (D recomputes the last prompt token)
  float first_token_logprob = 0.0f;         ///< finite; with first_token_id
  std::optional<PullProfile> pull_profile;  ///< nullopt: the instance's configured default

  bool operator==(const KvTransferParams&) const = default;
};

/// A refused `kv_transfer_params`: the reason and the field it names
/// ("kv_transfer_params.<field>", or "kv_transfer_params" for the object).
struct ParamError {
  std::string message;
  std::string param;
};

/// Parses the `kv_transfer_params` object of a request. Null, or neither do_remote_decode nor
/// do_remote_prefill true -> Role::kNone. `transfer_id` may be given as `remote_request_id`
/// (vLLM's name). Refused: not an object, both do_remote_decode and do_remote_prefill,
/// transfer_mode other than "push"/"pull" (default "pull", vLLM's NixlConnector semantics),
/// a malformed transfer_id, wrong types, strings over their limit (ids 64, host and engine id
/// 255), a remote_scheme other than "http" or "https", out-of-range port, counts or block ids, more
/// than 1,000,000 block ids, a prompt_hash that is not 1-16 hex digits or a non-zero one without
/// num_prompt_tokens, a non-finite first_token_logprob or a non-zero one without a first_token_id
/// >= 0, an unknown pull_profile, a consumer without remote_host and remote_port, a pull consumer
/// without remote_block_ids. Unknown fields are ignored (vLLM adds more). Pure; never throws.
std::variant<KvTransferParams, ParamError> ParseKvTransferParams(const nlohmann::json& j);

/// The wire form of `p`, which ParseKvTransferParams reads back equal: do_remote_decode,
/// do_remote_prefill, transfer_mode and transfer_id always; every other field only when given
/// (remote_* when non-empty or non-zero, remote_scheme "https" when remote_https,
/// num_prompt_tokens with prompt_hash as 16 hex digits
/// when num_prompt_tokens > 0, first_token_id with first_token_logprob when >= 0,
/// pull_profile when set). Pure.
nlohmann::json ToJson(const KvTransferParams& p);

/// A pull producer's answer (docs/pd_protocol.md §1, after vLLM's NixlConnector): the
/// `kv_transfer_params` that P returns in its response and the router copies into D's leg.
struct PullAnswer {
  KvTransferParams params;  ///< role kConsumer, mode kPull, every pull field given
  int64_t lease_ms = 0;     ///< how long P holds the blocks for D's READ
};

/// ToJson(answer.params) plus vLLM's `remote_request_id` (= transfer_id), `lease_ms` and
/// `tp_size` (1). Pure.
nlohmann::json ToJson(const PullAnswer& answer);

}  // namespace kvpush::pd
