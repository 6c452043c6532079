// kvarn::Client: the C++ library an inference worker links to use kvarnd.
//
//   auto client = kvarn::Client::Connect("unix:/run/kvarnd/kvarnd.sock");
//   auto session = (*client)->OpenSession({.tenant = "team-a", .layout = layout});
//   auto seq = (*session)->CreateSequence(prompt_ids);        // adopts a cached prefix
//   (*session)->Append(seq->id, ids, keys, values, DType::kF16);  // writes the tail in place,
//   commits
//   (*session)->Attend(seq->id, layer, queries, num_q_heads, out); // reads shared memory, no RPC
//
// A Session holds the session's credential (a secret the daemon issued; every call presents
// it), maps the pool once (quantized and sink blocks read-only, its own tail slots
// writable) and holds the lease: a background thread streams keep-alives; destroying the
// Session closes it and unmaps everything. Blocks a sequence references never change and
// are never evicted, so reads in place need no locking.
//
// The memory comes by descriptor, not by name: over a Unix socket target the Session asks
// the daemon's descriptor channel (the socket's path plus ".fd") for its segments, which the
// daemon lends to this process only. Over TCP (a remote client) there is no shared memory:
// Stage, Attend and the block pointers fail with FAILED_PRECONDITION, and AppendInline and
// Read carry the K/V in the messages.
//
// Thread safety: Client and Session methods may be called from any thread. While a call
// staging or committing a sequence runs (Stage, StageDevice, MarkStaged, Commit, Append,
// AppendInline, an item of CommitBatch or of a CommitRing), those calls, TailSlot and Fork of
// the same sequence from other threads fail FAILED_PRECONDITION, as kvarnd fails a second
// append in flight: of Appends racing on one sequence, each lands whole or fails so. Stage
// then Commit are two calls, so a worker staging and committing one sequence from several
// threads serializes them itself; so it does Attend, DequantizeBlock and TailSlot's pointer
// with appends of the same sequence (they read the tail in place, which a sealing append
// rewrites), and Release of a sequence another thread is using.
//
// CUDA pools (pool().backend() == BACKEND_CUDA, kvarnd --backend=cuda): the blocks live in
// GPU memory. The Session maps each slab through CUDA IPC, once per process however many
// sessions use it (in the daemon's own process it uses the daemon's pointers), and
// QuantBlock, SinkBlock and TailSlot return device pointers. Stage, Attend and
// DequantizeBlock keep their host-memory signatures (they copy in and out); StageDevice and
// AttendDevice take device pointers and a stream. The append contract: everything written
// into a tail slot must be complete on the device before Commit is sent, because the daemon
// reads the slot on its own streams without waiting for the worker's. Stage and StageDevice
// wait for their stream before returning; a worker writing the tail with its own kernels
// synchronizes its stream, or records an event after them and passes it to Commit, then
// declares the tokens with MarkStaged. A library built without CUDA fails OpenSession on a
// CUDA pool with UNIMPLEMENTED.
#ifndef KVARN_CLIENT_LIB_CLIENT_H_
#define KVARN_CLIENT_LIB_CLIENT_H_

#include <atomic>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/shared_memory.h"
#include "kernels/block_layout.h"
#include "kernels/codec.h"
#include "kvarn/v1/kvarn.grpc.pb.h"

// CUDA's stream and event types (cudaStream_t is CUstream_st*, cudaEvent_t CUevent_st*),
// so this header needs no CUDA include.
struct CUstream_st;
struct CUevent_st;

