// kvarn_storm_bench: the daemon's memory under a storm of maximum-size requests.
//
// Starts its own kvarnd (the demo model: 8 layers x 4 kv-heads x 128, kvarn_k4v2_g128) and
// hits it from --threads client threads (default 16) for --seconds (default 10) with the
// largest requests each RPC accepts: AppendInline of a whole tile in fp32, CreateSequence
// with a prompt of max_prompt_tokens, Read of read_tokens_per_call tokens, and requests just
// above the message limit (which gRPC must refuse with RESOURCE_EXHAUSTED before buffering
// them). It samples the daemon's /proc/<pid>/status every 20 ms (steady clock) and prints its
// resident memory before, the peak during (VmHWM and the sampled peak of RssAnon, the heap;
// the pool's shared memory is RssShmem), and after, beside the limits that bound it: the
// message limit times the calls gRPC handles at once, plus gRPC's resource quota.
//
// usage: kvarn_storm_bench [--kvarnd=PATH] [--threads=N] [--seconds=S]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "common/mutex.h"
#include "tests/bench/spawn_daemon.h"

namespace kvarn {
namespace {

using Clock = std::chrono::steady_clock;

// kB figures of /proc/<pid>/status.
std::map<std::string, uint64_t> Status(pid_t pid) {
  std::map<std::string, uint64_t> out;
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    uint64_t v = 0;
    if (std::sscanf(line.c_str() + colon + 1, "%lu", &v) == 1) out[line.substr(0, colon)] = v;
  }
  return out;
}

double MiB(uint64_t kb) { return static_cast<double>(kb) / 1024.0; }

int Main(int argc, char** argv) {
  std::string kvarnd = KVARN_KVARND_PATH;
  int threads = 16;
  double seconds = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--kvarnd=", 0) == 0) {
      kvarnd = a.substr(9);
    } else if (a.rfind("--threads=", 0) == 0 && absl::SimpleAtoi(a.substr(10), &threads) && threads > 0) {
    } else if (a.rfind("--seconds=", 0) == 0 && absl::SimpleAtod(a.substr(10), &seconds) && seconds > 0) {
    } else {
      std::fprintf(stderr, "usage: %s [--kvarnd=PATH] [--threads=N] [--seconds=S]\n", argv[0]);
      return 2;
    }
  }
  char dir_template[] = "/tmp/kvarn-storm-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string sock = dir + "/kvarnd.sock";
  std::vector<std::string> args = {kvarnd, "--listen=" + sock, "--metrics=", "--instance=storm", "--capacity=1GiB",
                                   "--num_layers=8", "--num_kv_heads=4", "--head_dim=128", "--log_level=warning",
                                   "--max_tail_slots=512", "--default_tail_slots=64"};
  const pid_t daemon = SpawnTiedDaemon(args);
  if (daemon < 0) {
    std::fprintf(stderr, "cannot start %s\n", kvarnd.c_str());
    return 1;
  }
  const auto stop_daemon = [&] {
    kill(daemon, SIGTERM);
    waitpid(daemon, nullptr, 0);
  };
  ClientOptions co;
  co.rpc_timeout = absl::Seconds(60);
  auto client = Client::Connect("unix:" + sock, co, absl::Seconds(10));
  if (!client.ok()) {
    std::fprintf(stderr, "%s %s\n", client.status().ToString().c_str(), DaemonExited(daemon).c_str());
    kill(daemon, SIGKILL);
    return 1;
  }
  auto d = (*client)->Describe();
  if (!d.ok()) return 1;
  const Layout layout = Client::LayoutOf(*d);
  const size_t per_token = size_t{layout.num_layers} * layout.num_kv_heads * layout.head_dim;
  const int tile = static_cast<int>(d->tile_tokens());
  const std::map<std::string, uint64_t> before = Status(daemon);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ok_calls{0}, refused{0}, exhausted{0}, bytes_sent{0};
  Mutex codes_mu;
  std::map<std::string, uint64_t> codes;  // other errors by code
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      SessionOptions so;
      so.tenant = "storm";
      so.layout = layout;
      so.max_sequences = 4;
      auto s = (*client)->OpenSession(so);
      if (!s.ok()) {
        ++refused;
        return;
      }
      const std::vector<float> kv(per_token * tile, 0.25f + 0.01f * t);  // a whole tile, fp32
      std::vector<uint32_t> ids(tile);
      std::vector<uint32_t> prompt(1u << 20);  // max_prompt_tokens of the daemon's default
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<uint32_t>(i * 7 + t);
      std::vector<float> k, v;
      for (uint64_t round = 0; !stop.load(); ++round) {
        const int kind = static_cast<int>(round % 4);
        absl::Status st;
        if (kind == 0 || kind == 1) {
          auto q = (*s)->CreateSequence(kind == 0 ? std::span<const uint32_t>(prompt) : std::span<const uint32_t>());
          st = q.status();
          if (q.ok()) {
            for (int i = 0; i < tile; ++i) ids[i] = static_cast<uint32_t>(round * tile + i);
            auto a = (*s)->AppendInline(q->id, ids, kv.data(), kv.data(), DType::kF32);
            bytes_sent += 2 * kv.size() * sizeof(float);
            if (a.ok()) {
              st = (*s)->Read(q->id, 0, 0, static_cast<uint32_t>(std::min<uint64_t>(tile, a->table.tokens)), &k, &v);
            } else {
              st = a.status();
            }
            const uint64_t release[] = {q->id};
            (*s)->Release(release).IgnoreError();
          }
        } else if (kind == 2) {
          // Just above the message limit: gRPC refuses it.
          std::vector<uint32_t> huge(prompt.size() * 2, 0xFFFFFFF0u);  // 5-byte varints: ~10 MiB
          auto q = (*s)->CreateSequence(huge);
          st = q.status();
        } else {
          st = (*s)->Stats().status();
        }
        if (st.ok()) {
          ++ok_calls;
        } else if (absl::IsResourceExhausted(st)) {
          ++exhausted;
        } else {
          ++refused;
          MutexLock lock(&codes_mu);
          ++codes[absl::StrCat(absl::StatusCodeToString(st.code()), ": ", st.message().substr(0, 60))];
        }
      }
    });
  }
  const Clock::time_point t0 = Clock::now();
  uint64_t peak_anon = 0, peak_rss = 0;
  while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
    const auto st = Status(daemon);
    if (st.count("RssAnon")) peak_anon = std::max(peak_anon, st.at("RssAnon"));
    if (st.count("VmRSS")) peak_rss = std::max(peak_rss, st.at("VmRSS"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sampling period
  }
  stop.store(true);
  for (std::thread& w : workers) w.join();
  const std::map<std::string, uint64_t> after = Status(daemon);
  const uint64_t message_limit = d->max_message_bytes();
  std::printf("kvarn_storm_bench: %d client threads for %.1f s (steady clock), daemon pid %d\n", threads, seconds, daemon);
  std::printf("  calls: %lu answered OK, %lu RESOURCE_EXHAUSTED (oversize or thread quota), %lu other errors; %.1f MiB of K/V sent\n",
              static_cast<unsigned long>(ok_calls.load()), static_cast<unsigned long>(exhausted.load()),
              static_cast<unsigned long>(refused.load()), static_cast<double>(bytes_sent.load()) / (1 << 20));
  for (const auto& [what, n] : codes) std::printf("    %lu x %s\n", static_cast<unsigned long>(n), what.c_str());
  const auto get = [](const std::map<std::string, uint64_t>& m, const char* k) { return m.count(k) ? m.at(k) : 0; };
  std::printf("  daemon RssAnon (heap): before %.1f MiB, sampled peak %.1f MiB, after %.1f MiB\n", MiB(get(before, "RssAnon")),
              MiB(peak_anon), MiB(get(after, "RssAnon")));
  std::printf("  daemon VmRSS (incl. the pool's shared pages): before %.1f MiB, peak (VmHWM) %.1f MiB, after %.1f MiB\n",
              MiB(get(before, "VmRSS")), MiB(get(after, "VmHWM")), MiB(get(after, "VmRSS")));
  std::printf("  bound: message limit %.1f MiB x gRPC threads (grpc_max_threads, default 32) in flight, within gRPC's "
              "resource quota (grpc_memory, default 256 MiB)\n",
              static_cast<double>(message_limit) / (1 << 20));
  stop_daemon();
  return ok_calls.load() > 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvarn

int main(int argc, char** argv) { return kvarn::Main(argc, argv); }
