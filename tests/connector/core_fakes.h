// Fakes for driving connector::TransferCore without processes, threads or sleeps: a peer
// directory whose peers a test adds, kills and removes, a CoreActions that records every action
// (and can refuse posts and sends), and a fixture with a ManualClock and a small patterned arena.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "connector/transfer_core.h"
#include "kv/block_checksum.h"

namespace kvpush::connector::test {

inline constexpr const char* kP = "prefill-0";
inline constexpr const char* kD = "decode-0";
inline constexpr const char* kD2 = "decode-1";

/// A valid transfer id (32 lowercase hex chars) numbered `n`.
inline std::string Tid(int n) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%032x", n);
  return buf;
}

class FakePeers final : public PeerDirectory {
 public:
  std::map<std::string, PeerView> peers;
  std::map<std::string, std::string> endpoints;  ///< "host:port" -> engine id
  std::map<std::string, std::string> failures;   ///< engine id -> why it is dead
  /// (engine id, connection) pairs whose fence the "transport" confirmed.
  std::set<std::pair<std::string, uint64_t>> fenced;

  std::optional<PeerView> Find(const std::string& id) const override {
    auto it = peers.find(id);
    if (it == peers.end()) return std::nullopt;
    return it->second;
  }
  std::string EngineIdAt(const std::string& host, int port) const override {
    auto it = endpoints.find(host + ":" + std::to_string(port));
    return it == endpoints.end() ? std::string() : it->second;
  }
  std::optional<std::string> Failure(const std::string& id) const override {
    auto it = failures.find(id);
    if (it != failures.end()) return it->second;
    if (peers.count(id) == 0) return "unknown peer";
    return std::nullopt;
  }
  bool Fenced(const std::string& id, uint64_t connection) const override {
    return fenced.count({id, connection}) != 0;
  }
};

/// One recorded action.
struct Action {
  enum Kind {
    kPost,
    kSend,
    kCancel,
    kRelease,
    kFinishLoad,
    kAbort,
    kHandRead,
    kFence,
    kQuery
  } kind;
  TransferToken token = 0;  ///< kFence: the connection fenced
  TransferOrder order;
  std::string peer;
  PdMessage msg;
  int64_t seq_id = 0;
  KvLoadResult load;
  PendingRead read;
  TransferStatusQuery query;  ///< kQuery (peer, host:port in `host` / `port`)
  std::string host;
  int port = 0;
};

class RecordingActions final : public CoreActions {
 public:
  std::vector<Action> log;
  Status post_error;  ///< not ok: PostTransfer fails with it
  Status send_error;  ///< not ok: SendMessage fails with it
  Status fence_error;  ///< not ok: FencePeer fails with it (after recording the request)
  TransferToken next_token = 100;

  Result<TransferToken> PostTransfer(const TransferOrder& order) override {
    if (!post_error.ok()) return post_error;
    Action a{Action::kPost};
    a.token = next_token++;
    a.order = order;
    a.peer = order.peer;
    if (!order.notification.empty()) {
      auto m = DecodeMessage(order.notification);
      if (m.ok()) a.msg = *m;
    }
    log.push_back(a);
    return a.token;
  }
  Result<TransferToken> SendMessage(const std::string& peer, const PdMessage& m) override {
    if (!send_error.ok()) return send_error;
    Action a{Action::kSend};
    a.token = next_token++;
    a.peer = peer;
    a.msg = m;
    log.push_back(a);
    return a.token;
  }
  void Cancel(TransferToken token) override {
    Action a{Action::kCancel};
    a.token = token;
    log.push_back(a);
  }
  void ReleaseBlocks(int64_t seq_id) override {
    Action a{Action::kRelease};
    a.seq_id = seq_id;
    log.push_back(a);
  }
  void FinishLoad(KvLoadResult result) override {
    Action a{Action::kFinishLoad};
    a.seq_id = result.seq_id;
    a.load = std::move(result);
    log.push_back(a);
  }
  void AbortRequest(int64_t seq_id) override {
    Action a{Action::kAbort};
    a.seq_id = seq_id;
    log.push_back(a);
  }
  void HandRead(PendingRead read) override {
    Action a{Action::kHandRead};
    a.seq_id = read.seq_id;
    a.read = std::move(read);
    log.push_back(a);
  }
  Status FencePeer(const std::string& peer, uint64_t connection, const std::string& why) override {
    Action a{Action::kFence};
    a.peer = peer;
    a.token = connection;
    a.msg.message = why;
    log.push_back(a);
    return fence_error;
  }
  void QueryTransferStatus(const std::string& peer, const std::string& host, int port,
                           TransferStatusQuery query) override {
    Action a{Action::kQuery};
    a.peer = peer;
    a.host = host;
    a.port = port;
    a.query = std::move(query);
    log.push_back(a);
  }

