#include "engine/engine_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/clock.h"
#include "common/log.h"
#include "engine/continuation.h"

namespace kvpush {

namespace {

/// Per step, the logits kept for prompt logprobs (a [rows, vocab] f32 block) stay under this many
/// bytes: the scheduler computes at most this / (vocab * 4) prompt-logprobs tokens per step.
constexpr int64_t kPromptLogitsBytes = int64_t{64} << 20;

int32_t PromptLogitRows(int32_t vocab_size) {
  const int64_t per_row = int64_t{std::max(vocab_size, 1)} * static_cast<int64_t>(sizeof(float));
  return static_cast<int32_t>(std::clamp<int64_t>(kPromptLogitsBytes / per_row, 1, 1 << 20));
}

}  // namespace

Status ValidateRequest(const EngineConfig& config, const ModelConfig& model,
                       const GenerationRequest& request) {
  const auto& prompt = request.prompt_tokens;
  if (prompt.empty()) return InvalidArgument("prompt is empty");
  KVP_RETURN_IF_ERROR(TokensInVocabulary(prompt, model.vocab_size, "prompt token id"));
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n + 1 > config.max_model_len) {
    return InvalidArgument(
        "prompt has " + std::to_string(n) + " tokens; the maximum context length is " +
        std::to_string(config.max_model_len) + " tokens including at least one generated token");
  }
  if (request.max_tokens < 1) return InvalidArgument("max_tokens must be >= 1");
  if (request.min_tokens < 0 || request.min_tokens > request.max_tokens) {
    return InvalidArgument(
        "min_tokens must be in [0, max_tokens = " + std::to_string(request.max_tokens) + "], got " +
        std::to_string(request.min_tokens));
  }
  KVP_RETURN_IF_ERROR(request.sampling.Validate());
  if (request.prompt_logprobs < -1) {
    return InvalidArgument("prompt_logprobs must be >= 0, got " +
                           std::to_string(request.prompt_logprobs));
  }
  if (request.prompt_logprobs >= 0 &&
      request.kv_transfer.role == pd::KvTransferParams::Role::kConsumer) {
    return InvalidArgument(
        "prompt logprobs are computed by the prefill instance; a P/D decode request cannot "
        "compute them (its prompt's KV comes from P)");
  }
  for (const auto& [t, bias] : request.sampling.logit_bias) {
    if (t >= model.vocab_size) {
      return InvalidArgument("logit_bias token id " + std::to_string(t) +
                             " is outside the vocabulary [0, " + std::to_string(model.vocab_size) +
                             ")");
    }
  }
  for (int32_t t : request.stop_token_ids) {
    if (t < 0 || t >= model.vocab_size) {
      return InvalidArgument("stop token id " + std::to_string(t) + " is outside the vocabulary");
    }
  }
  const int32_t first = request.kv_transfer.first_token_id;
  if (first < -1 || first >= model.vocab_size) {
    return InvalidArgument("kv_transfer_params.first_token_id " + std::to_string(first) +
                           " is outside the vocabulary [0, " + std::to_string(model.vocab_size) +
                           ")");
  }
  KVP_RETURN_IF_ERROR(ValidateResume(config, model, request));
  const int64_t total = std::min<int64_t>(n + request.max_tokens, config.max_model_len);
  const int64_t blocks = (total + config.block_size - 1) / config.block_size;
  if (blocks > config.num_kv_blocks) {
    return ResourceExhausted("request needs " + std::to_string(blocks) + " KV blocks (" +
                             std::to_string(total) + " tokens) but the KV cache has only " +
                             std::to_string(config.num_kv_blocks) + " blocks");
  }
  return Status::Ok();
}

