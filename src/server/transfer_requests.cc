#include "server/transfer_requests.h"

#include "common/clock.h"

namespace kvpush::server {

bool TransferRequests::Add(const std::string& tid, int64_t id) {
  MutexLock lock(mu_);
  ExpireLocked(NowNs());
  if (aborted_.count(tid) != 0) return false;
  inflight_[tid].push_back(id);
  return true;
}

void TransferRequests::Remove(const std::string& tid, int64_t id) {
  MutexLock lock(mu_);
  auto it = inflight_.find(tid);
  if (it == inflight_.end()) return;
  std::erase(it->second, id);
  if (it->second.empty()) inflight_.erase(it);
}

bool TransferRequests::IsAborted(const std::string& tid) const {
  MutexLock lock(mu_);
  return aborted_.count(tid) != 0;
}

std::vector<int64_t> TransferRequests::Abort(const std::string& tid) {
  MutexLock lock(mu_);
  const int64_t now = NowNs();
  ExpireLocked(now);
  if (aborted_.insert(tid).second) aborted_order_.emplace_back(now, tid);
  std::vector<int64_t> ids;
  auto it = inflight_.find(tid);
  if (it != inflight_.end()) {
    ids = std::move(it->second);
    inflight_.erase(it);
  }
  return ids;
}

void TransferRequests::ExpireLocked(int64_t now_ns) {
  while (!aborted_order_.empty() && (aborted_order_.size() > kMaxAborted ||
                                     now_ns - aborted_order_.front().first > kAbortedTtlNs)) {
    aborted_.erase(aborted_order_.front().second);
    aborted_order_.pop_front();
  }
}

}  // namespace kvpush::server
