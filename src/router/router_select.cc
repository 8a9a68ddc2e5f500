// Router::SelectPd: which P and D a P/D request goes to and whether it needs a P leg (routing
// policies and conditional disaggregation, docs/router.md "Routing policies"), and the /metrics
// rows that count those decisions.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>

#include "router/router.h"

namespace kvpush::router {

Router::PdSelection Router::SelectPd(const std::string& path, const nlohmann::json& body) {
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
  sel.d = pool_->AcquireDecode(hashes, d_policy, o.cache_aware, &choice);
  if (!sel.d) return sel;
  if (!hashed) choice.reason = DecodeReason::kLeastOutstanding;
  sel.cached_tokens = choice.cached_blocks * block_size;
  sel.skip = ShouldSkipPrefill(sel.prompt_tokens, sel.cached_tokens, o.local_prefill_threshold);
  if (sel.skip == SkipReason::kNone) sel.p = pool_->AcquirePrefill(sel.prompt_tokens, o.routing);
  {
    std::lock_guard<std::mutex> lock(mu_);
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

void Router::RenderRoutingMetrics(const RouterCounters& c, std::ostringstream& s) const {
  s << "# HELP kvpush_router_decode_choices_total Decode instance choices by reason: prefix_hit "
       "(the router's index says the chosen D holds a leading block of the prompt), rendezvous "
       "(owner of the prompt's first block), least_outstanding (policy least-outstanding or a "
       "prompt shorter than a block), unhashed (the router could not tokenize the prompt).\n"
    << "# TYPE kvpush_router_decode_choices_total counter\n";
  const char* reasons[4] = {"prefix_hit", "rendezvous", "least_outstanding", "unhashed"};
  for (int k = 0; k < 4; ++k) {
    s << "kvpush_router_decode_choices_total{policy=\"" << RoutingPolicyName(options_.routing)
      << "\",reason=\"" << reasons[k] << "\"} " << c.decode_choices[k] << "\n";
  }
  s << "# HELP kvpush_router_load_cap_overrides_total Cache-aware choices that skipped the "
       "preferred decode instance because it was over the load cap.\n"
    << "# TYPE kvpush_router_load_cap_overrides_total counter\n"
    << "kvpush_router_load_cap_overrides_total " << c.load_cap_overrides << "\n";
  s << "# HELP kvpush_router_prefill_legs_skipped_total P legs not sent (--local-prefill-"
       "threshold): threshold (the prompt is shorter), cached (its uncached part is).\n"
    << "# TYPE kvpush_router_prefill_legs_skipped_total counter\n"
    << "kvpush_router_prefill_legs_skipped_total{reason=\"threshold\"} " << c.prefill_skipped[0]
    << "\n"
    << "kvpush_router_prefill_legs_skipped_total{reason=\"cached\"} " << c.prefill_skipped[1]
    << "\n";
  s << "# HELP kvpush_router_prompt_tokens_total Prompt tokens of the requests the router "
       "tokenized.\n"
    << "# TYPE kvpush_router_prompt_tokens_total counter\n"
    << "kvpush_router_prompt_tokens_total " << c.prompt_tokens << "\n";
  s << "# HELP kvpush_router_predicted_cached_tokens_total Of those, the tokens the router's "
       "prefix index predicted the chosen decode instance had cached.\n"
    << "# TYPE kvpush_router_predicted_cached_tokens_total counter\n"
    << "kvpush_router_predicted_cached_tokens_total " << c.predicted_cached_tokens << "\n";
}

}  // namespace kvpush::router