Result<std::unique_ptr<EngineCore>> EngineCore::Create(const EngineConfig& config,
                                                       std::unique_ptr<Executor> executor,
                                                       const Tokenizer& tokenizer,
                                                       KvConnector* connector,
                                                       std::span<std::byte> kv_memory) {
  KVP_RETURN_IF_ERROR(config.Validate());
  if (executor == nullptr) return InvalidArgument("EngineCore: no executor");
  if (config.num_kv_blocks < 1 || config.max_model_len < 2) {
    return InvalidArgument("EngineCore: config not resolved (num_kv_blocks, max_model_len)");
  }
  const KvLayout layout = LayoutFor(config, executor->config());
  std::unique_ptr<KvCache> kv;
  if (kv_memory.empty()) {
    KVP_ASSIGN_OR_RETURN(kv, KvCache::Create(layout));
  } else {
    KVP_ASSIGN_OR_RETURN(kv, KvCache::Wrap(layout, kv_memory));
  }
  return std::unique_ptr<EngineCore>(
      new EngineCore(config, std::move(executor), std::move(kv), tokenizer, connector));
}

KvLayout EngineCore::LayoutFor(const EngineConfig& config, const ModelConfig& m) {
  return KvLayout{m.num_layers,      m.num_kv_heads,       m.head_dim,
                  config.block_size, config.num_kv_blocks, m.kv_dtype};
}

EngineCore::EngineCore(const EngineConfig& config, std::unique_ptr<Executor> executor,
                       std::unique_ptr<KvCache> kv, const Tokenizer& tokenizer,
                       KvConnector* connector)
    : config_(config),
      executor_(std::move(executor)),
      kv_(std::move(kv)),
      tokenizer_(tokenizer),
      connector_(connector),
      pool_(BlockPool::Options{config.num_kv_blocks, config.block_size,
                               config.enable_prefix_caching, executor_->config().fingerprint,
                               config.scatter_kv_blocks}),
      scheduler_(config_, pool_, connector, PromptLogitRows(executor_->config().vocab_size)) {
  stats_.num_kv_blocks_total = config.num_kv_blocks;
  stats_.block_size = config.block_size;
  stats_.prefix_caching_enabled = config.enable_prefix_caching;
  const std::vector<double> token_bounds = Histogram::OneTwoFiveBounds(config.max_model_len);
  stats_.request_prompt_tokens = Histogram(token_bounds);
  stats_.request_generation_tokens = Histogram(token_bounds);
  stats_.request_prefill_kv_computed_tokens = Histogram(token_bounds);
}

void EngineCore::AddRequest(int64_t seq_id, GenerationRequest request,
                            std::shared_ptr<OutputChannel> channel, int64_t arrival_ns) {
  ++stats_.requests_received;
  Status st = ValidateRequest(config_, model_config(), request);
  if (st.ok() && seqs_.count(seq_id) != 0) {
    st = AlreadyExists("engine request id " + std::to_string(seq_id) + " is in use");
  }
  if (!st.ok()) return Refuse(request, channel, std::move(st));
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = seq_id;
  seq->channel = std::move(channel);
  seq->tokens = request.prompt_tokens;
  seq->num_prompt_tokens = seq->num_tokens();
  seq->max_output_tokens = std::min(request.max_tokens, config_.max_model_len - seq->num_tokens());
  // Room for every output token now, at arrival: growing the vector at the first token copied
  // the whole prompt on the TTFT path (0.54 ms measured at 131,000 tokens; P and D each paid it).
  seq->tokens.reserve(static_cast<size_t>(seq->num_tokens()) +
                      static_cast<size_t>(std::max(0, seq->max_output_tokens)));
  seq->arrival_ns = arrival_ns;
  seq->text = std::make_unique<OutputTextProcessor>(tokenizer_, request.stop, seq->tokens);
  if (!request.resume_output_tokens.empty()) {
    if (Status rs = ReplayResumed(*seq, request); !rs.ok()) {
      return Refuse(request, seq->channel, std::move(rs));
    }
  }
  if (request.prompt_logprobs >= 0) {
    seq->prompt_logprobs.resize(static_cast<size_t>(seq->num_prompt_tokens - 1));
  }
  seq->request = std::move(request);
  stats_.prompt_tokens += seq->num_prompt_tokens;
  Sequence* raw = seq.get();
  seqs_.emplace(seq_id, std::move(seq));
  scheduler_.AddWaiting(raw);
}

void EngineCore::Refuse(const GenerationRequest& request,
                        const std::shared_ptr<OutputChannel>& channel, Status error) {
  if (connector_ != nullptr) connector_->OnRequestRejected(request);
  RequestOutput out;
  out.finish_reason = FinishReason::kError;
  out.error = std::move(error);
  out.num_prompt_tokens = static_cast<int32_t>(request.prompt_tokens.size());
  ++stats_.finished_by_reason[static_cast<size_t>(FinishReason::kError)];
  Emit(channel, std::move(out));
}

