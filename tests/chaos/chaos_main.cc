// kvarn_chaos: kills and stops kvarnd's clients, and kvarnd itself, at random moments, and
// checks that the daemon reclaims everything, rejects every stale handle and never crashes.
//
//   kvarn_chaos [--cycles=5] [--clients=4] [--seed=1] [--daemon-kill-every=2] [--cpu-hog]
//               [--duration-budget-s=0] [--json=PATH] [--kvarnd=PATH] [--grace_ms=200]
//               [--lease_ttl_ms=1000] [--keepalive_ms=100] [--capacity=16MiB]
//               [--cycle-ms=3000] [--think-us=2000] [--keep-dir] [--transcript]
//   kvarn_chaos client --target=unix:PATH --tenant=NAME --seed=S --serial=N   (spawned by the controller)
//
// The controller prints its figures on stdout (one a line), one progress line per cycle on
// stderr, and exits 0 only if every gate holds (controller.h, figures.h). Flags take '-' or '_'.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "tests/chaos/chaos_client.h"
#include "tests/chaos/controller.h"

namespace kvarn::chaos {
namespace {

constexpr const char* kUsage =
    "usage: kvarn_chaos [--cycles=N] [--clients=M] [--seed=S] [--daemon-kill-every=K] [--cpu-hog]\n"
    "                   [--duration-budget-s=S] [--json=PATH] [--kvarnd=PATH] [--grace_ms=MS]\n"
    "                   [--lease_ttl_ms=MS] [--keepalive_ms=MS] [--capacity=BYTES] [--cycle-ms=MS]\n"
    "                   [--think-us=US] [--keep-dir] [--transcript]\n"
    "       kvarn_chaos client --target=unix:PATH --tenant=NAME --seed=S --serial=N [--max_sequences=4]\n";

// --key=value (or --flag) arguments after argv[first], keys with '-' read as '_'.
bool ParseFlags(int argc, char** argv, int first, const std::set<std::string>& known,
                std::map<std::string, std::string>* out) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      std::cerr << "kvarn_chaos: unexpected argument " << a << "\n" << kUsage;
      return false;
    }
    a = a.substr(2);
    const size_t eq = a.find('=');
    const std::string key = absl::StrReplaceAll(a.substr(0, eq), {{"-", "_"}});
    if (!known.count(key)) {
      std::cerr << "kvarn_chaos: unknown flag --" << a.substr(0, eq) << "\n" << kUsage;
      return false;
    }
    (*out)[key] = eq == std::string::npos ? "1" : a.substr(eq + 1);
  }
  return true;
}

template <typename T>
bool Number(const std::map<std::string, std::string>& f, const std::string& key, T* v) {
  auto it = f.find(key);
  if (it == f.end()) return true;
  if constexpr (std::is_floating_point_v<T>) {
    if (absl::SimpleAtod(it->second, v)) return true;
  } else {
    if (absl::SimpleAtoi(it->second, v)) return true;
  }
  std::cerr << "kvarn_chaos: --" << key << "=" << it->second << " is not a number\n";
  return false;
}

bool Bool(const std::map<std::string, std::string>& f, const std::string& key) {
  auto it = f.find(key);
  return it != f.end() && (it->second == "1" || it->second == "true");
}

std::string SelfPath() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

int ClientMain(int argc, char** argv) {
  std::map<std::string, std::string> f;
  if (!ParseFlags(argc, argv, 2, {"target", "tenant", "seed", "serial", "max_sequences", "think_us"}, &f)) return 2;
  ClientArgs a;
  a.target = f["target"];
  if (f.count("tenant")) a.tenant = f["tenant"];
  if (!Number(f, "seed", &a.seed) || !Number(f, "serial", &a.serial) || !Number(f, "max_sequences", &a.max_sequences) ||
      !Number(f, "think_us", &a.think_us)) {
    return 2;
  }
  if (a.target.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  return RunClient(a);
}

int ControllerMain(int argc, char** argv) {
  std::map<std::string, std::string> f;
  if (!ParseFlags(argc, argv, 1,
                  {"kvarnd", "cycles", "clients", "seed", "grace_ms", "lease_ttl_ms", "keepalive_ms", "capacity",
                   "fp16_share", "daemon_kill_every", "cycle_ms", "think_us", "cpu_hog", "duration_budget_s", "json",
                   "keep_dir", "transcript", "help"},
                  &f)) {
    return 2;
  }
  if (f.count("help")) {
    std::cout << kUsage;
    return 0;
  }
  ControllerOptions o;
  o.kvarnd = f.count("kvarnd") ? f["kvarnd"] : KVARN_CHAOS_KVARND;
  o.self = SelfPath();
  if (!Number(f, "cycles", &o.cycles) || !Number(f, "clients", &o.clients) || !Number(f, "seed", &o.seed) ||
      !Number(f, "grace_ms", &o.grace_ms) || !Number(f, "lease_ttl_ms", &o.lease_ttl_ms) ||
      !Number(f, "keepalive_ms", &o.keepalive_ms) || !Number(f, "fp16_share", &o.fp16_share) ||
      !Number(f, "daemon_kill_every", &o.daemon_kill_every) || !Number(f, "cycle_ms", &o.cycle_ms) ||
      !Number(f, "think_us", &o.think_us) || !Number(f, "duration_budget_s", &o.duration_budget_s)) {
    return 2;
  }
  if (o.cycles < 0 || o.clients < 1 || o.grace_ms < 0 || o.lease_ttl_ms < 1 || o.keepalive_ms < 1 || o.cycle_ms < 1) {
    std::cerr << "kvarn_chaos: --cycles >= 0, --clients >= 1 and positive times, please\n";
    return 2;
  }
  if (f.count("capacity")) {
    o.capacity = f["capacity"];
  } else {
    // 16 MiB at fp16_share 0.5 holds 96 tail slots: 16 clients x 4 sequences, and the slots of
    // killed clients still in their grace period. Scale up beyond that.
    const int units = (o.clients * 6 + 95) / 96;
    o.capacity = std::to_string(16 * std::max(1, units)) + "MiB";
  }
  o.cpu_hog = Bool(f, "cpu_hog");
  o.keep_dir = Bool(f, "keep_dir");
  o.transcript = Bool(f, "transcript");
  o.json = f.count("json") ? f["json"] : "";
  if (access(o.kvarnd.c_str(), X_OK) != 0) {
    std::cerr << "kvarn_chaos: no kvarnd at " << o.kvarnd << " (pass --kvarnd=PATH)\n";
    return 2;
  }
  return RunController(o);
}

}  // namespace
}  // namespace kvarn::chaos

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "client") return kvarn::chaos::ClientMain(argc, argv);
  return kvarn::chaos::ControllerMain(argc, argv);
}
