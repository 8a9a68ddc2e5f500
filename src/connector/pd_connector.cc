// PdConnector: set-up, handshake, the engine-thread hooks and the connector thread's loop.
// The producer and consumer halves live in pd_connector_producer.cc / pd_connector_consumer.cc.
#include "connector/pd_connector.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "xfer/backend_factory.h"

namespace kvpush::connector {

using namespace std::chrono_literals;

namespace {

/// One descriptor per (layer, K|V, block) chunk of an arena laid out as `L` in `region`, in arena
/// order, so that entry index = offset / chunk_bytes (EntryIndex).
std::vector<xfer::Desc> ArenaChunkDescs(const KvLayout& L, xfer::RegionId region) {
  std::vector<xfer::Desc> descs;
  descs.reserve(static_cast<size_t>(L.num_layers) * 2 * static_cast<size_t>(L.num_blocks));
  for (int32_t layer = 0; layer < L.num_layers; ++layer) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      for (BlockId b = 0; b < L.num_blocks; ++b) {
        descs.push_back(xfer::Desc{region, L.offset(layer, kind, b), L.chunk_bytes()});
      }
    }
  }
  return descs;
}

/// XXH3 of a sequence's prompt tokens (the protocol's prompt_hash).
uint64_t PromptHashOf(const Sequence& seq) {
  return PromptHash(
      std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(seq.num_prompt_tokens)));
}

xfer::TransferHandle HandleOf(uint64_t packed) {
  xfer::TransferHandle h;
  static_cast<xfer::HandleBits&>(h) = xfer::HandleBits::Unpack(packed);
  return h;
}

}  // namespace

Result<std::unique_ptr<PdConnector>> PdConnector::Create(ConnectorOptions options) {
  // The connector moves whole chunks and never interprets their elements: any dtype works.
  KVP_RETURN_IF_ERROR(options.layout.Validate());
  std::unique_ptr<PdConnector> c(new PdConnector(std::move(options)));
  KVP_RETURN_IF_ERROR(c->Init());
  return c;
}

PdConnector::PdConnector(ConnectorOptions options) : options_(std::move(options)) {
  advertise_port_.store(options_.advertise_port);
}

Status PdConnector::Init() {
  const KvTransferConfig& cfg = options_.config;
  xfer::AgentOptions ao;
  if (cfg.engine_id.empty()) {
    std::random_device rd;
    char suffix[9];
    std::snprintf(suffix, sizeof(suffix), "%08x", rd());
    ao.name = options_.role_name + "-" + std::to_string(::getpid()) + "-" + suffix;
  } else {
    ao.name = cfg.engine_id;
  }
  ao.stall_timeout = cfg.stall;
  ao.on_event = [this] {
    {
      std::lock_guard lock(mu_);
      agent_event_ = true;
    }
    cv_.notify_one();
  };
  KVP_ASSIGN_OR_RETURN(auto backend, xfer::MakeBackend(cfg.backend));
  KVP_ASSIGN_OR_RETURN(agent_, xfer::Agent::Create(ao, std::move(backend)));
  const uint64_t bytes = options_.layout.total_bytes();
  if (agent_->backend_caps().allocates_for_one_sided) {
    KVP_ASSIGN_OR_RETURN(auto region, agent_->AllocateRegion(bytes, xfer::MemoryType::kHost));
    arena_region_ = region.id;
    arena_ = std::span<std::byte>(region.data, bytes);
  } else {
    const size_t aligned = (bytes + 4095) / 4096 * 4096;
    owned_arena_ = std::aligned_alloc(4096, aligned);
    if (owned_arena_ == nullptr) {
      return ResourceExhausted("PdConnector: cannot allocate the KV arena (" +
                               std::to_string(bytes) + " bytes)");
    }
    std::memset(owned_arena_, 0, aligned);
    KVP_ASSIGN_OR_RETURN(arena_region_,
                         agent_->RegisterRegion(owned_arena_, bytes, xfer::MemoryType::kHost));
    arena_ = std::span<std::byte>(static_cast<std::byte*>(owned_arena_), bytes);
  }
  const KvLayout& L = options_.layout;
  KVP_ASSIGN_OR_RETURN(local_list_, agent_->PrepareLocal(ArenaChunkDescs(L, arena_region_)));
  KVP_ASSIGN_OR_RETURN(agent_metadata_, agent_->ExportMetadata());
  thread_ = std::thread([this] { Loop(); });
  spdlog::info("kv connector: engine_id={} incarnation={:016x} {} layout: {}", agent_->name(),
               agent_->incarnation(), cfg.ToString(), L.ToString());
  return Status::Ok();
}

