#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "tests/common/spawn.h"

namespace kvarn::it {
namespace {

using ::kvarn::testing::CommandLine;
using ::kvarn::testing::SpawnOptions;
using ::kvarn::testing::SpawnProcess;
using ::kvarn::testing::SpawnUser;
using ::kvarn::testing::Stdio;

constexpr std::chrono::milliseconds kStartTimeout{15000};

std::string ShmPrefix(const std::string& instance) { return absl::StrCat("kvarnd.", instance, "."); }

// What every child of the tests gets: SIGKILL on the test's death, so a test that aborts (an
// assertion, a sanitizer report, ctest's timeout) leaves no process behind; and `who`, when
// given, as its user (SpawnProcess arms the signal after the uid change, which clears it).
SpawnOptions TiedToTest(const std::optional<RunAs>& who) {
  SpawnOptions options;
  options.parent_death_signal = SIGKILL;
  if (who.has_value()) options.user = SpawnUser{who->uid, who->gid};
  return options;
}

// Whether a user other than the file's owner and group may execute `path`: the file and every
// directory above it have their "other" execute bit. (The unprivileged user owns none of the
// build tree.)
bool OthersMayExecute(const std::filesystem::path& path) {
  std::filesystem::path at;
  for (const std::filesystem::path& part : std::filesystem::absolute(path)) {
    at /= part;
    struct stat st;
    if (stat(at.c_str(), &st) != 0 || (st.st_mode & S_IXOTH) == 0) return false;
  }
  return true;
}

// The path `who` runs `binary` from. A build tree other users cannot reach (a checkout in
// root's home, mode 0700, when the tests run as root) would make every exec as `who` fail
// with EACCES; the binary is then copied, once per process, into a directory of its own
// that everyone may read and search, and run from there.
absl::StatusOr<std::string> ExecutablePath(const std::string& binary,
                                           const std::optional<RunAs>& who) {
  if (!who.has_value() || OthersMayExecute(binary)) return binary;
  static Mutex mu;
  static TempDir copies;  // removed at exit; the children die with this process
  MutexLock lock(&mu);
  if (chmod(copies.path().c_str(), 0755) != 0)
    return absl::InternalError("chmod of the binaries' directory");
  const std::string copy = copies.path() + "/" + std::filesystem::path(binary).filename().string();
  std::error_code ec;
  if (!std::filesystem::exists(copy, ec)) {
    std::filesystem::copy_file(binary, copy, ec);
    if (ec || chmod(copy.c_str(), 0755) != 0) {
      return absl::InternalError(absl::StrCat("cannot copy ", binary, " where uid ", who->uid,
                                              " may run it: ", ec.message()));
    }
  }
  return copy;
}

}  // namespace

std::string KvarndBinary() { return KVARN_IT_KVARND; }
std::string TestClientBinary() { return KVARN_IT_TEST_CLIENT; }
std::string AttackerBinary() { return KVARN_IT_ATTACKER; }
std::string PromtoolBinary() {
  const char* env = std::getenv("KVARN_PROMTOOL");
  return env != nullptr ? env : KVARN_IT_PROMTOOL;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/kvit.XXXXXX";
  const char* p = mkdtemp(tmpl);
  path_ = p != nullptr ? p : "/tmp";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
}

std::optional<RunAs> UnprivilegedUser() {
  if (geteuid() != 0) return std::nullopt;
  return RunAs{65534, 65534};  // nobody / nogroup
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string UniqueInstance() {
  static std::atomic<int> counter{0};
  return absl::StrCat("it-", getpid(), "-", counter.fetch_add(1));
}

std::vector<std::string> NamedSegments(const std::string& instance) {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  const std::string prefix = ShmPrefix(instance);
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<DaemonSegment>> DaemonSegments(pid_t pid) {
  const std::string dir_path = absl::StrCat("/proc/", pid, "/fd");
  DIR* dir = opendir(dir_path.c_str());
  if (dir == nullptr) {
    if (errno == EACCES || errno == EPERM) {
      return absl::PermissionDeniedError(absl::StrCat("cannot read ", dir_path, " (kvarnd is not dumpable; needs root)"));
    }
    return absl::NotFoundError(absl::StrCat("cannot read ", dir_path, ": ", std::strerror(errno)));
  }
  std::vector<DaemonSegment> out;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string fd_path = dir_path + "/" + e->d_name;
    char target[512];
    const ssize_t n = readlink(fd_path.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = 0;
    const std::string link = target;
    static const std::string kMemfd = "/memfd:kvarnd.";
    if (link.rfind(kMemfd, 0) != 0) continue;
    DaemonSegment seg;
    seg.name = link.substr(7, link.find(' ') == std::string::npos ? std::string::npos : link.find(' ') - 7);
    struct stat st;
    if (stat(fd_path.c_str(), &st) == 0) {
      seg.size = static_cast<uint64_t>(st.st_size);
      seg.allocated = static_cast<uint64_t>(st.st_blocks) * 512;
    }
    out.push_back(std::move(seg));
  }
  closedir(dir);
  std::sort(out.begin(), out.end(), [](const DaemonSegment& a, const DaemonSegment& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<std::vector<DaemonSegment>> AwaitDaemonSegments(pid_t pid, size_t count,
                                                               std::chrono::milliseconds timeout) {
  const double until = NowMs() + static_cast<double>(timeout.count());
  absl::StatusOr<std::vector<DaemonSegment>> segs = DaemonSegments(pid);
  while (segs.ok() && segs->size() > count && NowMs() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    segs = DaemonSegments(pid);
  }
  return segs;
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions o) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->dir_ = std::make_unique<TempDir>();
  d->instance_ = o.instance.empty() ? UniqueInstance() : o.instance;
  d->socket_path_ = o.socket_path.empty() ? d->dir_->path() + "/kvarnd.sock" : o.socket_path;
  d->log_path_ = d->dir_->path() + "/kvarnd.log";
  if (o.run_as.has_value() && chown(d->dir_->path().c_str(), o.run_as->uid, o.run_as->gid) != 0) {
    return absl::InternalError(absl::StrCat("cannot hand ", d->dir_->path(), " to uid ", o.run_as->uid));
  }
  const Layout l = SmallLayout();
  std::vector<std::string> args = {
      "--listen=" + d->socket_path_,
      "--metrics=127.0.0.1:0",
      "--instance=" + d->instance_,
      "--model_id=" + l.model_id,
      absl::StrCat("--num_layers=", l.num_layers),
      absl::StrCat("--num_kv_heads=", l.num_kv_heads),
      absl::StrCat("--head_dim=", l.head_dim),
      "--preset=" + l.preset,
      absl::StrCat("--sink_tokens=", l.sink_tokens),
      "--capacity=16MiB",
      "--default_tail_slots=8",
      "--grace_ms=100",
      "--drain_ms=1000",  // a test stopping a daemon with sessions open waits this long at most
      "--log_level=info",
  };
  if (!o.config_file.empty()) {
    args = {"--config=" + o.config_file, "--listen=" + d->socket_path_, "--metrics=127.0.0.1:0",
            "--instance=" + d->instance_, "--drain_ms=1000"};
  }
  args.insert(args.end(), o.extra_flags.begin(), o.extra_flags.end());
  const int log = open(d->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log < 0) return absl::InternalError(absl::StrCat("cannot create ", d->log_path_));
  const bool own_pid_namespace = o.own_pid_namespace;
  SpawnOptions spawn = TiedToTest(o.run_as);
  spawn.stdin_from = Stdio::DevNull();
  spawn.stdout_to = Stdio::Fd(log);
  spawn.stderr_to = Stdio::Fd(log);
  spawn.new_pid_namespace = own_pid_namespace;
  const absl::StatusOr<std::string> binary = ExecutablePath(KvarndBinary(), o.run_as);
  if (!binary.ok()) {
    close(log);
    return binary.status();
  }
  const absl::StatusOr<pid_t> spawned = SpawnProcess(CommandLine(*binary, args), spawn);
  close(log);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;
  d->pid_ = pid;
  const double until = NowMs() + static_cast<double>(kStartTimeout.count());
  for (;;) {
    const std::string text = d->Log();
    const size_t at = text.find("event=kvarnd_started");
    if (at != std::string::npos && text.find('\n', at) != std::string::npos) {
      const std::string line = text.substr(at, text.find('\n', at) - at);
      const auto f = ParseFields(line);
      d->metrics_port_ = static_cast<int>(FieldU64(f, "metrics_port"));
      d->tcp_port_ = static_cast<int>(FieldU64(f, "tcp_port"));
      d->epoch_ = FieldU64(f, "epoch");
      if (FieldU64(f, "pid") != static_cast<uint64_t>(own_pid_namespace ? 1 : pid)) {
        return absl::InternalError(absl::StrCat("kvarnd_started names pid ", f.count("pid") ? f.at("pid") : "?"));
      }
      break;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      d->pid_ = -1;
      return absl::InternalError(absl::StrCat("kvarnd exited at start (status ", status, "): ", text));
    }
    if (NowMs() > until) return absl::DeadlineExceededError(absl::StrCat("kvarnd did not start: ", text));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The started line comes after the gRPC server is up; a connect proves it.
  auto c = d->Connect();
  if (!c.ok()) return c.status();
  return d;
}

Daemon::~Daemon() {
  if (pid_ > 0) Kill();
}

std::string Daemon::Log() const { return ReadFile(log_path_); }

bool Daemon::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

absl::StatusOr<int> Daemon::Stop(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("kvarnd is not running");
  kill(pid_, SIGTERM);
  auto status = ::kvarn::testing::AwaitExit(pid_, timeout);
  if (!status.ok()) {
    Kill();
    return status.status();
  }
  pid_ = -1;
  return *status;
}

absl::StatusOr<int> Daemon::AwaitExit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("kvarnd is not running");
  auto status = ::kvarn::testing::AwaitExit(pid_, timeout);
  if (status.ok()) pid_ = -1;
  return status;
}

void Daemon::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  ::kvarn::testing::AwaitExit(pid_, std::chrono::seconds(10)).IgnoreError();
  pid_ = -1;
}

absl::StatusOr<std::unique_ptr<Client>> Daemon::Connect() const {
  ClientOptions o;
  o.rpc_timeout = absl::Seconds(20);
  return Client::Connect(target(), o, absl::Seconds(10));
}

absl::StatusOr<std::unique_ptr<Child>> Child::Spawn(const std::string& binary, const std::vector<std::string>& args,
                                                    std::optional<RunAs> run_as) {
  const absl::StatusOr<std::string> path = ExecutablePath(binary, run_as);
  if (!path.ok()) return path.status();
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return absl::InternalError("pipe");
  }
  SpawnOptions spawn = TiedToTest(run_as);
  spawn.stdin_from = Stdio::Fd(in[0]);
  spawn.stdout_to = Stdio::Fd(out[1]);
  const absl::StatusOr<pid_t> pid = SpawnProcess(CommandLine(*path, args), spawn);
  close(in[0]);
  close(out[1]);
  if (!pid.ok()) {
    close(in[1]);
    close(out[0]);
    return pid.status();
  }
  std::unique_ptr<Child> c(new Child());
  c->pid_ = *pid;
  c->in_ = in[1];
  c->out_ = out[0];
  return c;
}

Child::~Child() {
  KillAndReap();
  if (in_ >= 0) close(in_);
  if (out_ >= 0) close(out_);
}

absl::StatusOr<std::string> Child::ReadLine(std::chrono::milliseconds timeout) {
  const double until = NowMs() + static_cast<double>(timeout.count());
  for (;;) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      absl::StrAppend(&transcript_, line, "\n");
      return line;
    }
    if (eof_) return absl::OutOfRangeError(absl::StrCat("child ", pid_, " closed its stdout; transcript:\n", transcript_, buffer_));
    const double left = until - NowMs();
    if (left <= 0) return absl::DeadlineExceededError(absl::StrCat("no line from child ", pid_, "; transcript:\n", transcript_));
    pollfd p{out_, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min(left, 1000.0)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof_ = true;
      continue;
    }
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

absl::StatusOr<std::string> Child::WaitFor(const std::string& prefix, std::chrono::milliseconds timeout) {
  const double until = NowMs() + static_cast<double>(timeout.count());
  for (;;) {
    const double left = std::max(1.0, until - NowMs());
    auto line = ReadLine(std::chrono::milliseconds(static_cast<int64_t>(left)));
    if (!line.ok()) return line.status();
    if (line->rfind(prefix, 0) == 0) return line;
    if (line->rfind("ERROR", 0) == 0) return absl::InternalError(absl::StrCat("child reported: ", *line));
  }
}

bool Child::WriteLine(const std::string& line) {
  if (in_ < 0) return false;
  const std::string s = line + "\n";
  return write(in_, s.data(), s.size()) == static_cast<ssize_t>(s.size());
}

void Child::CloseStdin() {
  if (in_ >= 0) close(in_);
  in_ = -1;
}

bool Child::Signal(int sig) { return pid_ > 0 && kill(pid_, sig) == 0; }

absl::StatusOr<int> Child::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  auto s = ::kvarn::testing::AwaitExit(pid_, timeout);
  if (s.ok()) pid_ = -1;
  return s;
}

void Child::KillAndReap() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  kill(pid_, SIGCONT);  // a stopped child dies on SIGKILL too, but be explicit
  ::kvarn::testing::AwaitExit(pid_, std::chrono::seconds(10)).IgnoreError();
  pid_ = -1;
}

std::map<std::string, std::string> ParseFields(const std::string& line) {
  std::map<std::string, std::string> f;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) continue;
    std::string v = word.substr(eq + 1);
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    f[word.substr(0, eq)] = v;
  }
  return f;
}