namespace kvarn {

class DevicePool;  // client/lib/cuda_pool.h
class CommitRing;  // client/lib/commit_ring.h
namespace ring {
struct Completion;  // common/commit_ring.h
}

struct Layout {
  std::string model_id = "model";
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 128;
  std::string preset = "kvarn_k4v2_g128";
  uint32_t sink_tokens = 128;
};

struct SessionOptions {
  std::string tenant;
  std::string tenant_token;  // when the daemon authenticates tenants (Describe says so)
  Layout layout;
  uint32_t max_sequences = 0;  // tail slots; 0 = the daemon's default
  std::string admin_token;
  std::string client_name;
  bool observer = false;  // no tail slots: for status tools that create no sequences
};

struct ClientOptions {
  absl::Duration rpc_timeout = absl::Seconds(30);  // deadline of every unary call
  // TLS for TCP targets (kvarnd's tls_cert): PEM contents. root_certs verifies the daemon
  // (empty: the system's roots); cert_chain and private_key identify this client when the
  // daemon requires mutual TLS; server_name overrides the name checked in its certificate.
  bool tls = false;
  std::string tls_root_certs, tls_cert_chain, tls_private_key, tls_server_name;
  // Map the pool (Unix socket targets only). False: a session without shared memory, as a
  // remote client has.
  bool map_pool = true;
};

// The ids of a sequence's quantized blocks, in order: a list with value semantics whose
// copies share one array until one of them changes. Every commit returns the sequence's
// table, and a 128K-token sequence holds 1,024 ids: copying them per commit made a decode
// step's cost grow with its context (docs/commit_ring.md, "Block tables by reference"). A
// copy costs one reference count; push_back and assign build a new array, so other copies
// keep what they held. Reads as a const std::vector<uint32_t> (vector() or the conversion).
class BlockIds {
 public:
  using value_type = uint32_t;
  using size_type = size_t;
  using const_iterator = std::vector<uint32_t>::const_iterator;
  using iterator = const_iterator;

  BlockIds() = default;
  BlockIds(std::vector<uint32_t> ids)  // NOLINT(google-explicit-constructor): a vector is one
      : ids_(ids.empty() ? nullptr
                         : std::make_shared<const std::vector<uint32_t>>(std::move(ids))) {}
  BlockIds(std::initializer_list<uint32_t> ids) : BlockIds(std::vector<uint32_t>(ids)) {}

  const std::vector<uint32_t>& vector() const { return ids_ != nullptr ? *ids_ : Empty(); }
  operator const std::vector<uint32_t>&() const { return vector(); }  // NOLINT: reads as one

  size_t size() const { return vector().size(); }
  bool empty() const { return vector().empty(); }
  uint32_t operator[](size_t i) const { return vector()[i]; }
  uint32_t front() const { return vector().front(); }
  uint32_t back() const { return vector().back(); }
  const uint32_t* data() const { return vector().data(); }
  const_iterator begin() const { return vector().begin(); }
  const_iterator end() const { return vector().end(); }

  void push_back(uint32_t id) {
    std::vector<uint32_t> ids;
    ids.reserve(size() + 1);
    ids.assign(begin(), end());
    ids.push_back(id);
    *this = BlockIds(std::move(ids));
  }
  template <class It>
  void assign(It first, It last) {
    *this = BlockIds(std::vector<uint32_t>(first, last));
  }

  friend bool operator==(const BlockIds& a, const BlockIds& b) { return a.vector() == b.vector(); }
  friend bool operator==(const BlockIds& a, const std::vector<uint32_t>& b) {
    return a.vector() == b;
  }

 private:
  static const std::vector<uint32_t>& Empty() {
    static const std::vector<uint32_t> empty;
    return empty;
  }
  std::shared_ptr<const std::vector<uint32_t>> ids_;
};

// A sequence's blocks as the client last saw them.
struct SequenceTable {
  uint64_t tokens = 0;
  bool has_sink = false;
  uint32_t sink_block = 0;
  BlockIds quant_blocks;
  uint32_t tail_slot = 0;
  uint32_t tail_tokens = 0;
};

struct SequenceInfo {
  uint64_t id = 0;
  uint64_t cached_tokens = 0;  // adopted from the prefix cache at creation
  SequenceTable table;
};

struct AppendInfo {
  SequenceTable table;
  bool sealed = false;
};

class Session;

class Client {
 public:
  // target: "unix:/path" or "host:port". Fails if the daemon does not answer its health
  // check within the timeout.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         ClientOptions options = {},
                                                         absl::Duration connect_timeout = absl::Seconds(5));
  absl::StatusOr<std::unique_ptr<Session>> OpenSession(const SessionOptions& options);
  // The daemon's layout (what OpenSession must declare), epoch and backend; no session.
  absl::StatusOr<v1::DescribeResponse> Describe();
  // The daemon's layout as SessionOptions::layout expects it.
  static Layout LayoutOf(const v1::DescribeResponse& d);

