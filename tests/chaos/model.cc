#include "tests/chaos/model.h"

#include "absl/strings/str_cat.h"

namespace kvarn::chaos {
namespace {
constexpr size_t kMaxNotes = 20;
}  // namespace

void Model::Open(int client, uint64_t session) {
  ClientState& c = clients_[client];
  c.session = session;
  c.live = true;
  c.seqs.clear();
}

void Model::EndSession(int client) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  it->second.live = false;
  it->second.seqs.clear();
}

void Model::NewEpoch() {
  for (auto& [id, c] : clients_) {
    c.live = false;
    c.seqs.clear();
  }
  seen_ids_.clear();
}

bool Model::live(int client) const {
  auto it = clients_.find(client);
  return it != clients_.end() && it->second.live;
}

uint64_t Model::session(int client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.session;
}

void Model::Mismatch(const std::string& what) {
  ++mismatches_;
  if (notes_.size() < kMaxNotes) notes_.push_back(what);
}

void Model::Done(int client, const Line& d) {
  auto it = clients_.find(client);
  if (it == clients_.end() || !it->second.live) return;
  ClientState& c = it->second;
  if (d.Int("code") != kOk) return;  // a rejected call changes no state
  const std::string op = d.Str("op");
  const uint64_t seq = d.U64("seq");
  const uint64_t tokens = d.U64("tokens");
  const std::string who = absl::StrCat("client ", client, " session ", c.session, " ", op, " seq ", seq, ": ");
  const auto fresh_id = [&]() {
    if (!seen_ids_.insert(seq).second) Mismatch(absl::StrCat(who, "sequence id issued twice in one epoch"));
  };
  if (op == "create") {
    fresh_id();
    const uint64_t len = d.U64("len");
    const uint64_t adoptable = len == 0 ? 0 : (len - 1) / static_cast<uint64_t>(tile_) * static_cast<uint64_t>(tile_);
    if (tokens % static_cast<uint64_t>(tile_) != 0 || tokens > adoptable) {
      Mismatch(absl::StrCat(who, "adopted ", tokens, " tokens of a ", len, "-token prompt (at most ", adoptable,
                            ", whole tiles)"));
    }
    c.seqs[seq] = tokens;
  } else if (op == "append") {
    auto s = c.seqs.find(seq);
    if (s == c.seqs.end()) {
      Mismatch(absl::StrCat(who, "append accepted on a sequence the model does not hold"));
      return;
    }
    const uint64_t want = s->second + d.U64("n");
    if (tokens != want) Mismatch(absl::StrCat(who, "has ", tokens, " tokens after the append, expected ", want));
    s->second = tokens;
  } else if (op == "fork") {
    fresh_id();
    auto p = c.seqs.find(d.U64("parent"));
    if (p == c.seqs.end()) {
      Mismatch(absl::StrCat(who, "fork of a sequence the model does not hold"));
    } else if (p->second != tokens) {
      Mismatch(absl::StrCat(who, "fork has ", tokens, " tokens, its parent ", p->second));
    }
    c.seqs[seq] = tokens;
  } else if (op == "release") {
    if (c.seqs.erase(seq) == 0) Mismatch(absl::StrCat(who, "release accepted for a sequence the model does not hold"));
  } else if (op == "read") {
    auto s = c.seqs.find(seq);
    if (s == c.seqs.end()) Mismatch(absl::StrCat(who, "read accepted on a sequence the model does not hold"));
  }
}

uint64_t Model::Compare(const v1::ListSequencesResponse& list, const v1::StatsResponse& stats,
                        const std::set<int>& parked, const std::set<uint64_t>& ignore) {
  const uint64_t before = mismatches_;
  std::map<uint64_t, std::map<uint64_t, uint64_t>> daemon;  // session -> seq -> tokens
  for (const auto& q : list.sequences()) daemon[q.session_id()][q.sequence_id()] = q.tokens();
  std::map<uint64_t, uint32_t> listed_seqs;  // session -> sequences, as Stats lists it
  for (const auto& si : stats.session_info()) listed_seqs[si.session_id()] = si.sequences();
  std::set<uint64_t> modelled;
  for (int client : parked) {
    auto it = clients_.find(client);
    if (it == clients_.end() || !it->second.live) continue;
    const ClientState& c = it->second;
    modelled.insert(c.session);
    const std::map<uint64_t, uint64_t>& have = daemon[c.session];
    const std::string who = absl::StrCat("checkpoint: client ", client, " session ", c.session, ": ");
    for (const auto& [seq, tokens] : c.seqs) {
      auto h = have.find(seq);
      if (h == have.end()) {
        Mismatch(absl::StrCat(who, "sequence ", seq, " (", tokens, " tokens) missing from the daemon"));
      } else if (h->second != tokens) {
        Mismatch(absl::StrCat(who, "sequence ", seq, " has ", h->second, " tokens, expected ", tokens));
      }
    }
    for (const auto& [seq, tokens] : have) {
      if (!c.seqs.count(seq)) Mismatch(absl::StrCat(who, "the daemon lists sequence ", seq, " the model does not hold"));
    }
    auto l = listed_seqs.find(c.session);
    if (l == listed_seqs.end()) {
      Mismatch(absl::StrCat(who, "session not listed by Stats"));
    } else if (l->second != c.seqs.size()) {
      Mismatch(absl::StrCat(who, "Stats lists ", l->second, " sequences, expected ", c.seqs.size()));
    }
  }
  for (const auto& [session, seqs] : daemon) {
    if (modelled.count(session) || ignore.count(session) || seqs.empty()) continue;
    Mismatch(absl::StrCat("checkpoint: ", seqs.size(), " sequences of session ", session,
                          ", which no live client holds (orphans)"));
  }
  return mismatches_ - before;
}

}  // namespace kvarn::chaos
