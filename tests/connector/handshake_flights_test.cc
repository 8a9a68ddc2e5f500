// HandshakeFlights with a fake attempt that blocks until the test releases it: concurrent callers
// share one attempt and its answer, a failure is answered at once while a probe retries it and a
// probe's success ends it, every wait ends at the caller's deadline or when it is cancelled, and
// destruction joins a flight under way. Real threads, short waits; nothing asserts a duration
// except upper bounds far above what the code needs.
#include "connector/handshake_flights.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

namespace kvpush::connector {
namespace {

using Clock = HandshakeFlights::Clock;
using std::chrono::milliseconds;

/// An attempt that waits for `open` and answers what `answer` says then.
struct Gate {
  Mutex mu;
  CondVar cv;
  bool open GUARDED_BY(mu) = false;
  Result<std::string> answer GUARDED_BY(mu) = Unavailable("refused");
  std::atomic<int> calls{0};

  HandshakeFlights::Attempt Fn() {
    return [this](const std::string& key) -> Result<std::string> {
      EXPECT_EQ(key, "10.0.0.1:8000");
      calls.fetch_add(1);
      MutexLock lock(mu);
      while (!open) cv.Wait(lock);
      return answer;
    };
  }
  void Open(Result<std::string> a) {
    {
      MutexLock lock(mu);
      open = true;
      answer = std::move(a);
    }
    cv.NotifyAll();
  }
  void Close() {
    MutexLock lock(mu);
    open = false;
  }
};

const std::string kKey = "10.0.0.1:8000";

Clock::time_point In(milliseconds d) { return Clock::now() + d; }

TEST(HandshakeFlights, ConcurrentCallersShareOneAttemptAndItsAnswer) {
  Gate gate;
  HandshakeFlights flights(gate.Fn());
  std::vector<std::future<Result<std::string>>> waiting;
  for (int i = 0; i < 8; ++i) {
    waiting.push_back(std::async(std::launch::async,
                                 [&] { return flights.Await(kKey, In(milliseconds(20000))); }));
  }
  while (gate.calls.load() == 0) std::this_thread::sleep_for(milliseconds(1));
  std::this_thread::sleep_for(milliseconds(50));  // every caller is waiting on the one attempt
  gate.Open(std::string("engine-p"));
  for (auto& w : waiting) {
    auto r = w.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, "engine-p");
  }
  EXPECT_EQ(gate.calls.load(), 1);
  EXPECT_EQ(flights.attempts(), 1);
}

TEST(HandshakeFlights, AFailureIsAnsweredAtOnceWhileAProbeRetriesItUntilItSucceeds) {
  Gate gate;
  gate.Open(Unavailable("connection refused"));
  HandshakeFlights::Options o;
  o.probe_min = milliseconds(100);
  o.probe_max = milliseconds(100);
  HandshakeFlights flights(gate.Fn(), o);
  auto first = flights.Await(kKey, In(milliseconds(20000)));
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kUnavailable);
  // The caller that waited gets the attempt's own error, and that it is being retried.
  EXPECT_EQ(first.status().message(), "connection refused (retried in the background)");
  // The next callers do not wait for anything: the failure, saying it is being retried.
  for (int i = 0; i < 4; ++i) {
    const auto t0 = Clock::now();
    auto again = flights.Await(kKey, In(milliseconds(20000)));
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(again.status().message().find("retried in the background"), std::string::npos)
        << again.status().message();
    EXPECT_LT(Clock::now() - t0, milliseconds(1000));
  }
  // The peer comes back: a probe finds it, and callers get it.
  gate.Close();
  gate.Open(std::string("engine-p"));
  Result<std::string> back = Unavailable("not yet");
  for (int i = 0; i < 200 && !back.ok(); ++i) {
    std::this_thread::sleep_for(milliseconds(20));
    back = flights.Await(kKey, In(milliseconds(20000)));
  }
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, "engine-p");
  EXPECT_GE(flights.attempts(), 2);
}

TEST(HandshakeFlights, EveryWaitEndsAtItsOwnDeadlineOrWhenCancelled) {
  Gate gate;  // closed: the attempt hangs until the end of the test
  HandshakeFlights flights(gate.Fn());
  const auto t0 = Clock::now();
  auto late = flights.Await(kKey, In(milliseconds(150)));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.status().message().find(kKey), std::string::npos);
  EXPECT_LT(Clock::now() - t0, milliseconds(5000));

  std::atomic<bool> abort{false};
  auto cancelled = std::async(std::launch::async, [&] {
    return flights.Await(kKey, In(milliseconds(60000)), [&] { return abort.load(); });
  });
  std::this_thread::sleep_for(milliseconds(50));
  const auto t1 = Clock::now();
  abort = true;
  auto r = cancelled.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted);
  EXPECT_LT(Clock::now() - t1, milliseconds(5000));
  EXPECT_EQ(gate.calls.load(), 1);  // both joined the one attempt under way
  gate.Open(std::string("engine-p"));
}

TEST(HandshakeFlights, DestructionWakesWaitersAndJoinsTheFlightUnderWay) {
  Gate gate;  // closed: the attempt is under way while the flights are destroyed
  auto flights = std::make_unique<HandshakeFlights>(gate.Fn());
  auto waiter = std::async(std::launch::async,
                           [&] { return flights->Await(kKey, In(milliseconds(60000))); });
  while (gate.calls.load() == 0) std::this_thread::sleep_for(milliseconds(1));
  std::thread destroy([&] { flights.reset(); });
  // The waiter is told at once, while the destructor still waits for the attempt.
  auto r = waiter.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("shutting down"), std::string::npos);
  gate.Open(Unavailable("refused"));  // the attempt ends; the destructor joins its thread
  destroy.join();
  EXPECT_EQ(gate.calls.load(), 1);  // no probe after the destruction began
}

}  // namespace
}  // namespace kvpush::connector