  v1::KvCache::Stub& stub() { return *stub_; }
  const ClientOptions& options() const { return options_; }
  // The daemon's Unix socket path, or empty for a TCP target.
  const std::string& socket_path() const { return socket_path_; }

 private:
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options, std::string socket_path);
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  ClientOptions options_;
  std::string socket_path_;
};

class Session {
 public:
  ~Session();  // closes the session (best effort) and unmaps the pool
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  uint64_t id() const { return id_; }
  uint64_t epoch() const { return epoch_; }
  const BlockLayout& block_layout() const { return layout_; }
  const Preset& preset() const { return preset_; }
  const v1::PoolDescription& pool() const { return pool_; }
  // False once the daemon ended the lease or restarted; every call then fails.
  bool alive() const { return alive_.load(); }
  // Whether the pool is mapped into this process (Unix socket targets).
  bool mapped() const { return mapped_; }
  // The size of the pages behind this session's tail segment: the base page size, or the huge
  // page size when kvarnd put it on huge pages (huge_pages = try or on); 0 when not mapped.
  size_t tail_page_bytes() const { return tail_.page_bytes(); }

  absl::StatusOr<SequenceInfo> CreateSequence(std::span<const uint32_t> prompt);
  absl::StatusOr<uint64_t> Lookup(std::span<const uint32_t> prompt);
  // Lookup's whole reply: the prefix by tier (the pool's, then each tier's continuation).
  // `prefetch` onboards what the tiers hold into the pool first (LookupRequest.prefetch).
  absl::StatusOr<v1::LookupResponse> LookupTiers(std::span<const uint32_t> prompt, bool prefetch = false);
  // The session's prefix-hash namespace (common/prefix_hash.h): a prompt's block hashes are
  // ChainHash over it, as Watch events name them. Empty from a daemon that does not say.
  const std::string& prefix_namespace() const { return prefix_namespace_; }

  // Writes n tokens' K/V, original frame, laid out [n][num_layers][num_kv_heads][head_dim]
  // (fp16 bits or fp32), rotated into the storage frame, into the sequence's tail slot after
  // what is already staged. INVALID_ARGUMENT past the tail or for NaN/Inf. Stage, StageDevice,
  // MarkStaged, TailSlot, Commit, CommitBatch, AppendInline and Fork of a sequence whose ring
  // commit is in flight (published by CommitRing::Publish, not yet collected) fail
  // FAILED_PRECONDITION, and keep failing so for a sequence whose ring commit's outcome is
  // unknown (the ring failed before kvarnd answered: Release is what is left for it).
  absl::Status Stage(uint64_t seq, int n, const void* keys, const void* values, DType dtype);
  // CUDA pools: as Stage with K/V in device memory, enqueued on `stream` (null: the calling
  // thread's per-thread default stream), which it waits for before returning. Bad input is
  // found by the kernel (INVALID_ARGUMENT) and may leave the unstaged positions partly
  // written. FAILED_PRECONDITION for a host pool.
  absl::Status StageDevice(uint64_t seq, int n, const void* keys, const void* values, DType dtype,
                           CUstream_st* stream);
  // Declares n tokens the worker wrote into the tail slot itself (at TailSlot's position), so
  // Commit accepts their ids. INVALID_ARGUMENT past the tail. On a CUDA pool the writes must
  // be complete before Commit (see above).
  absl::Status MarkStaged(uint64_t seq, int n);
  // Commits every staged token with its token id (ids.size() must equal the staged count).
  absl::StatusOr<AppendInfo> Commit(uint64_t seq, std::span<const uint32_t> ids);
  // CUDA pools: waits for `ready` (an event the worker recorded after its tail writes), then
  // commits. FAILED_PRECONDITION for a host pool.
  absl::StatusOr<AppendInfo> Commit(uint64_t seq, std::span<const uint32_t> ids, CUevent_st* ready);
  // Stage + Commit.
  absl::StatusOr<AppendInfo> Append(uint64_t seq, std::span<const uint32_t> ids, const void* keys,
                                    const void* values, DType dtype);
  // Commits staged tokens of many sequences in one call. The outer status is the call's
  // (the session's errors: NOT_FOUND, stale epoch, draining); then one status per item,
  // INVALID_ARGUMENT for an item whose ids do not match its staged count (checked before
  // the call, as Commit does; such an item is not sent).
  absl::StatusOr<std::vector<absl::StatusOr<AppendInfo>>> CommitBatch(
      const std::vector<std::pair<uint64_t, std::vector<uint32_t>>>& items);
  // The session's commit ring (client/lib/commit_ring.h): CommitBatch without an RPC, for
  // workers that commit every decode step. Once per session (ALREADY_EXISTS after);
  // FAILED_PRECONDITION without shared memory. The Session must outlive it.
  absl::StatusOr<std::unique_ptr<CommitRing>> OpenCommitRing();
  // The K/V travel in the request instead of shared memory.
  absl::StatusOr<AppendInfo> AppendInline(uint64_t seq, std::span<const uint32_t> ids, const void* keys,
                                          const void* values, DType dtype);
  absl::StatusOr<SequenceInfo> Fork(uint64_t seq);
  absl::Status Release(std::span<const uint64_t> seqs);