PdConnector::~PdConnector() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  agent_.reset();  // before the arena it registered
  std::free(owned_arena_);
}

uint32_t PdConnector::EntryIndex(int32_t num_blocks, int32_t layer, KvKind kind,
                                 BlockId block) const {
  return static_cast<uint32_t>((layer * 2 + static_cast<int32_t>(kind)) * num_blocks + block);
}

// ---------------------------------------------------------------------------------------------
// Handshake

HandshakeInfo PdConnector::SelfInfo() const {
  HandshakeInfo h;
  h.engine_id = agent_->name();
  h.incarnation = agent_->incarnation();
  h.role = options_.role_name;
  h.transfer_backend = options_.config.backend;
  h.model_fingerprint = options_.model_fingerprint;
  h.layout = options_.layout;
  h.kv_region_index = arena_region_.index;
  h.kv_region_generation = arena_region_.generation;
  h.lease_ms = options_.config.lease.count();
  h.watchdog_ms = options_.config.watchdog.count();
  h.agent_metadata = agent_metadata_;
  return h;
}

Status PdConnector::AdoptPeer(const HandshakeInfo& peer) {
  KVP_RETURN_IF_ERROR(CheckCompatible(SelfInfo(), peer));
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(peer.engine_id);
    if (it != peers_.end() && it->second.info.incarnation == peer.incarnation) {
      auto alive = agent_->GetPeer(peer.engine_id);
      if (alive.ok() && alive->alive) return Status::Ok();  // already known and healthy
    }
  }
  auto loaded = agent_->LoadRemoteMetadata(peer.agent_metadata);
  if (!loaded.ok()) {
    return Unavailable("loading the agent metadata of '" + peer.engine_id +
                       "': " + loaded.status().ToString());
  }
  xfer::RegionId rid;
  rid.index = peer.kv_region_index;
  rid.generation = peer.kv_region_generation;
  auto list = agent_->PrepareRemote(peer.engine_id, ArenaChunkDescs(peer.layout, rid));
  if (!list.ok()) {
    return Unavailable("preparing the KV region of '" + peer.engine_id +
                       "': " + list.status().ToString());
  }
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(peer.engine_id);
  if (it != peers_.end()) (void)agent_->ReleaseList(it->second.remote_list);
  peers_[peer.engine_id] = PeerState{peer, *list};
  if (loaded->restarted) {
    spdlog::warn("kv connector: peer '{}' restarted (incarnation {:016x} -> {:016x})",
                 peer.engine_id, loaded->previous_incarnation, peer.incarnation);
  } else {
    spdlog::info("kv connector: handshake with '{}' ({}, incarnation {:016x})", peer.engine_id,
                 peer.role, peer.incarnation);
  }
  std::lock_guard slock(stats_mu_);
  ++stats_.handshakes;
  return Status::Ok();
}

