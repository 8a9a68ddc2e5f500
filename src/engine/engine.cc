#include "engine/engine.h"

#include <sched.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <utility>

#include "common/clock.h"
#include "common/thread_name.h"
#include "engine/continuation.h"

namespace kvpush {

Result<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                               std::unique_ptr<Executor> executor,
                                               const Tokenizer& tokenizer, KvConnector* connector,
                                               std::span<std::byte> kv_memory) {
  if (executor == nullptr) return InvalidArgument("Engine: no executor");
  KVP_ASSIGN_OR_RETURN(EngineConfig resolved, config.Resolve(executor->config()));
  KVP_ASSIGN_OR_RETURN(auto core, EngineCore::Create(resolved, std::move(executor), tokenizer,
                                                     connector, kv_memory));
  return std::unique_ptr<Engine>(new Engine(resolved, std::move(core), tokenizer, connector));
}

Engine::Engine(const EngineConfig& config, std::unique_ptr<EngineCore> core,
               const Tokenizer& tokenizer, KvConnector* connector)
    : config_(config),
      model_(core->model_config()),
      tokenizer_(tokenizer),
      connector_(connector),
      core_(std::move(core)) {
  stats_ = core_->stats();
  if (connector != nullptr) {
    connector->BindEngine([this] { Wake(); }, [this](int64_t id) { Abort(id); });
  }
  core_->set_defer_outputs(true);
  spdlog::default_logger_raw();  // construct the registry before the engine thread may log
  thread_ = std::thread([this] {
    SetThreadName("kvp-engine");
    Loop();
  });
}

Engine::~Engine() {
  Stop();
}

void Engine::Wake() {
  {
    MutexLock lock(mu_);
    woken_ = true;
  }
  cv_.NotifyOne();
}

void Engine::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

Result<Engine::Handle> Engine::Submit(GenerationRequest request) {
  Status st = ValidateRequest(config_, model_, request);
  if (st.ok() && !request.resume_output_tokens.empty()) {
    // A continuation that cannot be resumed is refused here, before its answer starts (the
    // engine thread replays it again to prime its sequence).
    OutputTextProcessor text(tokenizer(), request.stop, request.prompt_tokens);
    st = ReplayResumedOutput(request, model_.eos_id, text);
  }
  if (!st.ok()) {
    if (connector_ != nullptr) connector_->OnRequestRejected(request);
    return st;
  }
  Handle h;
  h.id = next_id_.fetch_add(1);
  h.channel = std::make_shared<OutputChannel>();
  {
    MutexLock lock(mu_);
    if (stopping_) return Unavailable("engine is shutting down");
    const int64_t pending = static_cast<int64_t>(queue_.size()) + num_waiting_.load();
    if (pending >= config_.max_pending_requests) {
      return Unavailable("engine overloaded: " + std::to_string(pending) +
                         " requests already waiting");
    }
    Command c;
    c.id = h.id;
    c.request = std::move(request);
    c.channel = h.channel;
    c.arrival_ns = NowNs();
    queue_.push_back(std::move(c));
  }
  cv_.NotifyOne();
  return h;
}

void Engine::Abort(int64_t id) {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    Command c;
    c.abort = true;
    c.id = id;
    queue_.push_back(std::move(c));
  }
  cv_.NotifyOne();
}

Result<int32_t> Engine::ResetPrefixCache(std::chrono::milliseconds timeout) {
  auto reply = std::make_shared<std::promise<Result<int32_t>>>();
  std::future<Result<int32_t>> answer = reply->get_future();
  {
    MutexLock lock(mu_);
    if (stopping_) return Unavailable("engine is shutting down");
    Command c;
    c.reset = std::move(reply);
    queue_.push_back(std::move(c));
  }
  cv_.NotifyOne();
  if (answer.wait_for(timeout) != std::future_status::ready) {
    return DeadlineExceeded("the engine did not reach the prefix-cache reset within " +
                            std::to_string(timeout.count()) + " ms");
  }
  return answer.get();
}

EngineStats Engine::stats() const {
  MutexLock lock(stats_mu_);
  return stats_;
}

void Engine::Loop() {
  std::deque<Command> cmds;
  int32_t last_step_tokens = 0;
  while (true) {
    {
      MutexLock lock(mu_);
      // Sleep when the last step could not schedule anything (idle, or only waiting on the
      // connector: it calls Wake() when a load finishes or held blocks may be released); the
      // timeout is a safety net, not a poll interval.
      if (last_step_tokens == 0) {
        const auto wait =
            core_->HasWork() ? std::chrono::milliseconds(20) : std::chrono::milliseconds(200);
        const auto deadline = std::chrono::steady_clock::now() + wait;
        while (!stopping_ && !woken_ && queue_.empty()) {
          if (!cv_.WaitUntil(lock, deadline)) break;
        }
      }
      woken_ = false;
      if (stopping_) break;
      cmds.swap(queue_);
    }
    for (Command& c : cmds) {
      if (c.abort) {
        core_->Abort(c.id);
      } else if (c.reset) {
        c.reset->set_value(core_->ResetPrefixCache());
      } else {
        core_->AddRequest(c.id, std::move(c.request), std::move(c.channel), c.arrival_ns);
      }
    }
    cmds.clear();
    // A first token delivered with remote KV (push, pull fast) goes out now, not after the
    // forward pass of the step below (one decode step of latency, the whole of TPOT).
    core_->PollConnector();
    if (core_->has_pending_outputs()) PublishAndFlush();
    last_step_tokens = core_->Step();
    PublishAndFlush();
  }
  // Shutdown: answer everything still queued or running.
  std::deque<Command> rest;
  {
    MutexLock lock(mu_);
    rest.swap(queue_);
  }
  for (Command& c : rest) {
    if (c.reset) c.reset->set_value(Unavailable("engine is shutting down"));
    if (c.abort || c.channel == nullptr) continue;
    RequestOutput out;
    out.finish_reason = FinishReason::kAbort;
    out.error = Aborted("engine is shutting down");
    c.channel->Push(std::move(out));
  }
  core_->AbortAll("engine is shutting down");
  PublishAndFlush();
}

void Engine::PublishAndFlush() {
  const EngineStats& s = core_->stats();
  num_waiting_.store(s.num_waiting);
  num_running_.store(s.num_running, std::memory_order_relaxed);
  outstanding_prefill_tokens_.store(s.outstanding_prefill_tokens, std::memory_order_relaxed);
  {
    MutexLock lock(stats_mu_);
    stats_ = s;
  }
  const bool flushed = core_->has_pending_outputs();
  core_->FlushOutputs();  // after the snapshot: a finished output implies updated stats
  // The HTTP thread just woken to send these outputs may be queued on this core: let it run
  // before the next forward pass. Without it the kernel lets this thread finish its slice (2-6
  // ms on 2 cores) first and the token waits: TTFT p90 4.05 -> 2.02 ms colocated, 5.99 -> 3.71
  // push, with decode steps running back to back (docs/engine.md, "Engine thread").
  if (flushed) sched_yield();
}

}  // namespace kvpush