  std::vector<Action> Of(Action::Kind k) const {
    std::vector<Action> out;
    for (const auto& a : log) {
      if (a.kind == k) out.push_back(a);
    }
    return out;
  }
  /// Messages sent with `tag` (to anyone).
  std::vector<Action> Sent(MsgTag tag) const {
    std::vector<Action> out;
    for (const auto& a : log) {
      if (a.kind == Action::kSend && a.msg.tag == tag) out.push_back(a);
    }
    return out;
  }
  /// Messages with `tag` delivered to anyone: sent alone, or as the notification of a post.
  std::vector<Action> Delivered(MsgTag tag) const {
    std::vector<Action> out;
    for (const auto& a : log) {
      const bool carries =
          a.kind == Action::kSend || (a.kind == Action::kPost && !a.order.notification.empty());
      if (carries && a.msg.tag == tag) out.push_back(a);
    }
    return out;
  }
  size_t Count(Action::Kind k) const { return Of(k).size(); }
  void Clear() { log.clear(); }
};

/// A core with a 2-layer, 4-token-block, 16-block layout, a patterned arena, a ManualClock,
/// peers kP, kD, kD2 (16-block pools) and a recording action sink.
class CoreTest : public ::testing::Test {
 protected:
  CoreTest() {
    layout_.num_layers = 2;
    layout_.num_kv_heads = 1;
    layout_.head_dim = 4;
    layout_.block_size = 4;
    layout_.num_blocks = 16;
    arena_.resize(layout_.total_bytes());
    for (size_t i = 0; i < arena_.size(); ++i) arena_[i] = static_cast<std::byte>(i * 7 + 3);
    config_.lease = std::chrono::milliseconds(1000);
    config_.watchdog = std::chrono::milliseconds(500);
    config_.cancel_ack = std::chrono::milliseconds(200);
    config_.pull_profile = pd::PullProfile::kFast;
    config_.layerwise_min_bytes = 0;  // layer by layer at any size (its threshold: one test)
    peers_.peers[kP] = PeerView{16};
    peers_.peers[kD] = PeerView{16};
    peers_.peers[kD2] = PeerView{16};
    Rebuild();
  }

  /// Re-creates the core (after changing config_).
  void Rebuild() {
    core_ = std::make_unique<TransferCore>(config_, layout_, arena_, clock_, peers_, rec_);
  }

  /// Advances the clock and runs the timers.
  void Advance(std::chrono::milliseconds d) {
    clock_.Advance(d);
    core_->Tick();
  }

  // ---- producer (P) inputs ----
  void StartProducer(int64_t seq, const std::string& tid, pd::KvTransferParams::Mode mode,
                     int32_t n = 10, std::vector<BlockId> blocks = {1, 2, 3}) {
    ProducerStartEvent ev;
    ev.seq_id = seq;
    ev.params.role = pd::KvTransferParams::Role::kProducer;
    ev.params.mode = mode;
    ev.params.transfer_id = tid;
    ev.num_prompt_tokens = n;
    ev.prompt_hash = 0x1234 + static_cast<uint64_t>(n);
    ev.blocks = std::move(blocks);
    ev.first_token_binding = binding_;
    core_->HandleEvent(ev);
  }
  void FinishProducer(int64_t seq, bool ok = true, std::vector<BlockId> blocks = {1, 2, 3},
                      Status error = Status::Ok()) {
    ProducerDoneEvent ev;
    ev.seq_id = seq;
    ev.ok = ok;
    ev.token = TokenOutput{42, -0.5f, {{42, -0.5f}, {7, -1.5f}}};
    ev.error = std::move(error);
    ev.blocks = std::move(blocks);
    core_->HandleEvent(ev);
  }
  void Step(int64_t seq, int32_t end_pos, std::vector<BlockId> blocks = {1, 2, 3}) {
    StepEvent ev;
    ev.chunks.push_back(StepChunk{seq, end_pos, std::move(blocks)});
    core_->HandleEvent(ev);
  }
  void Layer(int32_t layer) {
    LayerEvent ev;
    ev.layer = layer;
    core_->HandleEvent(ev);
  }
  /// A PUSH_TARGET for a 10-token prompt (3 blocks) from `peer`.
  static PdMessage Target(const std::string& tid, uint32_t first_block = 0,
                          std::vector<int32_t> dst = {5, 6, 7}, uint32_t n = 10) {
    PdMessage m;
    m.tag = MsgTag::kPushTarget;
    m.transfer_id = tid;
    m.num_prompt_tokens = n;
    m.prompt_hash = 0x1234 + n;
    m.first_block = first_block;
    m.block_ids = std::move(dst);
    return m;
  }
  static PdMessage Signal(MsgTag tag, const std::string& tid) {
    PdMessage m;
    m.tag = tag;
    m.transfer_id = tid;
    return m;
  }
  static PdMessage Pin(const std::string& tid, uint32_t first = 0, uint32_t count = 3) {
    PdMessage m = Signal(MsgTag::kPin, tid);
    m.first_block = first;
    m.num_blocks = count;
    return m;
  }
  /// Encodes and hands `m` to the core. A PUSH_TARGET or PINNED without num_blocks is sent
  /// whole (num_blocks = its ids).
  void Deliver(const std::string& peer, PdMessage m) { DeliverOver(peer, std::move(m), 0); }
  /// Deliver, as arrived over the transport's connection `connection` to `peer`.
  void DeliverOver(const std::string& peer, PdMessage m, uint64_t connection) {
    const bool listed = m.tag == MsgTag::kPushTarget || m.tag == MsgTag::kPinned;
    if (listed && m.num_blocks == 0) m.num_blocks = static_cast<uint32_t>(m.block_ids.size());
    auto bytes = EncodeMessage(m);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    core_->HandleMessage(peer, *bytes, connection);
  }
  void Done(TransferToken t, bool ok = true) {
    xfer::TransferStatus s;
    s.state = ok ? xfer::TransferState::kDone : xfer::TransferState::kError;
    if (!ok) s.error = PeerGone("link down");
    core_->OnTransferDone(t, s);
  }
  /// Reports every outstanding transfer (WRITEs, READs, messages) done.
  void DrainAll(bool ok = true) {
    for (TransferToken t : core_->OutstandingTokens()) Done(t, ok);
  }
  /// Reports only the outstanding posts (WRITE/READ) done, not messages.
  void DrainPosts(bool ok = true) {
    for (const Action& a : rec_.Of(Action::kPost)) Done(a.token, ok);
  }