Status EngineCore::ReplayResumed(Sequence& seq, const GenerationRequest& request) const {
  KVP_RETURN_IF_ERROR(ReplayResumedOutput(request, model_config().eos_id, *seq.text));
  seq.tokens.insert(seq.tokens.end(), request.resume_output_tokens.begin(),
                    request.resume_output_tokens.end());
  return Status::Ok();
}

void EngineCore::Abort(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  Finish(*it->second, FinishReason::kAbort, Aborted("request aborted"), {}, {});
}

Result<int32_t> EngineCore::ResetPrefixCache() {
  const BlockPool::Stats s = pool_.stats();
  if (s.num_used > 0) {
    return FailedPrecondition(std::to_string(s.num_used) +
                              " KV blocks are in use (running or waiting requests, or KV held "
                              "for a peer); the prefix cache was not reset");
  }
  pool_.ResetPrefixCache();
  return s.num_cached;
}

void EngineCore::AbortAll(const std::string& reason) {
  std::vector<int64_t> ids;
  ids.reserve(seqs_.size());
  for (const auto& [id, seq] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) Finish(*seqs_.at(id), FinishReason::kAbort, Aborted(reason), {}, {});
}

bool EngineCore::HasWork() const {
  return !seqs_.empty() || !held_blocks_.empty() ||
         (connector_ != nullptr && connector_->HasPendingWork());
}

void EngineCore::ApplyKvLoads() {
  if (connector_ == nullptr) return;
  for (KvLoadResult& r : connector_->GetFinishedLoading()) {
    auto it = seqs_.find(r.seq_id);
    if (it == seqs_.end()) continue;  // finished meanwhile (abort): its blocks went the held way
    Sequence& seq = *it->second;
    if (seq.state != SequenceState::kWaitingForRemoteKv) continue;
    const int32_t local = seq.num_computed;
    if (r.status.ok() && r.first_token &&
        (r.first_token->id < 0 || r.first_token->id >= model_config().vocab_size)) {
      // A peer's token id reaches the executor only if it is a token of this model.
      r.status = DataLoss("the prefill instance sent first token id " +
                          std::to_string(r.first_token->id) + ", outside the vocabulary");
    }
    if (!r.status.ok() && r.quarantined) QuarantineLoadBlocks(seq);
    if (!r.status.ok() && !r.recompute) {
      Finish(seq, FinishReason::kError, r.status, {}, {});
      continue;
    }
    if (!r.status.ok()) {
      LogRequestScope scope(seq.request.request_id);
      spdlog::warn("request {}: KV load failed ({}); recomputing the prompt locally",
                   seq.request.request_id, r.status.ToString());
      ++stats_.kv_load_recomputes;
      scheduler_.OnKvLoaded(seq, local);
      continue;
    }
    ++stats_.kv_loads;
    stats_.prompt_tokens_transferred += seq.num_external_tokens;
    seq.num_transferred_tokens = seq.num_external_tokens;
    int32_t loaded = local + seq.num_external_tokens;
    // The KV of every prompt token came but no first token (P sampled it under other settings
    // than this request's): the last prompt token is computed here, over its own KV, for its
    // logits.
    if (!r.first_token && loaded == seq.num_tokens()) --loaded;
    scheduler_.OnKvLoaded(seq, loaded);
    // Its full blocks enter the prefix cache after the first token is out (CommitLoadedBlocks):
    // hashing them is O(prompt) on the TTFT path (0.3 ms at 131,000 tokens).
    loaded_.push_back(seq.seq_id);
    if (r.first_token && seq.num_computed == seq.num_tokens()) {
      CountAdmission(seq);  // never scheduled for compute: its admission is counted here
      ProcessSampled(seq, std::move(*r.first_token));
    }
  }
}