  // The sequence's table as last returned by the daemon.
  absl::StatusOr<SequenceTable> Table(uint64_t seq) const;
  // Pointer to the sequence's writable tail slot (for a worker's own store kernel; a device
  // pointer on a CUDA pool), and the token position where the next staged token goes. The
  // slot is token-major (BlockLayout): token t's rows start at t * fp16_token_bytes(), and
  // (layer, kv-head)'s key and value rows at Fp16KeysOffset / Fp16ValuesOffset in them.
  absl::StatusOr<std::pair<uint8_t*, int>> TailSlot(uint64_t seq) const;

  // Decode attention of one layer over the sequence, straight from shared memory:
  // queries [num_q_heads][head_dim] (original frame), num_q_heads a multiple of the kv-heads
  // (grouped-query attention); out [num_q_heads][head_dim]. lse, when not null, receives
  // [num_q_heads] log-sum-exp of the scaled scores (Codec::AttendDecode), to merge with
  // attention over tokens not in the pool yet (a decode step's own token); on a CUDA pool
  // the kernel computes it (cuda::AttendArgs::lse).
  absl::Status Attend(uint64_t seq, int layer, const float* queries, int num_q_heads, float* out,
                      float* lse = nullptr) const;
  // CUDA pools: Attend with queries and out in device memory, enqueued on `stream` (null:
  // the per-thread default stream) after whatever the worker enqueued there; returns once
  // the stream has completed it. FAILED_PRECONDITION for a host pool.
  absl::Status AttendDevice(uint64_t seq, int layer, const float* queries, int num_q_heads, float* out,
                            CUstream_st* stream) const;
  // Dequantizes one (layer, kv-head) tile of a quantized block, original frame, [G][D].
  absl::Status DequantizeBlock(uint32_t block, int layer, int head, float* keys, float* values) const;
  // Pointers into the mapped pool (device pointers on a CUDA pool).
  const uint8_t* QuantBlock(uint32_t block) const;
  const uint8_t* SinkBlock(uint32_t block) const;
  // Whether the pool is in GPU memory (BACKEND_CUDA).
  bool on_device() const { return device_ != nullptr; }
  // Memory allocated behind the segments this session was lent, as the kernel counts it
  // (whoever touched the pages): the shared quantized and sink segments and its own tail.
  // Host pools only.
  struct MemoryUse {
    uint64_t quant = 0, sink = 0, tail = 0;
  };
  absl::StatusOr<MemoryUse> Resident() const;

  // RPC wrappers. Read returns [count][kv_heads][head_dim] keys and values, in as many calls
  // as the daemon's per-call limit needs.
  absl::Status Read(uint64_t seq, uint32_t layer, uint64_t start, uint32_t count, std::vector<float>* keys,
                    std::vector<float>* values);
  absl::StatusOr<v1::StatsResponse> Stats();
  absl::StatusOr<v1::ListSequencesResponse> ListSequences();
  absl::StatusOr<v1::EvictResponse> Evict(v1::EvictRequest::Scope scope, uint64_t bytes = 0,
                                          const std::string& tenant = "");
  // Streams block events until `on_event` returns false or the stream ends.
  absl::Status Watch(const std::function<bool(const v1::BlockEvent&)>& on_event);
  v1::SessionRef Ref() const;

