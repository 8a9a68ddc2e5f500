#include "router/decode_stream.h"

#include "router/sse_splitter.h"

namespace kvpush::router {

DecodeStream::DecodeStream(WorkerPool& workers, std::shared_ptr<Leg> leg, std::string path,
                           std::string request_id, std::string body)
    : leg_(std::move(leg)), shared_(std::make_shared<Shared>()) {
  const bool queued = workers.Submit([leg = leg_, s = shared_, path = std::move(path),
                                      request_id = std::move(request_id),
                                      body = std::move(body)] {
    SseSplitter splitter;
    auto on_headers = [&](int status, const std::string& content_type) {
      {
        std::lock_guard<std::mutex> lock(s->mu);
        s->headers = true;
        s->status = status;
        s->content_type = content_type;
      }
      s->cv.notify_all();
      return true;
    };
    auto on_data = [&](const char* data, size_t len) {
      std::vector<std::string> events = splitter.Feed(data, len);
      if (events.empty()) return true;
      {
        std::lock_guard<std::mutex> lock(s->mu);
        for (auto& e : events) s->events.push_back(std::move(e));
      }
      s->cv.notify_all();
      return true;
    };
    LegResult r = leg->PostStreaming(path, request_id, body, on_headers, on_data);
    {
      std::lock_guard<std::mutex> lock(s->mu);
      // A complete answer whose last event lacks its blank line: relay it whole.
      std::string rest = splitter.TakeRest();
      if (r.answered && r.status == 200 && !rest.empty()) s->events.push_back(rest + "\n\n");
      s->finished = true;
      s->result = std::move(r);
    }
    s->cv.notify_all();
  });
  if (!queued) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->finished = true;
    shared_->result.stopped = true;
    shared_->result.error = "router is stopping";
  }
}

DecodeStream::~DecodeStream() {
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    finished = shared_->finished;
  }
  if (!finished) leg_->Stop();
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait(lock, [this] { return shared_->finished; });
}

int DecodeStream::WaitHeaders() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait(lock, [this] { return shared_->headers || shared_->finished; });
  return shared_->headers ? shared_->status : 0;
}

LegResult DecodeStream::WaitFinished() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait(lock, [this] { return shared_->finished; });
  return shared_->result;
}

bool DecodeStream::TakeEvents(std::chrono::milliseconds timeout, std::vector<std::string>* events) {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait_for(lock, timeout,
                       [this] { return !shared_->events.empty() || shared_->finished; });
  while (!shared_->events.empty()) {
    events->push_back(std::move(shared_->events.front()));
    shared_->events.pop_front();
  }
  return shared_->finished;
}

LegResult DecodeStream::result() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->result;
}

std::string DecodeStream::content_type() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->content_type;
}

}  // namespace kvpush::router