std::optional<PdConnector::PeerState> PdConnector::FindPeer(const std::string& engine_id) const {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(engine_id);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

Result<nlohmann::json> PdConnector::HandleHandshake(const nlohmann::json& body) {
  KVP_ASSIGN_OR_RETURN(HandshakeInfo peer, HandshakeInfo::FromJson(body));
  KVP_RETURN_IF_ERROR(AdoptPeer(peer));
  return SelfInfo().ToJson();
}

Result<std::string> PdConnector::EnsurePeer(const std::string& host, int port) {
  const std::string key = host + ":" + std::to_string(port);
  {
    std::lock_guard lock(peers_mu_);
    auto it = endpoints_.find(key);
    if (it != endpoints_.end()) {
      auto p = agent_->GetPeer(it->second);
      if (p.ok() && p->alive) return it->second;
    }
  }
  std::shared_ptr<std::mutex> endpoint_lock;
  {
    std::lock_guard lock(peers_mu_);
    auto& l = handshake_locks_[key];
    if (!l) l = std::make_shared<std::mutex>();
    endpoint_lock = l;
  }
  std::lock_guard hs(*endpoint_lock);
  {
    std::lock_guard lock(peers_mu_);  // another thread may have finished it meanwhile
    auto it = endpoints_.find(key);
    if (it != endpoints_.end()) {
      auto p = agent_->GetPeer(it->second);
      if (p.ok() && p->alive) return it->second;
    }
  }
  httplib::Client cli(host, port);
  cli.set_tcp_nodelay(true);
  cli.set_connection_timeout(2, 0);
  // A request whose handshake outlasts the watchdog would give up on its KV anyway.
  const auto read_ms = std::clamp<int64_t>(options_.config.watchdog.count(), 1000, 10000);
  cli.set_read_timeout(read_ms / 1000, (read_ms % 1000) * 1000);
  const std::string body = SelfInfo().ToJson().dump();
  auto res = cli.Post("/kv/handshake", body, "application/json");
  if (!res) {
    return Unavailable("handshake with " + key + " failed: " + httplib::to_string(res.error()));
  }
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status != 200) {
    std::string msg = res->body;
    if (!j.is_discarded() && j.contains("error") && j["error"].contains("message") &&
        j["error"]["message"].is_string()) {
      msg = j["error"]["message"].get<std::string>();
    }
    if (res->status == 409) return FailedPrecondition("peer " + key + " refused: " + msg);
    return Unavailable("handshake with " + key + ": HTTP " + std::to_string(res->status) + ": " +
                       msg);
  }
  if (j.is_discarded()) return Unavailable("handshake with " + key + ": answer is not JSON");
  auto peer = HandshakeInfo::FromJson(j);
  if (!peer.ok()) {
    return Unavailable("handshake with " + key + ": " + peer.status().message());
  }
  KVP_RETURN_IF_ERROR(AdoptPeer(*peer));
  std::lock_guard lock(peers_mu_);
  endpoints_[key] = peer->engine_id;
  return peer->engine_id;
}

Status PdConnector::ValidateRequest(const KvTransferParams& p,
                                    std::span<const int32_t> prompt) const {
  using Role = KvTransferParams::Role;
  if (p.role == Role::kNone) return Status::Ok();
  const KvRole mine = options_.config.role;
  if (p.role == Role::kProducer && mine == KvRole::kConsumer) {
    return InvalidArgument("kv_transfer_params.do_remote_decode: this is a decode instance");
  }
  if (p.role == Role::kConsumer && mine == KvRole::kProducer) {
    return InvalidArgument("kv_transfer_params.do_remote_prefill: this is a prefill instance");
  }
  if (!IsValidTransferId(p.transfer_id)) {
    return InvalidArgument("kv_transfer_params.transfer_id must be 32 lowercase hex characters");
  }
  if (p.role == Role::kConsumer && p.mode == KvTransferParams::Mode::kPull) {
    const auto n = static_cast<int32_t>(prompt.size());
    if (p.num_prompt_tokens != n) {
      return InvalidArgument("kv_transfer_params.num_prompt_tokens is " +
                             std::to_string(p.num_prompt_tokens) + " but the prompt has " +
                             std::to_string(n) + " tokens");
    }
    if (p.prompt_hash != PromptHash(prompt)) {
      return InvalidArgument("kv_transfer_params.prompt_hash does not match the prompt");
    }
    const int32_t bs = options_.layout.block_size;
    if (static_cast<int32_t>(p.remote_block_ids.size()) != (n + bs - 1) / bs) {
      return InvalidArgument("kv_transfer_params.remote_block_ids has " +
                             std::to_string(p.remote_block_ids.size()) + " blocks; " +
                             std::to_string((n + bs - 1) / bs) + " expected");
    }
    auto peer = FindPeer(p.remote_engine_id);
    if (!peer) {
      return InvalidArgument("kv_transfer_params.remote_engine_id '" + p.remote_engine_id +
                             "' is not the instance at remote_host:remote_port");
    }
    for (int32_t b : p.remote_block_ids) {
      if (b < 0 || b >= peer->info.layout.num_blocks) {
        return InvalidArgument("kv_transfer_params.remote_block_ids: block " + std::to_string(b) +
                               " is outside the peer's pool");
      }
    }
  }
  return Status::Ok();
}

void PdConnector::AbortTransfer(const std::string& tid) {
  if (!IsValidTransferId(tid)) return;
  Event ev;
  ev.kind = Event::kAbortTransfer;
  ev.params.transfer_id = tid;
  Push(std::move(ev));
}

ConnectorStats PdConnector::stats() const {
  std::lock_guard lock(stats_mu_);
  return stats_;
}

// ---------------------------------------------------------------------------------------------
// Engine-thread hooks

