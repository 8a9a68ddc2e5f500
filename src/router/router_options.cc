#include "router/router_options.h"

#include <sstream>

#include "discovery/instance_record.h"

namespace kvpush::router {

Status RouterOptions::Validate() const {
  if (colocated()) {
    if (!prefill_urls.empty() || !decode_urls.empty()) {
      return InvalidArgument("--colocated cannot be combined with --prefill/--decode");
    }
    if (discovered()) return InvalidArgument("--colocated cannot be combined with --discovery");
  } else if (!discovered()) {
    if (prefill_urls.empty()) {
      return InvalidArgument(
          "at least one --prefill URL is required (or use --discovery or --colocated)");
    }
    if (decode_urls.empty()) {
      return InvalidArgument(
          "at least one --decode URL is required (or use --discovery or --colocated)");
    }
  }
  if (discovered()) {
    if (auto e = discovery::ParseDiscoveryUrl(discovery); !e.ok()) return e.status();
    if (Status s = discovery::ValidatePrefix(discovery_prefix); !s.ok()) return s;
  }
  for (const auto* urls : {&prefill_urls, &decode_urls, &colocated_urls}) {
    for (const std::string& u : *urls) {
      if (auto a = ParseInstanceUrl(u); !a.ok()) return a.status();
    }
  }
  if (!pull_profile.empty() && pull_profile != "vllm" && pull_profile != "fast") {
    return InvalidArgument("--pull-profile must be vllm or fast, not '" + pull_profile + "'");
  }
  if (port < 0 || port > 65535) return InvalidArgument("--port must be in [0, 65535]");
  if (health_interval_ms < 10) return InvalidArgument("--health-interval-ms must be >= 10");
  if (health_timeout_ms < 1) return InvalidArgument("health timeout must be >= 1 ms");
  if (!(request_timeout_s > 0)) return InvalidArgument("--request-timeout-s must be > 0");
  if (!(connect_timeout_s > 0)) return InvalidArgument("connect timeout must be > 0");
  if (max_concurrent_streams < 1) return InvalidArgument("max concurrent streams must be >= 1");
  if (!(max_idle_connection_s >= 0)) return InvalidArgument("max idle connection age must be >= 0");
  if (!(cache_aware.load_cap >= 1.0)) return InvalidArgument("--cache-aware-load-cap must be >= 1");
  if (local_prefill_threshold < 0) {
    return InvalidArgument("--local-prefill-threshold must be >= 0 (0 = off)");
  }
  if (migration_limit < 0) return InvalidArgument("--migration-limit must be >= 0 (0 = off)");
  if (block_size < 0) return InvalidArgument("--block-size must be >= 0 (0 = from the instances)");
  if (prefix_index_blocks < 1) return InvalidArgument("--prefix-index-blocks must be >= 1");
  const bool needs_tokens = routing == RoutingPolicy::kCacheAware || local_prefill_threshold > 0;
  if (needs_tokens && colocated()) {
    return InvalidArgument(
        "--routing cache-aware and --local-prefill-threshold apply to P/D mode, not --colocated");
  }
  if (needs_tokens && !prompt_tokenizer) {
    return InvalidArgument(
        "--routing cache-aware and --local-prefill-threshold need the prompt's token ids: give "
        "--tokenizer MODEL (the instances' model file)");
  }
  return Status::Ok();
}

std::string RouterOptions::ToString() const {
  std::ostringstream s;
  auto list = [&s](const char* name, const std::vector<std::string>& urls) {
    s << name << "=[";
    for (size_t i = 0; i < urls.size(); ++i) s << (i ? "," : "") << urls[i];
    s << "] ";
  };
  if (colocated()) {
    list("colocated", colocated_urls);
    s << "selection=round_robin";
  } else {
    list("prefill", prefill_urls);
    list("decode", decode_urls);
    if (discovered()) {
      s << "discovery=" << discovery << " prefix=" << discovery_prefix
        << " model=" << (discovery_model.empty() ? "(any)" : discovery_model) << " ";
    }
    s << "mode=" << TransferModeName(mode)
      << " pull_profile=" << (pull_profile.empty() ? "(decode default)" : pull_profile)
      << " routing=" << RoutingPolicyName(routing)
      << " cache_aware_load_cap=" << cache_aware.load_cap
      << " local_prefill_threshold=" << local_prefill_threshold << " block_size="
      << (block_size > 0 ? std::to_string(block_size) : std::string("(from instances)"))
      << " prefix_index_blocks=" << prefix_index_blocks
      << " tokenizer=" << (tokenizer_path.empty() ? "(none)" : tokenizer_path);
  }
  s << " migration_limit=" << migration_limit
    << " migration_transfer=" << (migration_push ? "push" : "recompute");
  s << " host=" << host << " port=" << port << " health_interval_ms=" << health_interval_ms
    << " health_timeout_ms=" << health_timeout_ms << " request_timeout_s=" << request_timeout_s
    << " connect_timeout_s=" << connect_timeout_s
    << " max_concurrent_streams=" << max_concurrent_streams
    << " max_idle_connections=" << max_idle_connections
    << " max_idle_connection_s=" << max_idle_connection_s
    << " timeout_keep_alive=" << connections.keep_alive_timeout_s
    << " request_head_timeout_s=" << connections.header_timeout_s << " max_connections="
    << (connections.max_connections > 0 ? std::to_string(connections.max_connections)
                                         : std::string("(auto)"))
    << " ssl_ca_certs=" << (tls_ca_file.empty() ? "(system)" : tls_ca_file)
    << " api_key=" << (api_key.empty() ? "(none)" : "(set)")
    << " instance_api_key=" << (instance_api_key.empty() ? "(none)" : "(set)");
  return s.str();
}

}  // namespace kvpush::router
