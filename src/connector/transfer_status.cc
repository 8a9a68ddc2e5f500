// The /kv/transfer_status query and answer (transfer_status.h).
#include "connector/transfer_status.h"

#include <algorithm>
#include <set>

#include "pd/ids.h"

namespace kvpush::connector {

nlohmann::json TransferStatusQuery::ToJson() const {
  return {{"engine_id", engine_id}, {"transfer_ids", transfer_ids}};
}

Result<TransferStatusQuery> TransferStatusQuery::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("transfer status query: not a JSON object");
  for (const auto& [k, v] : j.items()) {
    if (k != "engine_id" && k != "transfer_ids") {
      return InvalidArgument("transfer status query: unknown field '" + k + "'");
    }
  }
  const auto e = j.find("engine_id");
  if (e == j.end() || !e->is_string() || e->get_ref<const std::string&>().empty() ||
      e->get_ref<const std::string&>().size() > 255) {
    return InvalidArgument("transfer status query: 'engine_id' must be a string of 1..255 bytes");
  }
  const auto ids = j.find("transfer_ids");
  if (ids == j.end() || !ids->is_array() || ids->empty() || ids->size() > kMaxStatusTransfers) {
    return InvalidArgument("transfer status query: 'transfer_ids' must be an array of 1.." +
                           std::to_string(kMaxStatusTransfers) + " transfer ids");
  }
  TransferStatusQuery q;
  q.engine_id = e->get<std::string>();
  std::set<std::string> seen;
  for (const auto& id : *ids) {
    if (!id.is_string() || !pd::IsValidTransferId(id.get_ref<const std::string&>())) {
      return InvalidArgument(
          "transfer status query: every transfer id must be 32 lowercase hex characters");
    }
    if (!seen.insert(id.get<std::string>()).second) {
      return InvalidArgument("transfer status query: transfer id " + id.get<std::string>() +
                             " named twice");
    }
    q.transfer_ids.push_back(id.get<std::string>());
  }
  return q;
}

nlohmann::json TransferStatusAnswer::ToJson() const {
  nlohmann::json t = nlohmann::json::object();
  for (const auto& [id, done] : settled) t[id] = done ? "settled" : "pending";
  return {{"transfers", t}};
}

Result<TransferStatusAnswer> TransferStatusAnswer::FromJson(const nlohmann::json& j,
                                                            const TransferStatusQuery& asked) {
  if (!j.is_object()) return InvalidArgument("transfer status answer: not a JSON object");
  const auto t = j.find("transfers");
  if (t == j.end() || !t->is_object()) {
    return InvalidArgument("transfer status answer: 'transfers' must be an object");
  }
  TransferStatusAnswer a;
  for (const std::string& id : asked.transfer_ids) a.settled[id] = false;
  for (const auto& [id, v] : t->items()) {
    auto it = a.settled.find(id);
    if (it == a.settled.end()) {
      return InvalidArgument("transfer status answer: transfer " + id.substr(0, 64) +
                             " was not asked");
    }
    if (!v.is_string() || (v != "settled" && v != "pending")) {
      return InvalidArgument("transfer status answer: transfer " + id +
                             " must be \"settled\" or \"pending\"");
    }
    it->second = v == "settled";
  }
  return a;
}

}  // namespace kvpush::connector