uint64_t FieldU64(const std::map<std::string, std::string>& f, const std::string& key) {
  auto it = f.find(key);
  uint64_t v = 0;
  if (it == f.end() || !absl::SimpleAtoi(it->second, &v)) return UINT64_MAX;
  return v;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  auto reply = HttpGetReply(port, path);
  if (!reply.ok()) return reply.status();
  if (reply->first != 200) return absl::InternalError(absl::StrCat("HTTP status ", reply->first, ": ", reply->second));
  return reply->second;
}

absl::StatusOr<std::pair<int, std::string>> HttpGetReply(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(errno)));
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n");
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::InternalError("send");
  }
  std::string resp;
  char buf[8192];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t head_end = resp.find("\r\n\r\n");
  if (head_end == std::string::npos) return absl::InternalError(absl::StrCat("malformed HTTP response: ", resp));
  int code = 0;
  if (resp.rfind("HTTP/1.", 0) != 0 || resp.size() < 12 || !absl::SimpleAtoi(resp.substr(9, 3), &code)) {
    return absl::InternalError(absl::StrCat("malformed HTTP status line: ", resp.substr(0, resp.find("\r\n"))));
  }
  return std::make_pair(code, resp.substr(head_end + 4));
}

absl::StatusOr<std::pair<int, std::string>> RunWithInput(const std::string& binary, const std::vector<std::string>& args,
                                                         const std::string& input) {
  TempDir dir;
  const std::string in_path = dir.path() + "/in", out_path = dir.path() + "/out";
  {
    std::ofstream f(in_path, std::ios::binary);
    f << input;
    if (!f) return absl::InternalError("cannot write input file");
  }
  const int in = open(in_path.c_str(), O_RDONLY | O_CLOEXEC);
  const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (in < 0 || out < 0) return absl::InternalError("cannot open input/output files");
  SpawnOptions spawn = TiedToTest(std::nullopt);
  spawn.stdin_from = Stdio::Fd(in);
  spawn.stdout_to = Stdio::Fd(out);
  spawn.stderr_to = Stdio::Fd(out);
  const absl::StatusOr<pid_t> spawned = SpawnProcess(CommandLine(binary, args), spawn);
  close(in);
  close(out);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;
  auto status = ::kvarn::testing::AwaitExit(pid, std::chrono::seconds(30));
  if (!status.ok()) {
    kill(pid, SIGKILL);
    ::kvarn::testing::AwaitExit(pid, std::chrono::seconds(5)).IgnoreError();
    return status.status();
  }
  return std::make_pair(*status, ReadFile(out_path));
}