void PdConnector::BindEngine(std::function<void()> wake, std::function<void(int64_t)> abort) {
  wake_engine_ = std::move(wake);
  abort_request_ = std::move(abort);
}

void PdConnector::Push(Event ev) {
  {
    std::lock_guard lock(mu_);
    inbox_.push_back(std::move(ev));
  }
  cv_.notify_one();
}

KvMatch PdConnector::GetNumMatchedTokens(const Sequence& seq, int32_t local) {
  const KvTransferParams& p = seq.request.kv_transfer;
  if (p.role != KvTransferParams::Role::kConsumer) return {};
  const int32_t n = seq.num_prompt_tokens;
  const int32_t bs = options_.layout.block_size;
  const bool full_hit = local >= (n - 1) / bs * bs;
  if (p.mode == KvTransferParams::Mode::kPush) {
    if (full_hit) return {};  // compute the short tail here (OnBlocksAllocated tells P)
    return KvMatch{n - local, true};
  }
  const PullProfile profile = ResolvePullProfile(p);
  const bool take_first = profile == PullProfile::kFast && p.first_token_id >= 0;
  const int32_t external = take_first ? n - local : n - 1 - local;
  if (full_hit || external <= 0) return {};
  return KvMatch{external, true};
}

void PdConnector::OnBlocksAllocated(const Sequence& seq, std::span<const BlockId> blocks,
                                    int32_t num_external) {
  const KvTransferParams& p = seq.request.kv_transfer;
  using Role = KvTransferParams::Role;
  if (p.role == Role::kProducer) {
    Event ev;
    ev.kind = Event::kProducerStart;
    ev.seq_id = seq.seq_id;
    ev.params = p;
    ev.num_prompt_tokens = seq.num_prompt_tokens;
    ev.prompt_hash = PromptHashOf(seq);
    ev.blocks.assign(blocks.begin(), blocks.end());
    if (p.mode == KvTransferParams::Mode::kPush) push_producers_[seq.seq_id] = seq.num_prompt_tokens;
    Push(std::move(ev));
    return;
  }
  if (p.role != Role::kConsumer) return;
  const int32_t local = seq.num_computed;
  if (num_external == 0) {
    // Full prefix hit (or nothing to load): tell P it need not compute or send anything.
    Event ev;
    ev.kind = Event::kConsumerNotNeeded;
    ev.seq_id = seq.seq_id;
    ev.params = p;
    Push(std::move(ev));
    return;
  }
  ++engine_waiting_;
  consumers_engine_[seq.seq_id] = 1;
  Event ev;
  ev.kind = Event::kConsumerStart;
  ev.seq_id = seq.seq_id;
  ev.params = p;
  ev.num_prompt_tokens = seq.num_prompt_tokens;
  ev.prompt_hash = PromptHashOf(seq);
  ev.blocks.assign(blocks.begin(), blocks.end());
  ev.local_tokens = local;
  ev.external_tokens = num_external;
  ev.arrival_ns = seq.arrival_ns;
  Push(std::move(ev));
}

LayerObserver* PdConnector::BeginStep(std::span<const SequenceChunk> batch) {
  // vLLM's NixlConnector posts the READ from the engine (worker) thread in start_load_kv, right
  // before the next forward pass; the vllm profile does the same once P pinned the lease.
  std::vector<PendingRead> reads;
  {
    std::lock_guard lock(out_mu_);
    reads.swap(reads_to_post_);
  }
  for (PendingRead& r : reads) {
    // Finished (aborted) since the connector handed it over: its blocks are held until the
    // connector thread sees the abort, which it handles as "never posted".
    if (consumers_engine_.count(r.seq_id) == 0) continue;
    Event ev;
    ev.kind = Event::kReadPosted;
    ev.seq_id = r.seq_id;
    ev.params.transfer_id = r.tid;
    auto spec = BuildRead(r.peer, r.local, r.remote);
    if (!spec.ok()) {
      ev.error = spec.status();
    } else {
      auto t = agent_->CreateTransfer(*spec);
      if (!t.ok()) {
        ev.error = t.status();
      } else {
        ev.transfer = *t;
        const auto ops = agent_->TransferOpCount(*t);
        ev.error = agent_->Post(*t);
        if (ev.error.ok()) {
          std::lock_guard lock(stats_mu_);
          stats_.descriptors_posted += static_cast<int64_t>(spec->local_indices.size());
          stats_.transfer_ops_posted += ops.ok() ? static_cast<int64_t>(*ops) : 0;
        }
      }
    }
    Push(std::move(ev));
  }
  if (push_producers_.empty() || !options_.config.layerwise) return nullptr;
  Event ev;
  ev.kind = Event::kStep;
  for (const SequenceChunk& c : batch) {
    if (push_producers_.count(c.seq_id) == 0) continue;
    ev.chunks.push_back(StepChunk{c.seq_id, c.start_pos + static_cast<int32_t>(c.tokens.size()),
                                  std::vector<BlockId>(c.block_table.begin(),
                                                       c.block_table.end())});
  }
  if (ev.chunks.empty()) return nullptr;
  Push(std::move(ev));
  return this;
}

