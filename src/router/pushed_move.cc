#include "router/pushed_move.h"

#include <utility>

#include "pd/legs.h"

namespace kvpush::router {

using nlohmann::json;

namespace {

/// The client's `n`: 1 when absent, 0 when it is not a positive integer.
int64_t ChoicesOf(const json& doc) {
  const auto n = doc.find("n");
  if (n == doc.end() || n->is_null()) return 1;
  if (!n->is_number_integer() || n->get<int64_t>() < 1) return 0;
  return n->get<int64_t>();
}

PushedMove MakeMove(const ClientBody& client, const ResumeLedger& ledger,
                    const InstanceAddress& source) {
  PushedMove m;
  m.source = source;
  m.leg = client.Shell();
  AddResume(m.leg, ledger);
  m.resumed = ledger.tokens();
  return m;
}

}  // namespace

void AddResume(json& leg, const json& resume, std::optional<int64_t> seed) {
  leg["kvpush_resume"] = resume;
  const auto own = leg.find("seed");
  if ((own == leg.end() || own->is_null()) && seed) leg["seed"] = *seed;
}

void AddResume(json& leg, const ResumeLedger& ledger) {
  AddResume(leg, ledger.ToJson(), ledger.seed());
}

std::string PushedMove::PrefillBody(const ClientBody& client, const std::string& tid) const {
  json p = pd::MakePrefillBody(leg, pd::KvTransferParams::Mode::kPush, tid);
  p["max_tokens"] = resumed + 1;
  return ComposeLegBody(p, client);
}

std::string PushedMove::DecodeBody(const ClientBody& client, const std::string& tid,
                                   bool first_round) const {
  json d = pd::MakeDecodePushBody(leg, tid, source.host, source.port, source.https);
  if (first_round) {
    d["stream"] = false;
    d.erase("stream_options");
    d.erase("max_completion_tokens");
    d["max_tokens"] = resumed + 1;
    // min_tokens may not exceed max_tokens on a D leg: clamped as P clamps its own (the binding
    // compares min_tokens > resumed, which the clamp keeps).
    const auto min = d.find("min_tokens");
    if (min != d.end() && min->is_number_integer() && min->get<int64_t>() > resumed + 1) {
      *min = resumed + 1;
    }
  }
  return ComposeLegBody(d, client);
}

std::optional<PushedMove> PlanWholePush(const ClientBody& client, const ResumeLedger& ledger,
                                        const InstanceAddress& source) {
  if (ChoicesOf(client.doc) != 1 || ledger.tokens() < 1) return std::nullopt;
  return MakeMove(client, ledger, source);
}

std::vector<PushedMove> PlanFirstRounds(const ClientBody& client, const ResumeLedger& ledger,
                                        const InstanceAddress& source) {
  std::vector<PushedMove> rounds;
  const int64_t n = ChoicesOf(client.doc);
  if (n == 1) {
    if (auto m = PlanWholePush(client, ledger, source)) rounds.push_back(std::move(*m));
    return rounds;
  }
  for (const int64_t index : ledger.OpenChoicesWithOutput()) {
    if (index >= n) continue;  // the instance would have refused it; the switch will say so
    PushedMove m = MakeMove(client, ledger.OneChoice(index), source);
    m.leg["n"] = 1;
    rounds.push_back(std::move(m));
  }
  return rounds;
}

}  // namespace kvpush::router
