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
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = output.finished();
    queue_.push_back(std::move(output));
  }
  cv_.notify_one();
}

std::optional<RequestOutput> OutputChannel::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || final_taken_; })) {
    return std::nullopt;
  }
  if (queue_.empty()) return std::nullopt;
  RequestOutput out = std::move(queue_.front());
  queue_.pop_front();
  if (out.finished()) final_taken_ = true;
  return out;
}

std::deque<RequestOutput> OutputChannel::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::deque<RequestOutput> out;
  out.swap(queue_);
  if (!out.empty() && out.back().finished()) final_taken_ = true;
  return out;
}

bool OutputChannel::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace kvpush