void PdConnector::OnLayerDone(int32_t layer) {
  Event ev;
  ev.kind = Event::kLayer;
  ev.layer = layer;
  Push(std::move(ev));
}

bool PdConnector::OnRequestFinished(const Sequence& seq, std::span<const BlockId> blocks,
                                    RequestOutput& out) {
  const KvTransferParams& p = seq.request.kv_transfer;
  using Role = KvTransferParams::Role;
  if (p.role == Role::kProducer) {
    push_producers_.erase(seq.seq_id);
    const bool ok = out.finish_reason == FinishReason::kStop ||
                    out.finish_reason == FinishReason::kLength;
    if (!seq.admitted_once) return false;  // never admitted: no blocks, nothing announced
    Event ev;
    ev.kind = Event::kProducerDone;
    ev.seq_id = seq.seq_id;
    ev.params = p;
    ev.ok = ok;
    ev.token = seq.last_token;
    ev.error = out.error;
    ev.blocks.assign(blocks.begin(), blocks.end());
    if (ok && p.mode == KvTransferParams::Mode::kPull) {
      nlohmann::json j;
      j["do_remote_prefill"] = true;
      j["do_remote_decode"] = false;
      j["transfer_mode"] = "pull";
      j["transfer_id"] = p.transfer_id;
      j["remote_request_id"] = p.transfer_id;
      j["remote_engine_id"] = agent_->name();
      j["remote_host"] = options_.advertise_host;
      j["remote_port"] = advertise_port_.load();
      j["remote_block_ids"] = std::vector<BlockId>(blocks.begin(), blocks.end());
      j["num_prompt_tokens"] = seq.num_prompt_tokens;
      j["prompt_hash"] = Hex64(PromptHashOf(seq));
      j["first_token_id"] = seq.last_token.id;
      j["first_token_logprob"] = seq.last_token.logprob;
      j["lease_ms"] = options_.config.lease.count();
      j["tp_size"] = 1;
      out.kv_transfer_params = j.dump();
    }
    ++engine_holds_;
    Push(std::move(ev));
    return true;
  }
  if (p.role == Role::kConsumer) {
    auto it = consumers_engine_.find(seq.seq_id);
    if (it == consumers_engine_.end()) return false;
    consumers_engine_.erase(it);
    if (seq.state != SequenceState::kWaitingForRemoteKv) return false;
    // Finished (aborted) while its K/V may still be landing: hold the blocks until the connector
    // thread knows no WRITE can land any more.
    --engine_waiting_;
    ++engine_holds_;
    Event ev;
    ev.kind = Event::kConsumerAbort;
    ev.seq_id = seq.seq_id;
    ev.params = p;
    Push(std::move(ev));
    return true;
  }
  return false;
}

void PdConnector::OnRequestRejected(const GenerationRequest& request) {
  const KvTransferParams& p = request.kv_transfer;
  if (!IsValidTransferId(p.transfer_id)) return;
  if (p.role == KvTransferParams::Role::kProducer) {
    // P refused its leg: a PUSH_TARGET that came (or comes) for it is refused at once, so D
    // does not wait out its watchdog.
    AbortTransfer(p.transfer_id);
    return;
  }
  if (p.role != KvTransferParams::Role::kConsumer) return;
  Event ev;
  ev.kind = Event::kConsumerRejected;
  ev.params = p;
  Push(std::move(ev));
}

std::vector<int64_t> PdConnector::GetFinished() {
  std::vector<int64_t> out;
  {
    std::lock_guard lock(out_mu_);
    out.swap(release_ids_);
  }
  engine_holds_ -= static_cast<int64_t>(out.size());
  return out;
}