 private:
  friend class Client;
  friend class CommitRing;
  struct SeqState {
    SequenceTable table;
    int staged = 0;
    // A ring commit of it is published and not yet collected (CommitRing::Publish): where
    // the next token goes depends on its outcome.
    bool in_ring = false;
    // Its last ring commit's outcome is unknown (the ring failed before kvarnd answered it):
    // kvarnd may still apply it, so the table and the staged count may be stale, and another
    // commit could append its tokens twice. Only Release frees it.
    bool outcome_unknown = false;
    // A call staging or committing it runs (Claim): another thread's would write the same
    // tail positions, or record the two answers in either order.
    bool claimed = false;
  };
  // FAILED_PRECONDITION while `st` has a ring commit in flight or of unknown outcome, or is
  // claimed.
  static absl::Status CheckIdle(uint64_t seq, const SeqState& st);
  // CheckIdle for `seq` when this session knows it (else OK: kvarnd decides).
  absl::Status CheckIdleIfKnown(uint64_t seq) const ABSL_LOCKS_EXCLUDED(mu_);
  // Claims `seq` for one call that stages or commits it, until Unclaim: NOT_FOUND when this
  // session does not know it, else CheckIdle's status.
  absl::Status Claim(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_);
  void Unclaim(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_);
  // Stage (device_input: StageDevice's) and Commit of a sequence the caller claimed.
  absl::Status StageClaimed(uint64_t seq, int n, const void* keys, const void* values, DType dtype,
                            bool device_input, CUstream_st* stream) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<AppendInfo> CommitClaimed(uint64_t seq, std::span<const uint32_t> ids)
      ABSL_LOCKS_EXCLUDED(mu_);
  Session(Client* client, const v1::OpenSessionResponse& open, const Preset& preset);
  absl::Status MapPool();
  // FAILED_PRECONDITION unless the pool is mapped (a remote session has none).
  absl::Status CheckMapped() const;
  void KeepAliveLoop();
  // Records the daemon's table (merging one with omitted blocks) and returns the full table.
  SequenceTable Remember(uint64_t seq, const v1::BlockTable& table) ABSL_LOCKS_EXCLUDED(mu_);
  SequenceTable RememberLocked(uint64_t seq, const v1::BlockTable& table) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a ring commit's result (the table's block ids change only when it sealed) and
  // ends its flight; INTERNAL when it does not follow the table held (the sequence is then
  // of unknown outcome), FAILED_PRECONDITION when the sequence was released meanwhile.
  absl::StatusOr<SequenceTable> RememberCommitLocked(uint64_t seq, const ring::Completion& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the flight of ring commits that kvarnd refused (`unknown` false: the sequence is
  // free again) or whose outcome is unknown (`unknown` true: blocked until Release).
  void EndRingFlight(std::span<const uint64_t> seqs, bool unknown) ABSL_LOCKS_EXCLUDED(mu_);
  void EndRingFlightLocked(uint64_t seq, bool unknown) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  grpc::ClientContext* Prepare(grpc::ClientContext* ctx) const;
  absl::Status Check(const grpc::Status& s);
  // Bases of the mapped slabs, host or device.
  uint8_t* QuantBase() const;
  uint8_t* SinkBase() const;
  uint8_t* TailBase() const;
  // The table of `seq`, after checking its ids against the pool.
  absl::StatusOr<SequenceTable> CheckedTable(uint64_t seq, int layer, int num_q_heads) const;

  Client* client_;
  uint64_t id_;
  uint64_t epoch_;
  std::string secret_;
  v1::PoolDescription pool_;
  std::string prefix_namespace_;
  uint32_t read_tokens_per_call_ = 0;
  Preset preset_;
  BlockLayout layout_;
  absl::Duration keepalive_interval_;
  FdMapping quant_, sink_, tail_;
  std::unique_ptr<DevicePool> device_;  // CUDA pools: the mapped slabs (the FdMappings are empty)
  bool mapped_ = false;
  std::atomic<bool> alive_{true};
  std::atomic<bool> stop_{false};
  std::unique_ptr<grpc::ClientContext> keepalive_ctx_;
  std::thread keepalive_;
  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, SeqState> seqs_ ABSL_GUARDED_BY(mu_);
};

// absl::Status for a gRPC status (the codes share numbers).
absl::Status FromGrpc(const grpc::Status& s);

}  // namespace kvarn

#endif  // KVARN_CLIENT_LIB_CLIENT_H_
