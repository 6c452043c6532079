#include "tests/client/lib/in_process_daemon.h"

#include "tests/daemon/service/service_harness.h"

namespace kvarn::testing {

struct InProcessDaemon::Impl {
  CountingObserver calls;
  ServiceHarness harness;
};

InProcessDaemon::InProcessDaemon() : impl_(std::make_unique<Impl>()) {}
InProcessDaemon::~InProcessDaemon() = default;

absl::Status InProcessDaemon::Start(const Options& options) {
  ServiceHarness::Options o;
  o.descriptors = options.descriptors;
  o.tcp = options.tcp;
  o.rings = options.rings && options.descriptors;
  o.ring_options.watch = options.ring_watch;
  o.observer = &impl_->calls;
  return impl_->harness.Start(o);
}

std::string InProcessDaemon::target() const { return impl_->harness.target(); }
std::string InProcessDaemon::socket() const { return impl_->harness.socket(); }
std::string InProcessDaemon::File(const std::string& name) const { return impl_->harness.dir().File(name); }
int InProcessDaemon::tcp_port() const { return impl_->harness.tcp_port(); }

uint64_t InProcessDaemon::epoch() { return impl_->harness.core().epoch(); }

uint32_t InProcessDaemon::sessions() {
  auto s = impl_->harness.core().Stats(std::nullopt);
  return s.ok() ? s->sessions : ~0u;
}

absl::StatusOr<uint64_t> InProcessDaemon::SequenceTokens(const v1::SessionRef& ref, uint64_t seq) {
  auto t = impl_->harness.core().Table(CoreRef(ref), seq);
  if (!t.ok()) return t.status();
  return t->tokens;
}

absl::Status InProcessDaemon::CheckSession(const v1::SessionRef& ref) {
  return impl_->harness.core().CheckSession(CoreRef(ref));
}

absl::Status InProcessDaemon::CheckInvariants() {
  if (!impl_->harness.started()) return absl::OkStatus();
  return impl_->harness.core().CheckInvariants();
}

uint64_t InProcessDaemon::lent() { return impl_->harness.descriptors() ? impl_->harness.descriptors()->lent() : 0; }
uint64_t InProcessDaemon::refused() {
  return impl_->harness.descriptors() ? impl_->harness.descriptors()->refused() : 0;
}
size_t InProcessDaemon::rings() { return impl_->harness.rings() ? impl_->harness.rings()->rings() : 0; }
uint64_t InProcessDaemon::rings_broken() { return impl_->harness.rings() ? impl_->harness.rings()->broken() : 0; }
uint64_t InProcessDaemon::ring_cpu_moves() { return impl_->harness.rings() ? impl_->harness.rings()->cpu_moves() : 0; }
size_t InProcessDaemon::watch_streams() { return impl_->harness.service().watch_streams(); }
int InProcessDaemon::calls(const std::string& method) { return impl_->calls.calls(method); }

grpc::Status InProcessDaemon::CloseSession(const v1::SessionRef& ref) { return impl_->harness.CloseSession(ref); }

std::vector<float> TestKv(int n, uint32_t seed) { return RandomKv(n, seed); }
std::vector<uint32_t> TestTokenIds(uint32_t first, int n) { return TokenIds(first, n); }

}  // namespace kvarn::testing
