#include "engine/output_channel.h"

#include <utility>

namespace kvpush {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

void OutputChannel::Push(RequestOutput output) {
  {
    MutexLock lock(mu_);
    if (closed_) return;
    closed_ = output.finished();
    queue_.push_back(std::move(output));
  }
  cv_.NotifyOne();
}

std::optional<RequestOutput> OutputChannel::Next(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (queue_.empty() && !final_taken_) {
    if (!cv_.WaitUntil(lock, deadline)) break;
  }
  if (queue_.empty()) return std::nullopt;  // timed out, or the final output was taken
  RequestOutput out = std::move(queue_.front());
  queue_.pop_front();
  if (out.finished()) final_taken_ = true;
  return out;
}

std::deque<RequestOutput> OutputChannel::TakeAll() {
  MutexLock lock(mu_);
  std::deque<RequestOutput> out;
  out.swap(queue_);
  if (!out.empty() && out.back().finished()) final_taken_ = true;
  return out;
}

bool OutputChannel::closed() const {
  MutexLock lock(mu_);
  return closed_;
}

}  // namespace kvpush