std::vector<KvLoadResult> PdConnector::GetFinishedLoading() {
  std::vector<KvLoadResult> out;
  {
    std::lock_guard lock(out_mu_);
    out.swap(loads_done_);
  }
  for (const auto& r : out) {
    if (consumers_engine_.erase(r.seq_id) != 0) --engine_waiting_;
  }
  return out;
}

bool PdConnector::HasPendingWork() const {
  return engine_holds_ > 0 || engine_waiting_ > 0;
}

// ---------------------------------------------------------------------------------------------
// Connector thread

void PdConnector::Loop() {
  std::vector<Event> events;
  while (true) {
    bool agent_event = false;
    {
      std::unique_lock lock(mu_);
      const bool busy = !producers_.empty() || !consumers_.empty() || !pending_targets_.empty();
      cv_.wait_for(lock, busy ? 20ms : 1000ms,
                   [&] { return stopping_ || !inbox_.empty() || agent_event_; });
      if (stopping_) break;
      events.swap(inbox_);
      agent_event = std::exchange(agent_event_, false);
    }
    for (Event& ev : events) HandleEvent(ev);
    events.clear();
    if (agent_event) {
      for (const xfer::Notification& n : agent_->TakeNotifications()) HandleMessage(n);
      PollTransfers();
    }
    Timers();
    bool news = false;
    {
      std::lock_guard lock(out_mu_);
      news = !release_ids_.empty() || !loads_done_.empty() || !reads_to_post_.empty();
    }
    if (news && wake_engine_) wake_engine_();
    {
      std::lock_guard lock(stats_mu_);
      stats_.producers_active = static_cast<int64_t>(producers_.size());
      stats_.consumers_waiting = static_cast<int64_t>(consumers_.size());
    }
  }
}

void PdConnector::HandleEvent(Event& ev) {
  switch (ev.kind) {
    case Event::kProducerStart:
      OnProducerStart(ev);
      break;
    case Event::kStep:
      OnStep(ev);
      break;
    case Event::kLayer:
      OnLayer(ev.layer);
      break;
    case Event::kProducerDone:
      OnProducerDone(ev);
      break;
    case Event::kConsumerStart:
    case Event::kReadPosted:
      OnConsumerStart(ev);
      break;
    case Event::kConsumerNotNeeded:
    case Event::kConsumerRejected: {
      // Nothing will be read or targeted: P may drop the prefill (push) or free the lease (pull).
      const bool pull = ev.params.mode == KvTransferParams::Mode::kPull;
      const bool rejected = ev.kind == Event::kConsumerRejected;
      std::string peer = ev.params.remote_engine_id;
      if (peer.empty()) {
        std::lock_guard lock(peers_mu_);
        auto it = endpoints_.find(ev.params.remote_host + ":" +
                                  std::to_string(ev.params.remote_port));
        if (it != endpoints_.end()) peer = it->second;
      }
      if (!peer.empty() && FindPeer(peer)) {
        if (pull) {
          SendSignal(peer, MsgTag::kRelease, ev.params.transfer_id);
        } else if (rejected) {
          SendFailure(peer, ev.params.transfer_id, StatusCode::kFailedPrecondition,
                      "the decode instance refused the request");
        } else {
          SendSignal(peer, MsgTag::kNotNeeded, ev.params.transfer_id);
        }
      }
      if (!rejected) {
        std::lock_guard lock(stats_mu_);
        ++stats_.not_needed;
      }
      break;
    }
    case Event::kConsumerAbort:
      OnConsumerAbort(ev);
      break;
    case Event::kAbortTransfer:
      OnAbortTransfer(ev.params.transfer_id);
      break;
  }
}

void PdConnector::HandleMessage(const xfer::Notification& n) {
  auto m = DecodeMessage(n.payload);
  if (!m.ok()) {
    spdlog::warn("kv connector: dropped a malformed message from '{}': {}", n.peer,
                 m.status().message());
    std::lock_guard lock(stats_mu_);
    ++stats_.bad_messages;
    return;
  }
  switch (m->tag) {
    case MsgTag::kPushTarget:
    case MsgTag::kNotNeeded:
    case MsgTag::kCancel:
    case MsgTag::kRelease:
    case MsgTag::kPin:
      OnProducerMessage(n.peer, *m);
      break;
    case MsgTag::kKvReady:
    case MsgTag::kCancelAck:
    case MsgTag::kPinned:
    case MsgTag::kLayerReady:
      OnConsumerMessage(n.peer, *m);
      break;
    case MsgTag::kTransferFailed:
      // Either side may send it: route by who knows the transfer id.
      if (consumers_.count(m->transfer_id) != 0) {
        OnConsumerMessage(n.peer, *m);
      } else {
        OnProducerMessage(n.peer, *m);
      }
      break;
  }
}