void EngineCore::QuarantineLoadBlocks(Sequence& seq) {
  // The blocks after the local prefix-cache hit were announced to the peer (or read into) and
  // may still be written: they leave the request, uncommitted, and wait for the connector's
  // GetFinished. The request keeps its cached prefix; the scheduler allocates fresh blocks for
  // the rest when it computes it.
  const auto keep = static_cast<size_t>(seq.num_computed / pool_.block_size());
  if (seq.blocks.size() <= keep) return;
  std::vector<BlockId>& held = held_blocks_[seq.seq_id];
  held.insert(held.end(), seq.blocks.begin() + static_cast<std::ptrdiff_t>(keep), seq.blocks.end());
  seq.blocks.resize(keep);
  ++stats_.kv_load_quarantines;
}

void EngineCore::ReleaseHeldBlocks(const std::vector<int64_t>& finished) {
  for (int64_t id : finished) {
    auto it = held_blocks_.find(id);
    if (it == held_blocks_.end()) continue;
    pool_.Release(it->second);
    held_blocks_.erase(it);
  }
}

void EngineCore::PollConnector() {
  if (connector_ == nullptr) return;
  // Order matters. The connector reports a quarantined load (GetFinishedLoading; ApplyKvLoads
  // moves its blocks into held_blocks_) before the quarantine's end (GetFinished). Taking the
  // ends first and applying the loads before releasing means every end taken here finds its
  // held blocks, even when both were reported since the last poll. Released before the loads
  // were applied, such an end found nothing to release, and the blocks stayed held for ever
  // (3 blocks of a decode instance, once, in chaos_stopped_prefill_push).
  const std::vector<int64_t> finished = connector_->GetFinished();
  ApplyKvLoads();
  ReleaseHeldBlocks(finished);
}

void EngineCore::CommitLoadedBlocks() {
  for (int64_t id : loaded_) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) scheduler_.CommitFullBlocks(*it->second);
  }
  loaded_.clear();
}

int32_t EngineCore::Step() {
  PollConnector();
  CommitLoadedBlocks();  // before anything is scheduled: admission sees them cached
  std::vector<ScheduledChunk> chunks = scheduler_.Schedule();
  stats_.num_preemptions = scheduler_.num_preemptions();
  if (chunks.empty()) {
    // No forward pass, but the connector may have work queued for "before the next forward
    // pass" (e.g. a pull READ posted from the engine thread): give it its hook now.
    if (connector_ != nullptr) (void)connector_->BeginStep({});
    return 0;
  }

  batch_.clear();
  batch_seqs_.clear();
  size_t num_logits = 0;
  int32_t total = 0;
  for (const ScheduledChunk& c : chunks) {
    Sequence& seq = *c.seq;
    CountAdmission(seq);
    SequenceChunk chunk;
    chunk.seq_id = seq.seq_id;
    chunk.tokens = std::span<const int32_t>(seq.tokens.data() + seq.num_computed,
                                            static_cast<size_t>(c.num_tokens));
    chunk.start_pos = seq.num_computed;
    chunk.block_table = seq.blocks;
    chunk.want_logits = seq.num_computed + c.num_tokens == seq.num_tokens();
    chunk.all_logits = seq.wants_prompt_logprobs();
    if (Status v = CheckChunk(chunk); !v.ok()) {
      // Never let one request's bad input reach the executor with others.
      LogRequestScope scope(seq.request.request_id);
      spdlog::error("request {}: not executed: {}", seq.request.request_id, v.ToString());
      Finish(seq, FinishReason::kError, Internal("request failed validation: " + v.message()), {},
             {});
      continue;
    }
    num_logits += static_cast<size_t>(chunk.logit_rows());
    total += c.num_tokens;
    batch_.push_back(chunk);
    batch_seqs_.push_back(&seq);
  }
  if (batch_.empty()) return 0;
  stats_.iteration_tokens.Record(total);
  const auto vocab = static_cast<size_t>(model_config().vocab_size);
  logits_.resize(num_logits * vocab);
  LayerObserver* observer = connector_ != nullptr ? connector_->BeginStep(batch_) : nullptr;
  Status st = executor_->Execute(batch_, *kv_, logits_, observer);
  ++stats_.num_steps;
  std::vector<Status> results(batch_.size(), st);
  if (!st.ok()) {
    spdlog::error("engine step of {} sequences failed: {}", batch_.size(), st.ToString());
    if (batch_.size() > 1) results = ExecuteEach();
  }
  size_t row = 0;
  for (size_t i = 0; i < batch_.size(); ++i) {
    Sequence& seq = *batch_seqs_[i];
    const size_t my_row = row;
    const auto rows = static_cast<size_t>(batch_[i].logit_rows());
    row += rows;
    if (!results[i].ok()) {
      Finish(seq, FinishReason::kError,
             Internal("model execution failed: " + results[i].ToString()), {}, {});
      continue;
    }
    stats_.computed_tokens += static_cast<int64_t>(batch_[i].tokens.size());
    stats_.prompt_tokens_computed += std::max<int64_t>(
        0, std::min<int64_t>(batch_[i].start_pos + static_cast<int64_t>(batch_[i].tokens.size()),
                             seq.num_prompt_tokens) -
               batch_[i].start_pos);
    seq.num_computed += static_cast<int32_t>(batch_[i].tokens.size());
    scheduler_.CommitFullBlocks(seq);
    if (batch_[i].all_logits) {
      RecordPromptLogprobs(seq, batch_[i],
                           std::span<const float>(logits_.data() + my_row * vocab, rows * vocab));
    }
    if (batch_[i].want_logits) {
      ProcessLogits(seq,
                    std::span<const float>(logits_.data() + (my_row + rows - 1) * vocab, vocab));
    }
  }
  return total;
}

