#include "xfer/loopback_backend.h"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "xfer/byte_io.h"

namespace kvpush::xfer {
namespace {

// The target side of a loopback backend, reachable by id from other backends in the process.
struct Endpoint {
  std::shared_mutex mu;  // shared: deliveries; exclusive: region changes, shutdown
  bool alive = true;
  BackendSink* sink = nullptr;
  std::unordered_map<uint32_t, std::pair<uint8_t*, uint64_t>> regions;  // key -> (base, length)
  // Fences: initiator endpoint id -> how many times this endpoint fenced it. A connection made
  // (Connect) before the last fence of its initiator lands nothing here any more.
  std::unordered_map<uint64_t, uint64_t> fences;
};

std::mutex g_registry_mu;
std::map<uint64_t, std::weak_ptr<Endpoint>> g_registry;
uint64_t g_next_endpoint = 1;

struct LoopRegion : BackendRegion {
  uint32_t id = 0;
  void* owned = nullptr;
};
struct LoopPeer : BackendPeer {
  std::weak_ptr<Endpoint> target;
  uint64_t id = 0;
  uint64_t fence_epoch = 0;  // the target's fence count of this initiator at Connect
};
struct LoopRemoteRegion : BackendRemoteRegion {
  uint32_t key = 0;
};

class LoopbackBackend final : public Backend {
 public:
  LoopbackBackend() : self_(std::make_shared<Endpoint>()) {
    caps_.name = "loopback";
    caps_.needs_target_progress = false;
    caps_.addressing = AddressMode::kOffset;
    caps_.key_kind = KeyKind::kProviderIssued;
    caps_.max_message_bytes = 64 * 1024;
    caps_.fences_peers = true;  // every copy into an endpoint checks its fences (Execute)
    std::lock_guard lock(g_registry_mu);
    id_ = g_next_endpoint++;
    g_registry[id_] = self_;
    worker_ = std::thread([this] { WorkerLoop(); });
  }
  ~LoopbackBackend() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
    {
      std::unique_lock lock(self_->mu);
      self_->alive = false;
      self_->sink = nullptr;
    }
    std::lock_guard lock(g_registry_mu);
    g_registry.erase(id_);
  }

  const BackendCaps& caps() const override { return caps_; }
  void SetSink(BackendSink* sink) override {
    sink_ = sink;
    std::unique_lock lock(self_->mu);
    self_->sink = sink;
  }
  std::vector<uint8_t> LocalAddress() const override {
    std::vector<uint8_t> out;
    ByteWriter(&out).U64(id_);
    return out;
  }

  Result<std::unique_ptr<BackendRegion>> RegisterMemory(void* addr, uint64_t length,
                                                        MemoryType type) override {
    if (type != MemoryType::kHost) return Unimplemented("loopback: only host memory");
    auto r = std::make_unique<LoopRegion>();
    std::unique_lock lock(self_->mu);
    r->id = next_key_++;
    self_->regions[r->id] = {static_cast<uint8_t*>(addr), length};
    ByteWriter(&r->key).U32(r->id);
    return std::unique_ptr<BackendRegion>(std::move(r));
  }
  Result<std::unique_ptr<BackendRegion>> AllocateMemory(uint64_t length, MemoryType type,
                                                        void** addr) override {
    if (type != MemoryType::kHost) return Unimplemented("loopback: only host memory");
    const uint64_t rounded = (length + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr)
      return ResourceExhausted("loopback: cannot allocate " + std::to_string(length));
    std::memset(p, 0, rounded);
    auto r = RegisterMemory(p, length, type);
    if (!r.ok()) {
      std::free(p);
      return r.status();
    }
    static_cast<LoopRegion*>(r->get())->owned = p;
    *addr = p;
    return r;
  }
  void ReleaseMemory(std::unique_ptr<BackendRegion> region) override {
    auto* r = static_cast<LoopRegion*>(region.get());
    {
      std::unique_lock lock(self_->mu);  // waits for in-flight copies into this region
      self_->regions.erase(r->id);
    }
    std::free(r->owned);
  }