bool PdConnector::PostTracked(const xfer::TransferSpec& spec, const std::string& tid,
                              XferKind kind, uint64_t bytes, Status* error) {
  auto t = agent_->CreateTransfer(spec);
  if (!t.ok()) {
    *error = t.status();
    return false;
  }
  const auto ops = agent_->TransferOpCount(*t);
  Status st = agent_->Post(*t);
  if (!st.ok()) {
    (void)agent_->ReleaseTransfer(*t);
    *error = st;
    return false;
  }
  outstanding_[t->packed()] = Outstanding{tid, kind, bytes};
  if (kind == XferKind::kWrite || kind == XferKind::kRead) {
    std::lock_guard lock(stats_mu_);
    stats_.descriptors_posted += static_cast<int64_t>(spec.local_indices.size());
    stats_.transfer_ops_posted += ops.ok() ? static_cast<int64_t>(*ops) : 0;
  }
  return true;
}

void PdConnector::SendMessage(const std::string& peer, const PdMessage& m) {
  if (!IsValidTransferId(m.transfer_id)) return;  // a locally dropped duplicate: nobody to tell
  auto payload = EncodeMessage(m);
  if (!payload.ok()) {
    spdlog::error("kv connector: cannot encode a message for '{}': {}", peer,
                  payload.status().ToString());
    return;
  }
  auto t = agent_->CreateNotification(peer, *payload);
  if (!t.ok()) {
    spdlog::warn("kv connector: cannot send to '{}': {}", peer, t.status().ToString());
    return;
  }
  if (Status st = agent_->Post(*t); !st.ok()) {
    spdlog::warn("kv connector: cannot send to '{}': {}", peer, st.ToString());
    (void)agent_->ReleaseTransfer(*t);
    return;
  }
  outstanding_[t->packed()] = Outstanding{m.transfer_id, XferKind::kMessage, 0};
}

void PdConnector::SendSignal(const std::string& peer, MsgTag tag, const std::string& tid) {
  PdMessage m;
  m.tag = tag;
  m.transfer_id = tid;
  SendMessage(peer, m);
}

void PdConnector::SendFailure(const std::string& peer, const std::string& tid, StatusCode code,
                              const std::string& why) {
  PdMessage m;
  m.tag = MsgTag::kTransferFailed;
  m.transfer_id = tid;
  m.code = static_cast<uint8_t>(code);
  m.message = why;
  SendMessage(peer, m);
}

void PdConnector::CancelOutstanding(const std::string& tid, XferKind kind) {
  for (const auto& [h, o] : outstanding_) {
    if (o.tid == tid && o.kind == kind) (void)agent_->Cancel(HandleOf(h));
  }
}

PullProfile PdConnector::ResolvePullProfile(const KvTransferParams& p) const {
  return p.pull_profile < 0 ? options_.config.pull_profile
                            : static_cast<PullProfile>(p.pull_profile);
}

void PdConnector::PollTransfers() {
  std::vector<std::pair<Outstanding, xfer::TransferStatus>> done;
  for (auto it = outstanding_.begin(); it != outstanding_.end();) {
    const xfer::TransferHandle h = HandleOf(it->first);
    auto st = agent_->GetStatus(h);
    if (st.ok() && st->state == xfer::TransferState::kInProgress) {
      ++it;
      continue;
    }
    xfer::TransferStatus s =
        st.ok() ? *st : xfer::TransferStatus{xfer::TransferState::kError, st.status()};
    done.emplace_back(std::move(it->second), std::move(s));
    (void)agent_->ReleaseTransfer(h);
    it = outstanding_.erase(it);
  }
  for (auto& [o, s] : done) {
    if (s.state != xfer::TransferState::kDone) {
      std::lock_guard lock(stats_mu_);
      ++stats_.transfers_failed;
    }
    switch (o.kind) {
      case XferKind::kWrite:
      case XferKind::kReady:
        OnProducerTransferDone(o, s);
        break;
      case XferKind::kRead:
        OnConsumerTransferDone(o, s);
        break;
      case XferKind::kMessage:
        if (s.state != xfer::TransferState::kDone) {
          spdlog::warn("kv connector: message for transfer {} failed: {}", o.tid,
                       s.error.ToString());
          // A PUSH_TARGET that could not be delivered fails its consumer at once.
          auto c = consumers_.find(o.tid);
          if (c != consumers_.end()) {
            CompleteConsumer(c->second,
                             PeerGone("could not reach the prefill instance: " + s.error.ToString()),
                             std::nullopt);
          }
        }
        break;
    }
  }
}