Status EngineCore::CheckChunk(const SequenceChunk& c) const {
  const ModelConfig& m = model_config();
  for (int32_t t : c.tokens) {
    if (t < 0 || t >= m.vocab_size) {
      return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(m.vocab_size) + ")");
    }
  }
  const int64_t end = static_cast<int64_t>(c.start_pos) + static_cast<int64_t>(c.tokens.size());
  if (c.start_pos < 0 || c.tokens.empty() || end > config_.max_model_len) {
    return InvalidArgument("positions [" + std::to_string(c.start_pos) + ", " +
                           std::to_string(end) + ") outside the context length " +
                           std::to_string(config_.max_model_len));
  }
  const int64_t needed = (end + config_.block_size - 1) / config_.block_size;
  if (static_cast<int64_t>(c.block_table.size()) < needed) {
    return InvalidArgument("block table has " + std::to_string(c.block_table.size()) +
                           " blocks; positions up to " + std::to_string(end) + " need " +
                           std::to_string(needed));
  }
  for (int64_t i = 0; i < needed; ++i) {
    const BlockId b = c.block_table[static_cast<size_t>(i)];
    if (b < 0 || b >= config_.num_kv_blocks) {
      return InvalidArgument("block id " + std::to_string(b) + " outside the KV pool");
    }
  }
  return Status::Ok();
}

std::vector<Status> EngineCore::ExecuteEach() {
  // Isolation: the batch failed as a whole; run each sequence alone (no layer observer: a push
  // producer's WRITEs are posted from OnRequestFinished anyway) so only the culprit fails. The
  // executor is batch-invariant, so K/V and logits are the same as in the batched run.
  const auto vocab = static_cast<size_t>(model_config().vocab_size);
  std::vector<Status> results;
  results.reserve(batch_.size());
  size_t row = 0;
  for (size_t i = 0; i < batch_.size(); ++i) {
    const SequenceChunk& chunk = batch_[i];
    const auto rows = static_cast<size_t>(chunk.logit_rows());
    std::span<float> logits(logits_.data() + row * vocab, rows * vocab);
    row += rows;
    results.push_back(
        executor_->Execute(std::span<const SequenceChunk>(&chunk, 1), *kv_, logits, nullptr));
    if (!results.back().ok()) {
      LogRequestScope scope(batch_seqs_[i]->request.request_id);
      spdlog::error("sequence {} failed alone: {}", chunk.seq_id, results.back().ToString());
    }
  }
  return results;
}