  Result<std::shared_ptr<BackendPeer>> Connect(std::span<const uint8_t> address) override {
    ByteReader rd(address);
    uint64_t id = 0;
    if (!rd.U64(&id) || rd.remaining() != 0) return InvalidArgument("loopback: bad address blob");
    std::lock_guard lock(g_registry_mu);
    auto it = g_registry.find(id);
    if (it == g_registry.end() || it->second.expired())
      return Unavailable("loopback: no endpoint " + std::to_string(id) + " in this process");
    auto p = std::make_shared<LoopPeer>();
    p->target = it->second;
    p->id = id;
    if (auto target = it->second.lock()) {
      std::shared_lock tl(target->mu);
      auto f = target->fences.find(id_);
      p->fence_epoch = f == target->fences.end() ? 0 : f->second;
    }
    return std::shared_ptr<BackendPeer>(std::move(p));
  }
  Result<std::shared_ptr<BackendRemoteRegion>> ImportRegion(BackendPeer*,
                                                            std::span<const uint8_t> key, uint64_t,
                                                            uint64_t) override {
    ByteReader rd(key);
    auto r = std::make_shared<LoopRemoteRegion>();
    if (!rd.U32(&r->key) || rd.remaining() != 0) return InvalidArgument("loopback: bad key blob");
    return std::shared_ptr<BackendRemoteRegion>(std::move(r));
  }
  void Disconnect(std::shared_ptr<BackendPeer>,
                  std::vector<std::shared_ptr<BackendRemoteRegion>>) override {}
  // The initiator's copies into this endpoint hold its lock shared for a whole post (Execute):
  // once the worker bumped the fence count under the exclusive lock, none of the initiator's
  // connections made before can copy anything here; then it reports the fence. Not here: the
  // caller (the Agent) holds its lock, which a copy delivering a notification needs.
  void Fence(std::shared_ptr<BackendPeer> peer,
             std::vector<std::shared_ptr<BackendRemoteRegion>>) override {
    if (peer == nullptr) return;
    {
      std::lock_guard lock(mu_);
      fenced_.push_back(std::move(peer));
    }
    cv_.notify_one();
  }

  Status Post(PostRequest request) override {
    if (request.peer == nullptr) return InvalidArgument("loopback: post without peer");
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(request));
    }
    cv_.notify_one();
    return Status::Ok();
  }
  void Abort(uint64_t) override {}  // the worker checks PostControl::aborted() between ops

 private:
  void WorkerLoop() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !fenced_.empty(); });
      if (!fenced_.empty()) {
        std::shared_ptr<BackendPeer> peer = std::move(fenced_.front());
        fenced_.pop_front();
        lock.unlock();
        {
          std::unique_lock fence(self_->mu);  // waits for the copies into this endpoint
          ++self_->fences[static_cast<LoopPeer*>(peer.get())->id];
        }
        sink_->OnPeerFenced(peer.get());
        lock.lock();
        continue;
      }
      if (queue_.empty()) return;  // stopping and drained
      PostRequest req = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      Status s = Execute(req);
      sink_->OnPostDone(req.token, std::move(s));
      lock.lock();
    }
  }

  Status Execute(const PostRequest& req) {
    auto* peer = static_cast<LoopPeer*>(req.peer.get());
    std::shared_ptr<Endpoint> target = peer->target.lock();
    if (!target) return PeerGone("loopback: endpoint " + std::to_string(peer->id) + " is gone");
    std::shared_lock lock(target->mu);
    if (!target->alive)
      return PeerGone("loopback: endpoint " + std::to_string(peer->id) + " is gone");
    if (auto f = target->fences.find(id_);
        f != target->fences.end() && f->second != peer->fence_epoch)
      return PeerGone("loopback: endpoint " + std::to_string(peer->id) + " fenced this connection");
    uint32_t key = UINT32_MAX;
    std::pair<uint8_t*, uint64_t> region{nullptr, 0};
    for (const XferOp& op : req.batch->ops) {
      if (req.control->aborted()) return Cancelled("loopback: aborted");
      uint32_t k = static_cast<const LoopRemoteRegion*>(op.remote)->key;
      if (k != key) {
        auto it = target->regions.find(k);
        if (it == target->regions.end())
          return NotFound("loopback: target has no region key " + std::to_string(k));
        key = k;
        region = it->second;
      }
      if (op.remote_addr > region.second || op.length > region.second - op.remote_addr)
        return OutOfRange("loopback: target-side bounds check failed");
      uint8_t* remote = region.first + op.remote_addr;
      auto* local = reinterpret_cast<uint8_t*>(op.local_addr);
      if (req.op == Op::kWrite) {
        std::memcpy(remote, local, op.length);
      } else {
        std::memcpy(local, remote, op.length);
      }
    }
    // Data is visible (same address space, memcpy done); the notification follows it.
    if (!req.notification.empty() && req.control->BeginNotify() && target->sink != nullptr)
      target->sink->OnMessage(req.notification);
    return Status::Ok();
  }

  BackendCaps caps_;
  std::shared_ptr<Endpoint> self_;
  uint64_t id_ = 0;
  uint32_t next_key_ = 1;  // guarded by self_->mu
  BackendSink* sink_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PostRequest> queue_;
  std::deque<std::shared_ptr<BackendPeer>> fenced_;  // fences to report (OnPeerFenced)
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Backend> MakeLoopbackBackend() {
  return std::make_unique<LoopbackBackend>();
}

}  // namespace kvpush::xfer