void PdConnector::Tombstone(const std::string& tid) {
  const TimePoint until = SteadyClock::now() + std::max<std::chrono::milliseconds>(
                                                   options_.config.lease * 2, 60s);
  if (tombstones_.emplace(tid, until).second) tombstone_order_.emplace_back(until, tid);
}

bool PdConnector::IsTombstoned(const std::string& tid) const {
  return tombstones_.count(tid) != 0;
}

void PdConnector::Timers() {
  const TimePoint now = SteadyClock::now();
  if (now < next_timer_check_) return;
  next_timer_check_ = now + 10ms;
  while (!tombstone_order_.empty() && tombstone_order_.front().first <= now) {
    tombstones_.erase(tombstone_order_.front().second);
    tombstone_order_.pop_front();
  }
  for (auto it = pending_targets_.begin(); it != pending_targets_.end();) {
    if (it->second.expiry > now) {
      ++it;
      continue;
    }
    SendFailure(it->second.peer, it->first, StatusCode::kDeadlineExceeded,
                "the prefill request for this transfer never arrived at P");
    Tombstone(it->first);
    it = pending_targets_.erase(it);
  }
  // Producers: leases.
  std::vector<std::string> expired;
  for (auto& [tid, p] : producers_) {
    if (p.finished && !p.released && p.lease_deadline <= now && p.outstanding == 0) {
      expired.push_back(tid);
    }
  }
  for (const auto& tid : expired) {
    Producer& p = producers_.at(tid);
    spdlog::warn("kv connector: lease of transfer {} expired after {} ms; blocks freed", tid,
                 options_.config.lease.count());
    {
      std::lock_guard lock(stats_mu_);
      ++stats_.leases_expired;
    }
    DropProducer(p, DeadlineExceeded("lease expired"), p.has_target);
  }
  // Consumers: watchdog and peer liveness.
  std::vector<std::string> ids;
  for (auto& [tid, c] : consumers_) ids.push_back(tid);
  for (const auto& tid : ids) {
    auto it = consumers_.find(tid);
    if (it == consumers_.end()) continue;
    Consumer& c = it->second;
    auto peer = agent_->GetPeer(c.peer);
    const bool dead = !peer.ok() || !peer->alive;
    if (dead) {
      {
        std::lock_guard lock(stats_mu_);
        ++stats_.transfers_failed;
      }
      CompleteConsumer(c,
                       PeerGone("prefill instance '" + c.peer + "' failed: " +
                                (peer.ok() ? peer->failure.ToString() : peer.status().ToString())),
                       std::nullopt);
      continue;
    }
    if (!c.cancelling && now >= c.deadline) {
      {
        std::lock_guard lock(stats_mu_);
        ++stats_.watchdog_expired;
      }
      spdlog::warn("kv connector: KV of transfer {} did not arrive within {} ms", tid,
                   options_.config.watchdog.count());
      if (c.mode == KvTransferParams::Mode::kPush) {
        SendSignal(c.peer, MsgTag::kCancel, tid);
      } else if (!c.read_posted && !c.read_handed) {
        // Pull, no READ yet (P never answered the PIN): nothing can land.
        CompleteConsumer(c,
                         DeadlineExceeded("the prefill instance did not confirm the lease within " +
                                          std::to_string(options_.config.watchdog.count()) +
                                          " ms"),
                         std::nullopt);
        continue;
      } else {
        CancelOutstanding(tid, XferKind::kRead);  // pull: the READ is ours to end
      }
      c.cancelling = true;
      c.cancel_deadline = now + options_.config.cancel_ack;
      continue;
    }
    if (c.cancelling && now >= c.cancel_deadline) {
      // P did not acknowledge: drop the peer so no more of its WRITEs are accepted.
      (void)agent_->InvalidatePeer(c.peer, "no CANCEL_ACK within cancel_ack_ms");
      CompleteConsumer(c,
                       DeadlineExceeded("KV did not arrive within " +
                                        std::to_string(options_.config.watchdog.count()) +
                                        " ms and the prefill instance did not answer the cancel"),
                       std::nullopt);
    }
  }
}

}  // namespace kvpush::connector