void EngineCore::ProcessLogits(Sequence& seq, std::span<const float> logits) {
  const GenerationRequest& req = seq.request;
  const std::span<const int32_t> tokens = seq.tokens;
  const auto prompt_len = static_cast<size_t>(seq.num_prompt_tokens);
  SamplingHistory history;
  history.prompt = tokens.first(prompt_len);
  history.output = tokens.subspan(prompt_len);
  if (seq.num_output_tokens() < req.min_tokens) {
    // vLLM's MinTokensLogitsProcessor: EOS (even with ignore_eos) and the stop ids.
    suppressed_.assign(req.stop_token_ids.begin(), req.stop_token_ids.end());
    suppressed_.push_back(model_config().eos_id);
    history.suppressed = suppressed_;
  }
  SampleResult r = Sample(logits, req.sampling, seq.num_output_tokens(), history);
  ProcessSampled(seq, TokenOutput{r.token, r.logprob, std::move(r.top_logprobs)});
}

void EngineCore::RecordPromptLogprobs(Sequence& seq, const SequenceChunk& chunk,
                                      std::span<const float> logits) {
  const auto vocab = static_cast<size_t>(model_config().vocab_size);
  for (size_t r = 0; r < chunk.tokens.size(); ++r) {
    const size_t pos = static_cast<size_t>(chunk.start_pos) + r;
    if (pos >= seq.prompt_logprobs.size()) break;  // the last prompt position samples instead
    SampleResult lp = TokenLogprobs(logits.subspan(r * vocab, vocab), seq.tokens[pos + 1],
                                    seq.request.prompt_logprobs);
    seq.prompt_logprobs[pos] = TokenOutput{lp.token, lp.logprob, std::move(lp.top_logprobs)};
  }
}

void EngineCore::ProcessSampled(Sequence& seq, TokenOutput r) {
  const GenerationRequest& req = seq.request;
  const int64_t now = NowNs();
  seq.last_token = r;
  seq.tokens.push_back(r.id);
  ++stats_.generation_tokens;
  if (seq.first_token_ns == 0) {
    seq.first_token_ns = now;
    stats_.ttft.Record(NsToSeconds(now - seq.arrival_ns));
  } else {
    stats_.itl.Record(NsToSeconds(now - seq.last_token_ns));
  }
  seq.last_token_ns = now;

  RequestOutput out;
  out.tokens.push_back(std::move(r));
  if (seq.num_output_tokens() == 1 && req.prompt_logprobs >= 0) {
    out.prompt_logprobs = std::move(seq.prompt_logprobs);  // with the first token
  }
  FinishReason reason = FinishReason::kNone;
  std::string stop_reason;
  const int32_t token = seq.tokens.back();
  // vLLM (v1 check_stop, detokenizer): EOS and stop ids end a request once at least min_tokens
  // tokens exist; stop strings only match text of tokens after the min_tokens-th.
  const TokenStop stop = CheckTokenStop(req, seq.num_output_tokens(), token, model_config().eos_id);
  const bool strings_allowed = stop.strings_allowed;
  if (stop.ends()) {
    reason = FinishReason::kStop;
    if (!stop.is_eos) out.stop_token_id = token;       // vLLM checks EOS first: its stop_reason is null
    out.text = seq.text->Flush(strings_allowed);  // the stop token's own text is not emitted
  } else {
    OutputTextProcessor::Delta d = seq.text->Append(token, strings_allowed);
    out.text = std::move(d.text);
    if (d.stopped) {
      reason = FinishReason::kStop;
      stop_reason = std::move(d.stop_string);
    } else if (seq.num_output_tokens() >= seq.max_output_tokens ||
               seq.num_tokens() >= config_.max_model_len) {
      reason = FinishReason::kLength;
      out.text += seq.text->Flush(strings_allowed);
    }
  }
  if (reason != FinishReason::kNone) {
    Finish(seq, reason, Status::Ok(), std::move(out.text), std::move(stop_reason), &out);
    return;
  }
  out.num_prompt_tokens = seq.num_prompt_tokens;
  out.num_output_tokens = seq.num_output_tokens();
  out.num_cached_tokens = seq.num_cached_tokens;
  Emit(seq.channel, std::move(out));
}