  /// FirstTokenBinding of the requests StartProducer / StartConsumer start, and of the KV_READY
  /// and PINNED this fixture makes.
  uint64_t binding_ = 0xb1d;
  /// P's HTTP address in the consumers StartConsumer starts (port 0: none given, no liveness
  /// query over HTTP).
  std::string consumer_host_;
  int consumer_port_ = 0;

  // ---- consumer (D) inputs ----
  void StartConsumer(int64_t seq, const std::string& tid, pd::KvTransferParams::Mode mode,
                     int32_t local = 0, int32_t external = 10, int32_t n = 10,
                     std::vector<BlockId> blocks = {8, 9, 10},
                     std::optional<pd::PullProfile> profile = std::nullopt) {
    ConsumerStartEvent ev;
    ev.seq_id = seq;
    ev.params.role = pd::KvTransferParams::Role::kConsumer;
    ev.params.mode = mode;
    ev.params.transfer_id = tid;
    ev.params.remote_engine_id = kP;
    ev.params.remote_host = consumer_host_;
    ev.params.remote_port = consumer_port_;
    ev.params.pull_profile = profile;
    ev.num_prompt_tokens = n;
    ev.prompt_hash = 0x1234 + static_cast<uint64_t>(n);
    ev.blocks = std::move(blocks);
    ev.local_tokens = local;
    ev.external_tokens = external;
    ev.arrival_ns = clock_.NowNanos();
    ev.first_token_binding = binding_;
    core_->HandleEvent(ev);
  }
  void AbortConsumer(int64_t seq, const std::string& tid) {
    ConsumerAbortEvent ev;
    ev.seq_id = seq;
    ev.transfer_id = tid;
    core_->HandleEvent(ev);
  }
  /// KV_READY whose digest matches this arena's blocks `blocks` (what D received).
  PdMessage KvReady(const std::string& tid, std::vector<BlockId> blocks = {8, 9, 10}) const {
    PdMessage m = Signal(MsgTag::kKvReady, tid);
    m.kv_digest = KvBlocksDigest(layout_, arena_, blocks);
    m.first_token_binding = binding_;
    m.token_id = 42;
    m.logprob = -0.5f;
    return m;
  }
  /// PINNED for a 10-token prompt: P's blocks `src`, digest over this arena's `digest_of`.
  PdMessage Pinned(const std::string& tid, std::vector<int32_t> src = {1, 2, 3},
                   std::vector<BlockId> digest_of = {8, 9, 10}) const {
    PdMessage m = Signal(MsgTag::kPinned, tid);
    m.num_prompt_tokens = 10;
    m.prompt_hash = 0x1234 + 10;
    m.first_token_binding = binding_;
    m.token_id = 42;
    m.logprob = -0.25f;
    m.first_block = 0;
    m.block_ids = std::move(src);
    m.kv_digest = KvBlocksDigest(layout_, arena_, digest_of);
    return m;
  }
  std::vector<KvLoadResult> Loads() const {
    std::vector<KvLoadResult> out;
    for (const auto& a : rec_.Of(Action::kFinishLoad)) out.push_back(a.load);
    return out;
  }

  KvLayout layout_;
  std::vector<std::byte> arena_;
  KvTransferConfig config_;
  ManualClock clock_;
  FakePeers peers_;
  RecordingActions rec_;
  std::unique_ptr<TransferCore> core_;
};

}  // namespace kvpush::connector::test
