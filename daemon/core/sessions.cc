#include "daemon/core/sessions.h"

#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"

namespace kvarn {

absl::StatusOr<SessionState*> SessionTable::Find(const SessionRef& ref) {
  if (ref.epoch != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat("stale epoch ", ref.epoch, ": the daemon restarted (epoch ", epoch_,
                                                      "); reconnect and reopen the session"));
  }
  auto it = sessions_.find(ref.session);
  // Always compare a secret, so an unknown id and a wrong secret take the same time.
  static const SessionSecret kNone{};
  const SessionSecret& expected = it != sessions_.end() ? it->second.secret : kNone;
  const bool match = CRYPTO_memcmp(expected.data(), ref.secret.data(), expected.size()) == 0;
  if (it == sessions_.end() || !match || it->second.closing) {
    return absl::NotFoundError(absl::StrCat("no session ", ref.session));
  }
  return &it->second;
}

absl::StatusOr<const SessionState*> SessionTable::Find(const SessionRef& ref) const {
  auto s = const_cast<SessionTable*>(this)->Find(ref);
  if (!s.ok()) return s.status();
  return *s;
}

SessionState* SessionTable::Get(SessionId id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const SessionState* SessionTable::Get(SessionId id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

void SessionTable::Reserve(uint32_t tenant, uint32_t slots) {
  TenantUsage& u = usage_->of(tenant);
  ++u.sessions;
  u.tail_slots += slots;
  tail_slots_ += slots;
}

void SessionTable::Unreserve(uint32_t tenant, uint32_t slots) {
  TenantUsage& u = usage_->of(tenant);
  KVARN_CHECK(u.sessions >= 1 && u.tail_slots >= slots && tail_slots_ >= slots, "unreserving more than was reserved");
  --u.sessions;
  u.tail_slots -= slots;
  tail_slots_ -= slots;
}

SessionState& SessionTable::Add(SessionState s) {
  KVARN_DCHECK(!sessions_.contains(s.id), "session ids are unique");
  ++live_;
  if (s.observer) ++observers_;
  const SessionId id = s.id;
  return sessions_.emplace(id, std::move(s)).first->second;
}

void SessionTable::MarkClosing(SessionState& s) {
  KVARN_CHECK(!s.closing, "a session ends once");
  s.closing = true;
  --live_;
  if (s.observer) --observers_;
  TenantUsage& u = usage_->of(s.tenant);
  KVARN_CHECK(u.sessions >= 1, "tenant session count underflow");
  --u.sessions;
}

std::unique_ptr<Region> SessionTable::Remove(SessionId id) {
  auto it = sessions_.find(id);
  KVARN_CHECK(it != sessions_.end() && it->second.closing, "only a closing session is removed");
  SessionState& s = it->second;
  TenantUsage& u = usage_->of(s.tenant);
  KVARN_CHECK(u.tail_slots >= s.slots && tail_slots_ >= s.slots, "tail slot count underflow");
  u.tail_slots -= s.slots;
  tail_slots_ -= s.slots;
  std::unique_ptr<Region> region = std::move(s.tail_region);
  sessions_.erase(it);
  return region;
}

void SessionTable::StreamAttached(SessionState& s, absl::Time now) {
  ++s.streams;
  s.stream_seen = true;
  s.renewed = now;
}

void SessionTable::StreamDetached(SessionState& s, absl::Time now) {
  KVARN_CHECK(s.streams > 0, "stream detached more often than attached");
  if (--s.streams == 0) s.disconnected_at = now;
}

std::vector<SessionId> SessionTable::Expired(absl::Time now) const {
  std::vector<SessionId> out;
  for (const auto& [id, s] : sessions_) {
    if (s.closing) continue;
    const bool stream_gone = s.stream_seen && s.streams == 0 && now - s.disconnected_at >= grace_;
    const bool silent = now - s.renewed >= lease_ttl_;
    if (stream_gone || silent) out.push_back(id);
  }
  return out;
}

std::vector<const SessionState*> SessionTable::Live() const {
  std::vector<const SessionState*> out;
  for (const auto& [id, s] : sessions_) {
    if (!s.closing) out.push_back(&s);
  }
  return out;
}

}  // namespace kvarn
