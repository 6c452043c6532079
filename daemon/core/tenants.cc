#include "daemon/core/tenants.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cctype>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/units.h"

namespace kvarn {

HashNamespaceInput NamespaceBase(const ModelConfig& m, const Preset& p) {
  HashNamespaceInput in;
  in.model_id = m.model_id;
  in.num_layers = m.num_layers;
  in.num_kv_heads = m.num_kv_heads;
  in.head_dim = m.head_dim;
  in.tile_tokens = static_cast<uint32_t>(p.tile_tokens);
  in.preset = p.Name();
  in.sink_tokens = m.sink_tokens;
  return in;
}
namespace {

bool ValidName(absl::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  }
  return true;
}

bool ParseHex32(absl::string_view hex, TokenHash* out) {
  if (hex.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    int v = 0;
    for (int j = 0; j < 2; ++j) {
      const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(hex[2 * i + j])));
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else {
        return false;
      }
      v = v * 16 + d;
    }
    (*out)[i] = static_cast<uint8_t>(v);
  }
  return true;
}

template <typename T>
bool ParseCount(absl::string_view v, std::optional<T>* out) {
  uint64_t x;
  if (!absl::SimpleAtoi(v, &x) || x > 0xFFFFFFFFu) return false;
  *out = static_cast<T>(x);
  return true;
}

}  // namespace

TokenHash HashToken(std::string_view token) {
  TokenHash h;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), h.data());
  return h;
}

absl::StatusOr<std::vector<TenantSpec>> ParseTenants(absl::string_view text) {
  std::vector<TenantSpec> out;
  absl::flat_hash_set<std::string> seen;
  int lineno = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++lineno;
    absl::string_view line = raw.substr(0, raw.find('#'));
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("tenants line ", lineno, ": ", why));
    };
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    TenantSpec t;
    t.name = std::string(fields[0]);
    if (!ValidName(t.name)) return bad(absl::StrCat("tenant name '", t.name, "' must be 1..64 of A-Z a-z 0-9 . _ -"));
    if (!seen.insert(t.name).second) return bad(absl::StrCat("tenant '", t.name, "' is listed twice"));
    bool has_token = false;
    for (size_t i = 1; i < fields.size(); ++i) {
      const size_t eq = fields[i].find('=');
      if (eq == absl::string_view::npos) return bad(absl::StrCat("expected key=value, got '", fields[i], "'"));
      const absl::string_view key = fields[i].substr(0, eq), value = fields[i].substr(eq + 1);
      bool ok = true;
      if (key == "token_sha256") {
        ok = ParseHex32(value, &t.token_sha256);
        has_token = ok;
      } else if (key == "sessions") {
        ok = ParseCount(value, &t.max_sessions);
      } else if (key == "tail_slots") {
        ok = ParseCount(value, &t.max_tail_slots);
      } else if (key == "watchers") {
        ok = ParseCount(value, &t.max_watchers);
      } else if (key == "cache") {
        auto b = ParseBytes(value);
        ok = b.ok();
        if (ok) t.max_cache_bytes = *b;
      } else if (key == "group") {
        ok = ValidName(value);
        t.group = std::string(value);
      } else {
        return bad(absl::StrCat("unknown key '", key, "' (token_sha256, sessions, tail_slots, cache, watchers, group)"));
      }
      if (!ok) return bad(absl::StrCat("bad value for ", key, ": '", value, "'"));
    }
    if (!has_token) return bad(absl::StrCat("tenant '", t.name, "' has no token_sha256=<64 hex digits>"));
    out.push_back(std::move(t));
  }
  return out;
}

TenantRegistry::TenantRegistry(HashNamespaceInput base, std::string salt_secret, bool share_unconfigured,
                               QuotaDefaults defaults)
    : base_(std::move(base)), salt_secret_(std::move(salt_secret)), share_unconfigured_(share_unconfigured),
      defaults_(defaults) {}

BlockHash TenantRegistry::Namespace(const std::string& name, const std::string& group) const {
  HashNamespaceInput in = base_;
  std::string key = name;
  if (configured_ && !group.empty()) key = absl::StrCat("group:", group);
  if (!configured_ && share_unconfigured_) key = "*shared*";
  in.tenant_salt = TenantSalt(key, salt_secret_);
  return NamespaceDigest(in);
}

std::optional<uint32_t> TenantRegistry::Find(const std::string& name) const {
  auto it = ids_.find(name);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

uint32_t TenantRegistry::Intern(const std::string& name) {
  if (auto id = Find(name)) return *id;
  Tenant t;
  t.name = name;
  t.ns = Namespace(name, "");
  t.quota = TenantQuota{defaults_.max_sessions, defaults_.tail_slots_total, defaults_.cache_bytes_total, defaults_.max_watchers};
  tenants_.push_back(std::move(t));
  const uint32_t id = static_cast<uint32_t>(tenants_.size() - 1);
  ids_.emplace(name, id);
  return id;
}

absl::StatusOr<uint32_t> TenantRegistry::Authenticate(const std::string& name, std::string_view token) {
  if (configured_) {
    const TokenHash presented = HashToken(token);
    auto id = Find(name);
    // Compare against a fixed value for an unknown name too, so timing does not tell them apart.
    static const TokenHash kNobody = HashToken("kvarnd: no such tenant");
    const TokenHash& expected = id.has_value() && tenants_[*id].configured ? tenants_[*id].token_sha256 : kNobody;
    const bool match = CRYPTO_memcmp(presented.data(), expected.data(), presented.size()) == 0;
    if (!match || !id.has_value() || !tenants_[*id].configured) {
      return absl::UnauthenticatedError("tenant authentication failed: unknown tenant or wrong token");
    }
    return *id;
  }
  if (Find(name) == std::nullopt && tenants_.size() >= kMaxLabels) {
    return absl::ResourceExhaustedError(absl::StrCat("more than ", kMaxLabels, " tenant names in use; configure a tenants file"));
  }
  return Intern(name);
}

std::vector<uint32_t> TenantRegistry::Configure(const std::vector<TenantSpec>& specs) {
  const bool was_configured = configured_;
  configured_ = true;
  std::vector<uint32_t> revoked;
  absl::flat_hash_set<std::string> listed;
  const uint32_t n = static_cast<uint32_t>(std::max<size_t>(1, specs.size()));
  for (const TenantSpec& s : specs) {
    listed.insert(s.name);
    const uint32_t id = Intern(s.name);
    Tenant& t = tenants_[id];
    // A label of the unconfigured daemon carried no credential: its sessions end too.
    if (!t.configured || !was_configured || t.token_sha256 != s.token_sha256) revoked.push_back(id);
    t.configured = true;
    t.token_sha256 = s.token_sha256;
    t.group = s.group;
    t.ns = Namespace(s.name, s.group);
    t.quota.max_sessions = s.max_sessions.value_or(defaults_.max_sessions);
    t.quota.max_watchers = s.max_watchers.value_or(defaults_.max_watchers);
    t.quota.max_tail_slots = s.max_tail_slots.value_or(std::max<uint32_t>(1, defaults_.tail_slots_total / n));
    t.quota.max_cache_bytes = s.max_cache_bytes.value_or(defaults_.cache_bytes_total / n);
  }
  for (uint32_t id = 0; id < tenants_.size(); ++id) {
    Tenant& t = tenants_[id];
    if (listed.contains(t.name)) continue;
    if (t.configured || !was_configured) revoked.push_back(id);
    t.configured = false;
    t.quota = TenantQuota{};  // nothing more for a removed tenant
  }
  return revoked;
}

}  // namespace kvarn
