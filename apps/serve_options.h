// ServeOptions: everything `kvpush serve` reads from its command line (docs/configuration.md),
// and the vLLM spellings it accepts besides kvpush's own (apps/serve_vllm_flags.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/serve_discovery.h"
#include "engine/engine_config.h"
#include "http/connection_options.h"
#include "model/sim_executor.h"

namespace kvpush::apps {

struct ServeOptions {
  std::string model;             ///< --model
  std::string model_positional;  ///< `kvpush serve MODEL` (vLLM's positional model)
  std::string tokenizer;
  std::string role = "both";
  bool role_given = false;  ///< --role was on the command line (else kv_role decides)
  std::string host = "127.0.0.1";
  std::string advertise_host;
  std::string kv_transfer_config;
  std::string kv_auth_key_file;
  std::string xfer_fault_plan;
  int port = 8000;
  /// --served-model-name NAME...: the first is the name in responses; requests may name any.
  std::vector<std::string> served_model_names;
  std::string log_level = "info";
  std::string log_format = "text";  ///< --log-format text|json
  int blas_threads = 1;
  int threads = 1;  ///< --threads: the executor's GEMM and attention threads
  std::string threads_bind = "auto";  ///< --threads-bind (ResolveThreadsBind, model/worker_pool.h)
  EngineConfig engine;
  bool enable_prefix_caching = true;  ///< --[no-]enable-prefix-caching
  bool enable_prompt_tokens_details = false;
  std::string chat_template_format = "auto";
  std::string chat_template;  ///< --chat-template FILE|TEXT (a Jinja template)
  std::string executor = "llama";
  std::string sim_model = "qwen3-32b";
  std::string sim_hw = "h200";
  SimOptions sim;
  double drain_timeout_s = 30.0;
  ServeDiscoveryFlags discovery;
  std::optional<uint64_t> seed;  ///< --seed: unseeded requests draw their seeds from it
  std::string api_key;           ///< --api-key (or VLLM_API_KEY)
  bool log_requests = true;      ///< --disable-log-requests turns the access log off
  std::string ssl_certfile;      ///< --ssl-certfile (vLLM)
  std::string ssl_keyfile;       ///< --ssl-keyfile (vLLM)
  std::string otlp_traces_endpoint;  ///< --otlp-traces-endpoint (vLLM; "" = no tracing)
  std::string ssl_ca_certs;          ///< --ssl-ca-certs: CAs of https peers (P/D handshakes)
  http::ConnectionOptions connections;  ///< --timeout-keep-alive, --request-head-timeout-s, ...
};

}  // namespace kvpush::apps
