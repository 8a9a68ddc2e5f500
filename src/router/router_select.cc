// Router::SelectPd: which P and D a P/D request goes to and whether it needs a P leg (routing
// policies and conditional disaggregation, docs/router.md "Routing policies"), and the /metrics
// counters of those decisions (their /metrics rows: router_metrics.cc).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>

#include "router/router.h"

namespace kvpush::router {

PdSelection Router::SelectPd(const std::string& path, const nlohmann::json& body,
                             const std::vector<std::string>& exclude) {
  const RouterOptions& o = options_;
  PdSelection sel;
  std::vector<uint64_t> hashes;
  int32_t block_size = 0;
  bool hashed = false;
  if (o.prompt_tokenizer) {
    std::optional<std::vector<int32_t>> ids = o.prompt_tokenizer(path, body);
    block_size = o.block_size > 0 ? o.block_size : pool_->ReportedBlockSize();
    if (ids) {
      sel.prompt_tokens = static_cast<int64_t>(ids->size());
      if (block_size > 0) {
        hashes = PrefixBlockHashes(*ids, block_size);
        hashed = true;
      }
    }
  }
  DecodeChoice choice;
  // A prompt the router could not hash is routed by least outstanding legs.
  const RoutingPolicy d_policy = hashed ? o.routing : RoutingPolicy::kLeastOutstanding;
  sel.d = pool_->AcquireDecode(hashes, d_policy, o.cache_aware, &choice, exclude);
  if (!sel.d) return sel;
  if (!hashed) choice.reason = DecodeReason::kLeastOutstanding;
  sel.cached_tokens = choice.cached_blocks * block_size;
  sel.skip = ShouldSkipPrefill(sel.prompt_tokens, sel.cached_tokens, o.local_prefill_threshold);
  if (sel.skip == SkipReason::kNone)
    sel.p = pool_->AcquirePrefill(sel.prompt_tokens, o.routing, exclude);
  {
    MutexLock lock(mu_);
    RouterCounters& c = counters_;
    if (o.prompt_tokenizer) {
      ++c.decode_choices[hashed ? static_cast<int>(choice.reason) : 3];
    } else {
      ++c.decode_choices[static_cast<int>(DecodeReason::kLeastOutstanding)];
    }
    if (choice.load_cap_override) ++c.load_cap_overrides;
    if (sel.skip != SkipReason::kNone) ++c.prefill_skipped[sel.skip == SkipReason::kCached ? 1 : 0];
    if (sel.prompt_tokens >= 0) {
      c.prompt_tokens += sel.prompt_tokens;
      c.predicted_cached_tokens += std::min(sel.cached_tokens, sel.prompt_tokens);
    }
  }
  return sel;
}

}  // namespace kvpush::router