void EngineCore::Finish(Sequence& seq, FinishReason reason, Status error, std::string text,
                        std::string stop_reason, RequestOutput* partial) {
  RequestOutput out;
  if (partial != nullptr) out = std::move(*partial);
  out.text = std::move(text);
  out.finish_reason = reason;
  out.stop_reason = std::move(stop_reason);
  out.error = std::move(error);
  out.num_prompt_tokens = seq.num_prompt_tokens;
  out.num_output_tokens = seq.num_output_tokens();
  out.num_cached_tokens = seq.num_cached_tokens;
  out.arrival_ns = seq.arrival_ns;
  out.first_scheduled_ns = seq.first_scheduled_ns;
  out.first_token_ns = seq.first_token_ns;
  out.last_token_ns = seq.last_token_ns;

  if (std::find(loaded_.begin(), loaded_.end(), seq.seq_id) != loaded_.end()) {
    scheduler_.CommitFullBlocks(seq);  // finished at its first token: cached as before
  }
  std::vector<BlockId> blocks = scheduler_.Remove(&seq);
  if (connector_ != nullptr && connector_->OnRequestFinished(seq, blocks, out)) {
    held_blocks_[seq.seq_id] = std::move(blocks);
  } else {
    pool_.Release(blocks);
  }

  const int64_t now = NowNs();
  ++stats_.finished_by_reason[static_cast<size_t>(reason)];
  stats_.e2e.Record(NsToSeconds(now - seq.arrival_ns));
  if (seq.num_output_tokens() > 1 && seq.first_token_ns != 0) {
    stats_.tpot.Record(NsToSeconds(seq.last_token_ns - seq.first_token_ns) /
                       static_cast<double>(seq.num_output_tokens() - 1));
  }
  RecordFinishedSizes(seq);
  std::shared_ptr<OutputChannel> channel = std::move(seq.channel);
  seqs_.erase(seq.seq_id);  // destroys seq
  Emit(channel, std::move(out));
}

void EngineCore::CountAdmission(Sequence& seq) {
  if (seq.admission_counted) return;
  seq.admission_counted = true;
  stats_.cached_prompt_tokens += seq.num_cached_tokens;
  stats_.queue_time.Record(NsToSeconds(seq.first_scheduled_ns - seq.arrival_ns));
  // What admission looked up: the prompt, and a continuation's resumed output with it.
  const int32_t looked_up = seq.num_prefill_tokens();
  if (config_.enable_prefix_caching && seq.request.prompt_logprobs < 0) {
    stats_.prefix_cache_queried_tokens += looked_up;
    stats_.prefix_cache_hit_tokens += seq.num_cached_tokens;
  }
  if (connector_ != nullptr) stats_.external_queried_tokens += looked_up;
}

void EngineCore::RecordFinishedSizes(const Sequence& seq) {
  stats_.request_prompt_tokens.Record(seq.num_prompt_tokens);
  stats_.request_generation_tokens.Record(seq.num_output_tokens());
  stats_.request_prefill_kv_computed_tokens.Record(
      std::max(0, seq.num_prefill_tokens() - seq.num_cached_tokens - seq.num_transferred_tokens));
  if (seq.first_token_ns == 0 || seq.first_scheduled_ns == 0) return;
  stats_.prefill_time.Record(NsToSeconds(seq.first_token_ns - seq.first_scheduled_ns));
  stats_.decode_time.Record(NsToSeconds(seq.last_token_ns - seq.first_token_ns));
  stats_.inference_time.Record(NsToSeconds(seq.last_token_ns - seq.first_scheduled_ns));
}

void EngineCore::Emit(const std::shared_ptr<OutputChannel>& channel, RequestOutput out) {
  if (!defer_outputs_) {
    channel->Push(std::move(out));
    return;
  }
  pending_outputs_.emplace_back(channel, std::move(out));
}

void EngineCore::FlushOutputs() {
  for (auto& [channel, out] : pending_outputs_) channel->Push(std::move(out));
  pending_outputs_.clear();
}

const EngineStats& EngineCore::stats() {
  stats_.num_running = scheduler_.num_running();
  stats_.num_waiting = scheduler_.num_waiting();
  stats_.num_waiting_for_kv = scheduler_.num_waiting_for_kv();
  stats_.outstanding_prefill_tokens = scheduler_.outstanding_prefill_tokens();
  stats_.kv = pool_.stats();
  stats_.num_preemptions = scheduler_.num_preemptions();
  return stats_;
}

}  // namespace kvpush
