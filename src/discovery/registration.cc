#include "discovery/registration.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/thread_name.h"

namespace kvpush::discovery {

Result<std::unique_ptr<Registration>> Registration::Create(RegistrationOptions options) {
  if (options.endpoints.empty()) return InvalidArgument("discovery: no etcd endpoint");
  KVP_RETURN_IF_ERROR(ValidatePrefix(options.prefix));
  if (options.ttl_s < 2 || options.ttl_s > 3600) {
    return InvalidArgument("--discovery-lease-ttl-s must be in [2, 3600]");
  }
  return std::unique_ptr<Registration>(new Registration(std::move(options)));
}

Registration::Registration(RegistrationOptions options)
    : options_(std::move(options)),
      key_(options_.record.Key(options_.prefix)),
      value_(
          options_.record.ToJson().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)),
      client_(options_.endpoints, options_.etcd_timeout) {}

Registration::~Registration() {
  Leave();
}

void Registration::Start() {
  {
    MutexLock lock(mu_);
    if (left_ || thread_.joinable()) return;
  }
  thread_ = std::thread([this] {
    SetThreadName("kvp-etcd-lease");
    Loop();
  });
}

void Registration::Leave() {
  {
    MutexLock lock(mu_);
    if (left_) return;
    left_ = true;
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  if (lease_ != 0) Deregister("leaving");
  spdlog::info("discovery: left ({})", key_);
  Publish();
}

RegistrationState Registration::state() const {
  MutexLock lock(mu_);
  return published_;
}

void Registration::Publish() {
  MutexLock lock(mu_);
  published_.registered = lease_ != 0;
  published_.lease = lease_;
  published_.registrations = registrations_;
  published_.left = left_;
}

void Registration::Loop() {
  MutexLock lock(mu_);
  while (!stop_) {
    lock.Unlock();
    const std::chrono::milliseconds wait = Step();
    Publish();
    lock.Lock();
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (!stop_ && cv_.WaitUntil(lock, deadline)) {
    }
  }
}

std::chrono::milliseconds Registration::Step() {
  const std::chrono::milliseconds renew{options_.ttl_s * 1000 / 3};
  const std::chrono::milliseconds retry = std::min(renew, std::chrono::milliseconds(1000));
  const bool healthy = !options_.healthy || options_.healthy();
  if (!healthy) {
    if (lease_ != 0) Deregister("instance not healthy");
    return retry;
  }
  if (lease_ != 0) {
    auto ttl = client_.LeaseKeepAlive(lease_);
    if (ttl.ok()) {
      etcd_down_logged_ = false;
      EnsureKey();
      return renew;
    }
    if (ttl.status().code() != StatusCode::kNotFound) {
      if (!etcd_down_logged_) {
        spdlog::warn("discovery: etcd unreachable ({}); serving on, renewing when it is back",
                     ttl.status().message());
        etcd_down_logged_ = true;
      }
      return retry;
    }
    spdlog::warn("discovery: lease {:x} of {} expired; registering again", lease_, key_);
    lease_ = 0;
  }
  return Register() ? renew : retry;
}

bool Registration::Register() {
  auto lease = client_.LeaseGrant(options_.ttl_s);
  if (lease.ok()) {
    auto put = client_.Put(key_, value_, *lease);
    if (put.ok()) {
      lease_ = *lease;
      ++registrations_;
      etcd_down_logged_ = false;
      spdlog::info("discovery: registered {} = {} (lease {:x}, ttl {} s)", key_, value_, lease_,
                   options_.ttl_s);
      return true;
    }
    (void)client_.LeaseRevoke(*lease);
    lease = put.status();
  }
  if (!etcd_down_logged_) {
    spdlog::warn("discovery: cannot register {} ({}); serving on, retrying", key_,
                 lease.status().message());
    etcd_down_logged_ = true;
  }
  return false;
}

void Registration::EnsureKey() {
  auto kv = client_.Get(key_);
  if (!kv.ok() || (kv->has_value() && (*kv)->lease == lease_ && (*kv)->value == value_)) return;
  if (client_.Put(key_, value_, lease_).ok()) {
    spdlog::warn("discovery: {} was missing or changed in etcd; put it again (lease {:x})", key_,
                 lease_);
  }
}

void Registration::Deregister(const char* why) {
  const Status del = client_.Delete(key_);
  const Status rev = client_.LeaseRevoke(lease_);
  if (del.ok() && rev.ok()) {
    spdlog::info("discovery: deregistered {} ({})", key_, why);
  } else {
    spdlog::warn(
        "discovery: deregistering {} ({}) failed: {}; the key expires with its lease "
        "within {} s",
        key_, why, (!del.ok() ? del : rev).message(), options_.ttl_s);
  }
  lease_ = 0;
}

}  // namespace kvpush::discovery
