// PdConnector, the shell: set-up, the handshake endpoint, the connector thread's loop and the
// CoreActions it carries out with the xfer::Agent. The engine-thread hooks are in
// pd_connector_hooks.cc; the protocol is TransferCore (transfer_core*.cc); the peers are
// PeerRegistry (peers.cc).
#include "connector/pd_connector.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/thread_name.h"
#include "pd/ids.h"
#include "xfer/backend_factory.h"

namespace kvpush::connector {

using namespace std::chrono_literals;

namespace {

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
  // Both sides of a P/D pair load each other's metadata (the handshake), which eager WRITEs need.
  ao.eager_write_max_bytes = cfg.eager_write_max_bytes;
  ao.on_event = [this] {
    {
      MutexLock lock(mu_);
      agent_event_ = true;
    }
    cv_.NotifyOne();
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
  if (!options_.auth_key_file.empty()) {
    KVP_ASSIGN_OR_RETURN(auth_, PeerAuth::FromKeyFile(options_.auth_key_file));
    auth_->set_self(agent_->name());
  }
  peers_ = std::make_unique<PeerRegistry>(*agent_, SelfInfo(), cfg.watchdog, auth_.get(),
                                          options_.api_key, options_.tls_ca_file);
  core_ = std::make_unique<TransferCore>(cfg, L, arena_, clock_, *peers_,
                                         static_cast<CoreActions&>(*this));
  core_->set_auth(auth_.get());
  status_client_ = std::make_unique<TransferStatusClient>(
      [this](const std::string& peer, const TransferStatusQuery& query,
             Result<TransferStatusAnswer> answer) {
        Push(TransferStatusEvent{peer, query, std::move(answer)});
      },
      options_.api_key, static_cast<int>(std::clamp<int64_t>(cfg.cancel_ack.count(), 500, 5000)));
  thread_ = std::thread([this] {
    SetThreadName("kvp-connector");
    Loop();
  });
  spdlog::info("kv connector: engine_id={} incarnation={:016x} {} layout: {}", agent_->name(),
               agent_->incarnation(), cfg.ToString(), L.ToString());
  return Status::Ok();
}

PdConnector::~PdConnector() {
  status_client_.reset();  // joins its thread, which pushes into the inbox
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  agent_.reset();  // before the arena it registered
  std::free(owned_arena_);
}

// ---------------------------------------------------------------------------------------------
// Handshake

uint64_t PdConnector::incarnation() const {
  return agent_->incarnation();
}

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

Result<nlohmann::json> PdConnector::HandleHandshake(const nlohmann::json& body,
                                                    const std::string& peer_addr) {
  return peers_->HandleHandshake(body, peer_addr);
}

Result<std::string> PdConnector::EnsurePeer(const std::string& host, int port,
                                            const std::function<bool()>& cancelled, bool https) {
  return peers_->EnsurePeer(host, port, HandshakeFlights::Clock::now() + options_.config.watchdog,
                            cancelled, https);
}

Status PdConnector::ValidateRequest(const pd::KvTransferParams& p,
                                    std::span<const int32_t> prompt, bool continuation) const {
  const KvRole mine = options_.config.role;
  const pd::InstanceFacts facts{continuation || mine != KvRole::kConsumer,
                                mine != KvRole::kProducer, options_.layout.block_size};
  std::optional<int32_t> peer_blocks;
  if (p.role == pd::KvTransferParams::Role::kConsumer &&
      p.mode == pd::KvTransferParams::Mode::kPull) {
    if (auto peer = peers_->Find(p.remote_engine_id)) peer_blocks = peer->num_blocks;
  }
  return pd::CheckLeg(p, facts, prompt, peer_blocks);
}

void PdConnector::AbortTransfer(const std::string& tid) {
  if (!pd::IsValidTransferId(tid)) return;
  Push(AbortTransferEvent{tid});
}

Result<nlohmann::json> PdConnector::HandleTransferStatus(const nlohmann::json& body) {
  if (auth_ != nullptr) {
    return FailedPrecondition(
        "/kv/transfer_status is not offered with --kv-auth-key-file (its answer would not be "
        "authenticated)");
  }
  KVP_ASSIGN_OR_RETURN(TransferStatusQuery query, TransferStatusQuery::FromJson(body));
  auto reply = std::make_shared<std::promise<TransferStatusAnswer>>();
  std::future<TransferStatusAnswer> answer = reply->get_future();
  {
    MutexLock lock(mu_);
    status_requests_.push_back(StatusRequest{std::move(query), std::move(reply)});
  }
  cv_.NotifyOne();
  if (answer.wait_for(2s) != std::future_status::ready) {
    return DeadlineExceeded("the connector did not answer within 2 s");
  }
  return answer.get().ToJson();
}

ConnectorStats PdConnector::stats() const {
  ConnectorStats s;
  {
    MutexLock lock(stats_mu_);
    s = published_;
    s.descriptors_posted += engine_descriptors_;
    s.transfer_ops_posted = transfer_ops_;
    s.control_messages_sent = control_messages_;
    s.control_bytes_sent = control_bytes_;
  }
  s.handshakes = peers_->handshakes();
  s.auth_enabled = auth_ != nullptr;
  if (auth_) s.auth_failures = auth_->failures();
  return s;
}

// ---------------------------------------------------------------------------------------------
// Connector thread: feeds the core, carries out its actions

void PdConnector::Loop() {
  std::vector<EngineEvent> events;
  std::vector<StatusRequest> status;
  while (true) {
    bool agent_event = false;
    {
      MutexLock lock(mu_);
      const bool busy = core_->busy();
      const auto deadline = std::chrono::steady_clock::now() + (busy ? 20ms : 1000ms);
      while (!stopping_ && inbox_.empty() && !agent_event_ && status_requests_.empty()) {
        if (!cv_.WaitUntil(lock, deadline)) break;
      }
      if (stopping_) break;
      events.swap(inbox_);
      status.swap(status_requests_);
      agent_event = std::exchange(agent_event_, false);
    }
    for (EngineEvent& ev : events) HandleEvent(std::move(ev));
    events.clear();
    for (StatusRequest& r : status) r.reply->set_value(core_->AnswerTransferStatus(r.query));
    status.clear();
    if (agent_event) {
      // The core authenticates them first when --kv-auth-key-file is set (set_auth).
      for (const xfer::Notification& n : agent_->TakeNotifications()) {
        core_->HandleMessage(n.peer, n.payload, n.connection);
      }
      PollTransfers();
    }
    core_->Tick();
    PublishStats();
    layer_events_wanted_.store(core_->wants_layer_events(), std::memory_order_relaxed);
    bool news = false;
    {
      MutexLock lock(out_mu_);
      news = !release_ids_.empty() || !loads_done_.empty() || !reads_to_post_.empty();
    }
    if (news && wake_engine_) wake_engine_();
  }
}

static_assert(std::tuple_size_v<decltype(ConnectorStats::auth_failures)> == kNumAuthFailures);

void PdConnector::HandleEvent(EngineEvent ev) {
  const auto* read = std::get_if<ReadPostedEvent>(&ev);
  const bool read_posted = read != nullptr;
  if (read_posted && !read->error.ok() && read->transfer != 0) {
    (void)agent_->ReleaseTransfer(HandleOf(read->transfer));  // created, but its post failed
  }
  // WRITEs that already ended let the rest go in one WRITE with KV_READY as its notification
  // (TransferCore::PostRest) instead of a KV_READY message after the last completion.
  if (std::holds_alternative<ProducerDoneEvent>(ev) && core_->busy()) PollTransfers();
  core_->HandleEvent(std::move(ev));
  if (read_posted) PollTransfers();  // the READ may already be done
}

void PdConnector::PollTransfers() {
  std::vector<std::pair<TransferToken, xfer::TransferStatus>> done;
  for (TransferToken token : core_->OutstandingTokens()) {
    const xfer::TransferHandle h = HandleOf(token);
    auto st = agent_->GetStatus(h);
    // A transfer ended early (cancelled, past the stall deadline, its peer dropped) is over for
    // the core only once the backend settled it: until then its bytes may still land.
    if (st.ok() && (st->state == xfer::TransferState::kInProgress || !st->settled)) continue;
    done.emplace_back(
        token, st.ok() ? *st : xfer::TransferStatus{xfer::TransferState::kError, st.status()});
    (void)agent_->ReleaseTransfer(h);
  }
  for (const auto& [token, status] : done) core_->OnTransferDone(token, status);
}

void PdConnector::PublishStats() {
  for (const HandoffRecord& r : core_->TakeFinishedRecords()) timelines_.Add(r);
  ConnectorStats s = core_->stats();
  MutexLock lock(stats_mu_);
  published_ = s;
}

Result<xfer::TransferHandle> PdConnector::CreateTransfer(const TransferOrder& order) {
  auto ps = peers_->Get(order.peer);
  if (!ps) return NotFound("no handshake with '" + order.peer + "'");
  xfer::TransferSpec spec;
  spec.op = order.op;
  spec.local = local_list_;
  spec.local_indices = order.local_indices;
  spec.remote = ps->remote_list;
  spec.remote_indices = order.remote_indices;
  if (auth_ != nullptr && !order.notification.empty()) {
    KVP_ASSIGN_OR_RETURN(spec.notification, auth_->Seal(order.peer, order.notification));
  } else {
    spec.notification = order.notification;
  }
  return agent_->CreateTransfer(spec);
}

Result<TransferToken> PdConnector::PostTransfer(const TransferOrder& order) {
  KVP_ASSIGN_OR_RETURN(xfer::TransferHandle t, CreateTransfer(order));
  const auto ops = agent_->TransferOpCount(t);
  if (Status st = agent_->Post(t); !st.ok()) {
    (void)agent_->ReleaseTransfer(t);
    return st;
  }
  MutexLock lock(stats_mu_);
  transfer_ops_ += ops.ok() ? static_cast<int64_t>(*ops) : 0;
  return t.packed();
}

Result<TransferToken> PdConnector::SendMessage(const std::string& peer, const PdMessage& m) {
  auto payload = EncodeMessage(m);
  if (!payload.ok()) {
    spdlog::error("kv connector: cannot encode a message for '{}': {}", peer,
                  payload.status().ToString());
    return payload.status();
  }
  if (auth_ != nullptr) {
    KVP_ASSIGN_OR_RETURN(*payload, auth_->Seal(peer, *payload));
  }
  KVP_ASSIGN_OR_RETURN(xfer::TransferHandle t, agent_->CreateNotification(peer, *payload));
  if (Status st = agent_->Post(t); !st.ok()) {
    (void)agent_->ReleaseTransfer(t);
    return st;
  }
  MutexLock lock(stats_mu_);
  ++control_messages_;
  control_bytes_ += static_cast<int64_t>(payload->size());
  return t.packed();
}

void PdConnector::Cancel(TransferToken token) {
  (void)agent_->Cancel(HandleOf(token));
}

void PdConnector::ReleaseBlocks(int64_t seq_id) {
  PublishStats();  // the engine may answer the request as soon as it sees this
  MutexLock lock(out_mu_);
  release_ids_.push_back(seq_id);
}

void PdConnector::FinishLoad(KvLoadResult result) {
  PublishStats();
  MutexLock lock(out_mu_);
  loads_done_.push_back(std::move(result));
}

void PdConnector::AbortRequest(int64_t seq_id) {
  if (abort_request_) abort_request_(seq_id);
}

void PdConnector::HandRead(PendingRead read) {
  PublishStats();
  MutexLock lock(out_mu_);
  reads_to_post_.push_back(std::move(read));
}

Status PdConnector::FencePeer(const std::string& peer, uint64_t connection,
                              const std::string& why) {
  return agent_->FencePeer(peer, connection, why);
}

void PdConnector::QueryTransferStatus(const std::string& peer, const std::string& host, int port,
                                      TransferStatusQuery query) {
  query.engine_id = agent_->name();
  status_client_->Ask(peer, host, port, std::move(query));
}

}  // namespace kvpush::connector
