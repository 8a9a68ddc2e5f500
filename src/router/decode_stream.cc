#include "router/decode_stream.h"

#include <algorithm>

#include "common/clock.h"

namespace kvpush::router {

int DecodeStream::Start(const std::string& path, const std::string& request_id,
                        const std::string& body) {
  const Leg::Ahead ahead = leg_->TakeSentAhead(&result_);
  const bool sent = ahead == Leg::Ahead::kWritten ||
                    (ahead == Leg::Ahead::kNone &&
                     leg_->Send("POST", path, request_id, body, /*sse=*/true, &result_));
  if (!sent || !leg_->ReadHead(&result_)) {
    finished_ = true;
    return 0;
  }
  last_data_ns_ = NowNs();
  return result_.status;
}

LegResult DecodeStream::WaitFinished() {
  if (finished_) return result_;
  finished_ = true;
  const int status = result_.status;
  const std::string content_type = result_.content_type;
  std::string body;
  bool ended = false;
  while (!ended) {
    const BodyRead br = leg_->ReadBody(leg_->io_timeout_ms(), &body, &ended, &result_);
    if (br == BodyRead::kFailed) return result_;
    if (br == BodyRead::kTimeout) {
      leg_->Stop();
      result_ = LegResult{};
      result_.status = status;
      result_.error = "read timed out";
      return result_;
    }
  }
  result_.answered = true;
  result_.status = status;
  result_.content_type = content_type;
  result_.body = std::move(body);
  return result_;
}

bool DecodeStream::TakeEvents(std::chrono::milliseconds timeout, std::vector<std::string>* events) {
  if (finished_) return true;
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout.count()) * 1000000;
  for (;;) {
    std::string data;
    bool ended = false;
    const int64_t left_ms = std::max<int64_t>(0, (deadline - NowNs()) / 1000000);
    const BodyRead br = leg_->ReadBody(static_cast<int>(left_ms), &data, &ended, &result_);
    if (br == BodyRead::kFailed) {
      finished_ = true;
      return true;
    }
    const int64_t now = NowNs();
    if (!data.empty()) last_data_ns_ = now;
    if (br == BodyRead::kTimeout &&
        now - last_data_ns_ > int64_t{leg_->io_timeout_ms()} * 1000000) {
      leg_->Stop();  // D went silent: fail the leg as a read timeout
      const int status = result_.status;
      result_ = LegResult{};
      result_.status = status;
      result_.error = "read timed out";
      finished_ = true;
      return true;
    }
    const size_t before = events->size();
    for (std::string& e : splitter_.Feed(data.data(), data.size())) events->push_back(std::move(e));
    if (ended) {
      // A complete answer whose last event lacks its blank line: relay it whole.
      const std::string rest = splitter_.TakeRest();
      if (!rest.empty()) events->push_back(rest + "\n\n");
      result_.answered = true;
      finished_ = true;
      return true;
    }
    if (br == BodyRead::kTimeout || events->size() > before) return false;
  }
}

}  // namespace kvpush::router
