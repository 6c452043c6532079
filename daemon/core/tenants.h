// Tenants: who may open sessions, under which prefix-cache namespace, and with what quotas.
//
// Two modes:
//  - Configured (a tenants file, see ParseTenants): tenants are authenticated. OpenSession
//    names a configured tenant and presents its token; the daemon keeps only the token's
//    SHA-256 and compares it in constant time. Unspecified quotas default to an equal share of
//    the pool per configured tenant (sessions and watchers: the config's defaults). The set
//    is bounded, so tenant names are safe as metric labels.
//  - Unconfigured: kvarnd is one trust domain. Tenant names are labels a client declares;
//    they keep prefix caches apart (by salt) and carry the config's default quotas, but any
//    client may declare any name. At most kMaxLabels names are interned.
// Prefix entries are shared across tenants only when they name the same `group` (configured
// mode), or when share_across_tenants is set (unconfigured mode only).
//
// Not thread-safe: KvCore serializes access.
#ifndef KVARN_DAEMON_CORE_TENANTS_H_
#define KVARN_DAEMON_CORE_TENANTS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/prefix_hash.h"
#include "daemon/core/core_types.h"
#include "daemon/core/quota.h"
#include "kernels/preset.h"

namespace kvarn {

using TokenHash = std::array<uint8_t, 32>;

// SHA-256 of a tenant token, as the tenants file stores it (hex).
TokenHash HashToken(std::string_view token);

// One line of the tenants file.
struct TenantSpec {
  std::string name;
  TokenHash token_sha256{};
  std::optional<uint32_t> max_sessions, max_tail_slots, max_watchers;
  std::optional<uint64_t> max_cache_bytes;
  std::string group;  // tenants of one group share prefix-cache entries
};

// The tenants file: one tenant per line, fields separated by blanks, `#` starts a comment:
//   NAME token_sha256=HEX64 [sessions=N] [tail_slots=N] [cache=SIZE] [watchers=N] [group=NAME]
// NAME and group: 1..64 of [A-Za-z0-9._-]. SIZE as in common/units.h. INVALID_ARGUMENT naming
// the line for anything else (unknown key, duplicate tenant, missing token).
absl::StatusOr<std::vector<TenantSpec>> ParseTenants(absl::string_view text);

// The namespace fields of a pool of this model and preset (tenant_salt left empty): what
// every prefix hash of the pool is salted with before the tenant's part.
HashNamespaceInput NamespaceBase(const ModelConfig& m, const Preset& p);

struct Tenant {
  std::string name;
  BlockHash ns{};           // prefix-hash namespace (salted by name, or by group)
  TenantQuota quota;
  bool configured = false;  // from the tenants file (and still in it)
  TokenHash token_sha256{};
  std::string group;
};

class TenantRegistry {
 public:
  static constexpr size_t kMaxLabels = 4096;

  // base: the namespace fields of the pool (tenant_salt is filled in per tenant).
  // defaults: quotas of tenants the file leaves unspecified, and of unconfigured labels.
  TenantRegistry(HashNamespaceInput base, std::string salt_secret, bool share_unconfigured, QuotaDefaults defaults);

  bool configured() const { return configured_; }

  // The tenant a session may open as. Configured mode: UNAUTHENTICATED unless `name` is a
  // configured tenant and `token` hashes to its token_sha256 (the message does not say which
  // was wrong). Unconfigured: the label's id (the token is ignored); RESOURCE_EXHAUSTED past
  // kMaxLabels names.
  absl::StatusOr<uint32_t> Authenticate(const std::string& name, std::string_view token);

  // Switches to (or stays in) configured mode with these tenants. Returns the ids whose token
  // changed or who were removed: their sessions must end. Ids stay stable for a name.
  std::vector<uint32_t> Configure(const std::vector<TenantSpec>& specs);

  const Tenant& get(uint32_t id) const { return tenants_[id]; }
  std::optional<uint32_t> Find(const std::string& name) const;
  size_t size() const { return tenants_.size(); }

 private:
  uint32_t Intern(const std::string& name);
  BlockHash Namespace(const std::string& name, const std::string& group) const;

  HashNamespaceInput base_;
  std::string salt_secret_;
  bool share_unconfigured_;
  QuotaDefaults defaults_;
  bool configured_ = false;
  std::vector<Tenant> tenants_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_TENANTS_H_