absl::StatusOr<ProcessOutput> RunProcess(const std::string& binary, const std::vector<std::string>& args,
                                         const std::vector<std::string>& env, std::chrono::milliseconds timeout) {
  TempDir dir;
  const std::string out_path = dir.path() + "/out", err_path = dir.path() + "/err";
  // The child's environment: this process's, changed by `env`.
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& change) {
      return change.substr(0, change.find('=')) == name;
    });
    if (!replaced) envs.push_back(entry);
  }
  for (const std::string& change : env) {
    if (change.find('=') != std::string::npos) envs.push_back(change);
  }
  const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0 || err < 0) return absl::InternalError("cannot open the output files");
  SpawnOptions spawn = TiedToTest(std::nullopt);
  spawn.stdin_from = Stdio::DevNull();
  spawn.stdout_to = Stdio::Fd(out);
  spawn.stderr_to = Stdio::Fd(err);
  spawn.environment = std::move(envs);
  const absl::StatusOr<pid_t> spawned = SpawnProcess(CommandLine(binary, args), spawn);
  close(out);
  close(err);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;
  auto status = ::kvarn::testing::AwaitExit(pid, timeout);
  if (!status.ok()) {
    kill(pid, SIGKILL);
    ::kvarn::testing::AwaitExit(pid, std::chrono::seconds(5)).IgnoreError();
    return status.status();
  }
  return ProcessOutput{*status, ReadFile(out_path), ReadFile(err_path)};
}

std::optional<double> MetricValue(const std::string& text, const std::string& name, const std::string& labels) {
  const std::string key = name + labels + " ";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const std::string v = line.substr(key.size());
    if (v == "+Inf") return INFINITY;
    double d;
    if (absl::SimpleAtod(v.substr(0, v.find(' ')), &d)) return d;
  }
  return std::nullopt;
}

double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace kvarn::it
