// kvarn.Client and kvarn.Session over kvarn::Client and kvarn::Session (client/lib/client.h).
//
// Every call converts and checks its Python arguments with the GIL held (bad input is a
// ValueError or TypeError before anything is sent), releases the GIL around the C++ call
// (RPCs, staging into shared memory, attention), and raises the kvarn.Error for a failed
// status once it holds the GIL again.
//
// Lifetime: a Session keeps its Client alive (the C++ Session holds a raw Client*), and each
// call holds the C++ Session for its duration, so close() from another thread leaves the
// closing to the last call in flight instead of pulling the mapping from under it.
#include "python/src/client_bindings.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "python/src/arrays.h"
#include "python/src/proto_dict.h"
#include "python/src/session_handle.h"
#include "python/src/session_reads.h"
#include "python/src/status.h"

namespace kvarn::py {
namespace {

using pyb::ssize_t;

struct PyClient {
  std::shared_ptr<Client> client;
  std::string target;
};

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The K/V of n new tokens, checked against the session's layout: [n][L][H][D], one dtype.
// n < 0: as many tokens as the keys hold (stage).
struct KvInput {
  FloatInput keys, values;
  ssize_t tokens = 0;
};
KvInput AsKv(const Session& s, pyb::handle keys, pyb::handle values, ssize_t n,
             const std::string& call) {
  const BlockLayout& l = s.block_layout();
  ssize_t tokens = n;
  // Each array's shape is checked before it is converted (AsFloat): the keys first, whose
  // first dimension gives the token count when n < 0.
  const auto shape_of = [&](const char* name) {
    return [&, name](const pyb::array& a) {
      if (tokens < 0) tokens = a.ndim() == 4 ? a.shape(0) : 0;
      const std::vector<ssize_t> want = {tokens, l.num_layers, l.num_kv_heads, l.head_dim};
      if (HasShape(a, want)) return;
      ThrowValue(
          absl::StrCat(name, " has shape ", ShapeString(a), "; ", call,
                       " needs (tokens, num_layers, num_kv_heads, head_dim) = ", ShapeString(want),
                       n < 0 ? "" : absl::StrCat(" for ", n, n == 1 ? " token id" : " token ids")));
    };
  };
  KvInput kv{AsFloat(keys, "keys", /*allow_f16=*/true, shape_of("keys")), {}, 0};
  kv.values = AsFloat(values, "values", /*allow_f16=*/true, shape_of("values"));
  kv.tokens = tokens;
  if (kv.tokens == 0) ThrowValue(call + " needs at least one token");
  if (kv.tokens > std::numeric_limits<int>::max()) {
    ThrowValue(absl::StrCat(call, " of ", kv.tokens, " tokens: at most ",
                            std::numeric_limits<int>::max(), " in one call"));
  }
  MatchDtypes(&kv.keys, &kv.values, "keys", "values");
  return kv;
}

bool IsIndex(pyb::handle h) { return PyIndex_Check(h.ptr()) && !IsBool(h); }

// A sequence id: a non-negative int (or numpy integer).
uint64_t AsId(pyb::handle h, const std::string& what) {
  InPython in_python;  // h's __index__
  if (!IsIndex(h)) {
    ThrowType(what + " is " + std::string(pyb::str(pyb::type::handle_of(h).attr("__name__"))) +
              ", not an int id");
  }
  const pyb::int_ v = pyb::reinterpret_steal<pyb::int_>(PyNumber_Index(h.ptr()));
  if (!v) throw pyb::error_already_set();
  if (v < pyb::int_(0)) ThrowValue(what + " is negative; ids are non-negative ints");
  const unsigned long long id = PyLong_AsUnsignedLongLong(v.ptr());
  if (id == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    ThrowOverflow(what + " is " + std::string(pyb::str(pyb::handle(v))) + "; ids are below 2^64");
  }
  return id;
}

// Append or AppendInline of any number of tokens: split where the tail slot fills (the daemon
// seals it there), each part committed in turn. The K/V of a part are the caller's memory at
// an offset: no copy.
template <typename AppendFn>
AppendInfo AppendInParts(Session& s, uint64_t seq, std::span<const uint32_t> ids, const KvInput& kv,
                         AppendFn append) {
  const size_t token_bytes = static_cast<size_t>(kv.keys.array.nbytes()) / ids.size();
  const auto* k = static_cast<const uint8_t*>(kv.keys.data());
  const auto* v = static_cast<const uint8_t*>(kv.values.data());
  absl::StatusOr<SequenceTable> table = s.Table(seq);
  absl::StatusOr<AppendInfo> last = absl::UnknownError("nothing appended");
  bool sealed = false;
  {
    Release nogil;
    size_t done = 0;
    while (table.ok() && done < ids.size()) {
      const size_t room = TileTokens(s) - std::min<uint64_t>(table->tail_tokens, TileTokens(s));
      // A full slot (or tokens staged and not committed) is the C++ client's to report.
      const size_t n = room == 0 ? ids.size() - done : std::min(room, ids.size() - done);
      last = append(seq, ids.subspan(done, n), k + done * token_bytes, v + done * token_bytes,
                    kv.keys.dtype);
      if (!last.ok()) break;
      sealed = sealed || last->sealed;
      table = last->table;
      done += n;
    }
  }
  Check(table.status());
  AppendInfo info = Value(std::move(last));
  info.sealed = sealed;
  return info;
}

pyb::object CommitBatch(PySession& ps, pyb::iterable items) {
  InPython in_python;  // the caller's iterator
  std::shared_ptr<Session> s = ps.Get();
  std::vector<std::pair<uint64_t, std::vector<uint32_t>>> batch;
  size_t i = 0;
  for (pyb::handle item : items) {
    if (!pyb::isinstance<pyb::sequence>(item) || pyb::len(item) != 2) {
      ThrowType(absl::StrCat("commit_batch item ", i, " is not a (sequence, token_ids) pair"));
    }
    pyb::sequence pair = pyb::reinterpret_borrow<pyb::sequence>(item);
    const uint64_t seq = AsId(pair[0], absl::StrCat("commit_batch item ", i, "'s sequence"));
    TokenIds ids = AsTokenIds(pair[1], absl::StrCat("commit_batch item ", i, "'s token ids"));
    batch.emplace_back(seq, std::vector<uint32_t>(ids.ids().begin(), ids.ids().end()));
    ++i;
  }
  absl::StatusOr<std::vector<absl::StatusOr<AppendInfo>>> r;
  {
    Release nogil;
    r = s->CommitBatch(batch);
  }
  std::vector<absl::StatusOr<AppendInfo>> results = Value(std::move(r));
  pyb::list out;
  for (auto& item : results) {
    if (item.ok()) {
      out.append(pyb::cast(*item));
    } else {
      out.append(ErrorObject(item.status()));
    }
  }
  return out;
}

std::string TableRepr(const SequenceTable& t) {
  std::string blocks;
  for (uint32_t b : t.quant_blocks) absl::StrAppend(&blocks, blocks.empty() ? "" : ", ", b);
  return absl::StrCat("SequenceTable(tokens=", t.tokens,
                      ", has_sink=", t.has_sink ? "True" : "False", ", sink_block=", t.sink_block,
                      ", quant_blocks=[", blocks, "], tail_slot=", t.tail_slot,
                      ", tail_tokens=", t.tail_tokens, ")");
}

// A Layout field as a property whose setter takes what an IntArg argument takes (never a
// bool, never a number truncated through __int__).
template <uint32_t Layout::*F>
uint32_t GetField(const Layout& l) {
  return l.*F;
}
template <uint32_t Layout::*F>
void SetField(Layout& l, Int<uint32_t> v) {
  l.*F = v;
}

void BindTypes(pyb::module_& m) {
  pyb::class_<Layout>(m, "Layout", R"doc(
The shape of a model's KV cache, as OpenSession must declare it (``Client.layout()`` gives
the daemon's). Fields: ``model_id`` (str, part of the prefix-hash namespace), ``num_layers``,
``num_kv_heads``, ``head_dim`` (64, 128, 256 or 512), ``preset`` (codec preset name, e.g.
``"kvarn_k4v2_g128"``; the tile size follows from it) and ``sink_tokens`` (0 or the tile size).)doc")
      .def(pyb::init([](std::string model_id, Int<uint32_t> num_layers, Int<uint32_t> num_kv_heads,
                        Int<uint32_t> head_dim, std::string preset, Int<uint32_t> sink_tokens) {
             return Layout{std::move(model_id), num_layers, num_kv_heads, head_dim,
                           std::move(preset),   sink_tokens};
           }),
           pyb::arg("model_id") = "model", IntArg("num_layers") = 0, IntArg("num_kv_heads") = 0,
           IntArg("head_dim") = 128, pyb::arg("preset") = "kvarn_k4v2_g128",
           IntArg("sink_tokens") = 128, "A layout; every field is a keyword argument.")
      .def_readwrite("model_id", &Layout::model_id, "Model id (str).")
      .def_property("num_layers", GetField<&Layout::num_layers>, SetField<&Layout::num_layers>,
                    "Layers of the model.")
      .def_property("num_kv_heads", GetField<&Layout::num_kv_heads>,
                    SetField<&Layout::num_kv_heads>, "KV-heads per layer.")
      .def_property("head_dim", GetField<&Layout::head_dim>, SetField<&Layout::head_dim>,
                    "Head dimension.")
      .def_readwrite("preset", &Layout::preset, "Codec preset name.")
      .def_property("sink_tokens", GetField<&Layout::sink_tokens>, SetField<&Layout::sink_tokens>,
                    "fp16 sink tokens: 0 or the tile size.")
      .def("__eq__",
           [](const Layout& a, const Layout& b) {
             return a.model_id == b.model_id && a.num_layers == b.num_layers &&
                    a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim &&
                    a.preset == b.preset && a.sink_tokens == b.sink_tokens;
           })
      .def("__repr__", [](const Layout& l) {
        return absl::StrCat("Layout(model_id='", l.model_id, "', num_layers=", l.num_layers,
                            ", num_kv_heads=", l.num_kv_heads, ", head_dim=", l.head_dim,
                            ", preset='", l.preset, "', sink_tokens=", l.sink_tokens, ")");
      });

  pyb::class_<SequenceTable>(m, "SequenceTable", R"doc(
A sequence's blocks as the client last saw them (read-only): ``tokens`` committed;
``has_sink`` and ``sink_block`` (the fp16 sink block holding the first tile, when the layout
keeps one); ``quant_blocks`` (list of quantized block ids, in order; each holds one tile of
every layer and kv-head); ``tail_slot`` (this session's fp16 tail slot) and ``tail_tokens``
(committed tokens in it, fewer than a tile).)doc")
      .def_readonly("tokens", &SequenceTable::tokens, "Committed tokens.")
      .def_readonly("has_sink", &SequenceTable::has_sink, "Whether sink_block is valid.")
      .def_readonly("sink_block", &SequenceTable::sink_block, "fp16 sink block id.")
      .def_property_readonly(
          "quant_blocks", [](const SequenceTable& t) { return t.quant_blocks.vector(); },
          "Quantized block ids in order (list).")
      .def_readonly("tail_slot", &SequenceTable::tail_slot,
                    "The session's tail slot of this sequence.")
      .def_readonly("tail_tokens", &SequenceTable::tail_tokens,
                    "Committed tokens in the tail slot.")
      .def("__eq__",
           [](const SequenceTable& a, const SequenceTable& b) {
             return a.tokens == b.tokens && a.has_sink == b.has_sink &&
                    a.sink_block == b.sink_block && a.quant_blocks == b.quant_blocks &&
                    a.tail_slot == b.tail_slot && a.tail_tokens == b.tail_tokens;
           })
      .def("__repr__", &TableRepr);

  pyb::class_<SequenceInfo>(m, "SequenceInfo", R"doc(
A new sequence (``Session.create_sequence``, ``Session.fork``): ``id``, ``cached_tokens``
(tokens adopted from the prefix cache at creation; 0 for a fork) and ``table``. Unpacks as
``id, cached_tokens, table = session.create_sequence(prompt)``.)doc")
      .def_readonly("id", &SequenceInfo::id, "The sequence id.")
      .def_readonly("cached_tokens", &SequenceInfo::cached_tokens,
                    "Tokens adopted from the prefix cache.")
      .def_readonly("table", &SequenceInfo::table, "Its SequenceTable.")
      .def("__iter__",
           [](const SequenceInfo& i) {
             return pyb::iter(pyb::make_tuple(i.id, i.cached_tokens, pyb::cast(i.table)));
           })
      .def("__repr__", [](const SequenceInfo& i) {
        return absl::StrCat("SequenceInfo(id=", i.id, ", cached_tokens=", i.cached_tokens,
                            ", table=", TableRepr(i.table), ")");
      });

  pyb::class_<AppendInfo>(m, "AppendInfo", R"doc(
The result of a commit: ``table`` (the sequence's SequenceTable after it) and ``sealed``
(whether a tile filled and the daemon sealed it: quantized into a new block, or made the
sink).)doc")
      .def_readonly("table", &AppendInfo::table, "The SequenceTable after the commit.")
      .def_readonly("sealed", &AppendInfo::sealed, "Whether a tile was sealed.")
      .def("__repr__", [](const AppendInfo& a) {
        return absl::StrCat("AppendInfo(sealed=", a.sealed ? "True" : "False",
                            ", table=", TableRepr(a.table), ")");
      });
}

}  // namespace

void BindClient(pyb::module_& m) {
  BindTypes(m);
  // Session first, so that Client.open_session's signature names its type.
  pyb::class_<PySession> session(m, "Session", R"doc(
One session with kvarnd (``kvarn::Session``): its lease, its secret and its view of the
pool. Get one from ``Client.open_session``; ``close()`` (or leaving a ``with`` block, or
dropping the last reference) closes it. Once closed, every method raises
kvarn.NotFoundError, as the daemon answers for an ended session.

Sequences are ints (ids). Token ids are sequences of ints or 1-D integer arrays. K/V of new
tokens are arrays of shape (tokens, num_layers, num_kv_heads, head_dim), float16 or float32
(numpy arrays or torch CPU tensors), in the model's original frame: the client rotates them
into the storage frame as it writes them into the tail slot in shared memory. Arrays that are
C-contiguous float16/float32 are read in place (no copy); others are converted first.

Thread safety: methods may be called from any thread (they release the GIL while blocked);
calls on one sequence are serialized by the caller.)doc");

  pyb::class_<PyClient>(m, "Client", R"doc(
A connection to kvarnd (``kvarn::Client``).

``Client(target)`` connects to ``"unix:/path/to/kvarnd.sock"`` (a local daemon: sessions map
its pool) or ``"host:port"`` (a remote one: no shared memory; use ``append_inline`` and
``read``), and fails with ``kvarn.UnavailableError`` if the daemon does not answer within
``connect_timeout`` seconds. ``rpc_timeout`` (seconds) is the deadline of every unary call.
TLS (TCP targets): ``tls=True`` with PEM strings ``tls_root_certs`` (empty: the system's
roots), ``tls_cert_chain`` and ``tls_private_key`` (mutual TLS), ``tls_server_name``.
``map_pool=False`` opens sessions without shared memory even over a Unix socket.

Thread safety: methods may be called from any thread; blocking calls release the GIL.)doc")
      .def(pyb::init([](const std::string& target, double rpc_timeout, double connect_timeout,
                        bool map_pool, bool tls, std::string tls_root_certs,
                        std::string tls_cert_chain, std::string tls_private_key,
                        std::string tls_server_name) {
             // NaN fails both comparisons; inf (or anything past a century) is no deadline.
             if (!(rpc_timeout > 0) || !(connect_timeout > 0))
               ThrowValue("timeouts are positive seconds");
             if (target.find('\0') != std::string::npos) ThrowValue("target holds a NUL character");
             ClientOptions o;
             o.rpc_timeout = absl::Seconds(rpc_timeout);
             o.map_pool = map_pool;
             o.tls = tls;
             o.tls_root_certs = std::move(tls_root_certs);
             o.tls_cert_chain = std::move(tls_cert_chain);
             o.tls_private_key = std::move(tls_private_key);
             o.tls_server_name = std::move(tls_server_name);
             std::unique_ptr<Client> c = Blocking(
                 [&] { return Client::Connect(target, o, absl::Seconds(connect_timeout)); });
             return PyClient{std::shared_ptr<Client>(std::move(c)), target};
           }),
           pyb::arg("target"), pyb::kw_only(), pyb::arg("rpc_timeout") = 30.0,
           pyb::arg("connect_timeout") = 5.0, pyb::arg("map_pool") = true, pyb::arg("tls") = false,
           pyb::arg("tls_root_certs") = "", pyb::arg("tls_cert_chain") = "",
           pyb::arg("tls_private_key") = "", pyb::arg("tls_server_name") = "")
      .def_property_readonly(
          "target", [](const PyClient& c) { return c.target; }, "The target connected to.")
      .def_property_readonly(
          "rpc_timeout", [](const PyClient& c) { return Seconds(c.client->options().rpc_timeout); },
          "Deadline of every unary call, seconds.")
      .def(
          "describe",
          [](PyClient& c) { return MessageToDict(Blocking([&] { return c.client->Describe(); })); },
          R"doc(The daemon's description, no session: a dict with ``layout`` (dict), ``epoch``,
``backend`` ("host" or "cuda"), ``tile_tokens``, ``record_bytes``, ``capacity_bytes``,
``version``, ``tenants_authenticated``, ``max_message_bytes``, ``read_tokens_per_call``.)doc")
      .def(
          "layout",
          [](PyClient& c) {
            return Client::LayoutOf(Blocking([&] { return c.client->Describe(); }));
          },
          "The daemon's layout as a kvarn.Layout, what open_session declares by default.")
      .def(
          "open_session",
          [](PyClient& c, const std::string& tenant, std::optional<Layout> layout,
             Int<uint32_t> max_sequences, const std::string& tenant_token,
             const std::string& admin_token, const std::string& client_name, bool observer) {
            SessionOptions o;
            o.tenant = tenant;
            o.tenant_token = tenant_token;
            o.max_sequences = max_sequences;
            o.admin_token = admin_token;
            o.client_name = client_name;
            o.observer = observer;
            std::shared_ptr<Client> client = c.client;
            std::unique_ptr<Session> s =
                Blocking([&]() -> absl::StatusOr<std::unique_ptr<Session>> {
                  if (layout) {
                    o.layout = *layout;
                  } else {
                    auto d = client->Describe();
                    if (!d.ok()) return d.status();
                    o.layout = Client::LayoutOf(*d);
                  }
                  return client->OpenSession(o);
                });
            return std::make_unique<PySession>(ShareSession(std::move(s), client));
          },
          pyb::arg("tenant"), pyb::kw_only(), pyb::arg("layout") = pyb::none(),
          IntArg("max_sequences") = 0, pyb::arg("tenant_token") = "", pyb::arg("admin_token") = "",
          pyb::arg("client_name") = "python", pyb::arg("observer") = false,
          R"doc(Opens a session (a lease kept alive by a background thread of the C++ client).

``tenant``: the tenant label (with a tenants file, also ``tenant_token``). ``layout``: the
kvarn.Layout to declare; default the daemon's own (``Client.layout()``). ``max_sequences``:
tail slots to reserve (0: the daemon's default). ``admin_token`` grants admin operations;
``observer=True`` reserves no tail slots (status tools). Over a Unix socket the session maps
the pool (``Session.mapped``). Raises kvarn.InvalidArgumentError for a layout the daemon
does not serve, kvarn.UnauthenticatedError for a wrong tenant token,
kvarn.ResourceExhaustedError past a quota.)doc");

  session
      .def_property_readonly(
          "id", [](const PySession& s) { return s.Get()->id(); }, "The session id.")
      .def_property_readonly(
          "epoch", [](const PySession& s) { return s.Get()->epoch(); }, "The daemon's epoch.")
      .def_property_readonly("closed", &PySession::closed, "Whether close() was called.")
      .def_property_readonly(
          "alive", [](const PySession& s) { return !s.closed() && s.Get()->alive(); },
          "False once closed, or once the daemon ended the lease or restarted (every call then "
          "fails).")
      .def_property_readonly(
          "mapped", [](const PySession& s) { return s.Get()->mapped(); },
          "Whether the pool is mapped into this process (Unix socket targets).")
      .def_property_readonly(
          "tail_page_bytes", [](const PySession& s) { return s.Get()->tail_page_bytes(); },
          "The size of the pages behind this session's tail: the base page size, or the huge page "
          "size when kvarnd put it on huge pages (huge_pages = try or on); 0 when not mapped.")
      .def_property_readonly(
          "on_device", [](const PySession& s) { return s.Get()->on_device(); },
          "Whether the pool is in GPU memory (kvarnd --backend=cuda).")
      .def_property_readonly(
          "layout",
          [](const PySession& s) {
            const auto& l = s.Get()->pool().layout();
            return Layout{l.model_id(), l.num_layers(), l.num_kv_heads(),
                          l.head_dim(), l.preset(),     l.sink_tokens()};
          },
          "The pool's kvarn.Layout.")
      .def_property_readonly(
          "tile_tokens", [](const PySession& s) { return s.Get()->block_layout().tile_tokens; },
          "Tokens per tile (G): a tail slot holds up to G - 1 committed tokens.")
      .def_property_readonly(
          "pool", [](const PySession& s) { return MessageToDict(s.Get()->pool()); },
          "The pool description (dict): backend, layout, tile_tokens, record_bytes, block sizes, "
          "segments, "
          "tail_slots, epoch.")
      .def("close", &PySession::Close,
           "Closes the session at the daemon and unmaps the pool; idempotent. Its sequences are "
           "released. Calls in flight on other threads finish first: the session closes when "
           "the last of them returns; calls made after close() raise kvarn.NotFoundError.")
      .def("__enter__", [](pyb::object self) { return self; })
      .def("__exit__", [](PySession& s, pyb::args) { s.Close(); })
      .def("__repr__",
           [](const PySession& s) {
             if (s.closed()) return std::string("Session(closed)");
             return absl::StrCat("Session(id=", s.Get()->id(),
                                 ", mapped=", s.Get()->mapped() ? "True" : "False", ")");
           })
      .def(
          "create_sequence",
          [](PySession& ps, pyb::object prompt) {
            std::shared_ptr<Session> s = ps.Get();
            TokenIds ids = AsTokenIds(prompt, "prompt");
            return Blocking([&] { return s->CreateSequence(ids.ids()); });
          },
          pyb::arg("prompt"),
          R"doc(Creates a sequence for a prompt (token ids), adopting the longest cached prefix of
whole tiles (at most (len - 1) // G tiles: the last prompt token is always computed).
Returns a SequenceInfo: ``id, cached_tokens, table``; append the K/V of the prompt from
``cached_tokens`` on.)doc")
      .def(
          "lookup",
          [](PySession& ps, pyb::object prompt) {
            std::shared_ptr<Session> s = ps.Get();
            TokenIds ids = AsTokenIds(prompt, "prompt");
            return Blocking([&] { return s->Lookup(ids.ids()); });
          },
          pyb::arg("prompt"),
          "Tokens of this prompt the prefix cache holds (what create_sequence would adopt); "
          "changes nothing.")
      .def(
          "stage",
          [](PySession& ps, SequenceId seq, pyb::object keys, pyb::object values) {
            std::shared_ptr<Session> s = ps.Get();
            KvInput kv = AsKv(*s, keys, values, -1, "stage");
            Blocking([&] {
              return s->Stage(seq, static_cast<int>(kv.tokens), kv.keys.data(), kv.values.data(),
                              kv.keys.dtype);
            });
          },
          IntArg("sequence"), pyb::arg("keys"), pyb::arg("values"),
          R"doc(Writes the K/V of new tokens into the sequence's tail slot in shared memory (rotated,
fp16), after what is already staged; no RPC. ``commit`` then declares them with their token
ids. kvarn.InvalidArgumentError past the end of the tail slot or for NaN/Inf.)doc")
      .def(
          "commit",
          [](PySession& ps, SequenceId seq, pyb::object ids) {
            std::shared_ptr<Session> s = ps.Get();
            TokenIds t = AsTokenIds(ids, "token_ids");
            return Blocking([&] { return s->Commit(seq, t.ids()); });
          },
          IntArg("sequence"), pyb::arg("token_ids"),
          "Commits every staged token with its token id (as many ids as staged tokens); the daemon "
          "seals the tile "
          "when it fills. Returns an AppendInfo.")
      .def(
          "append",
          [](PySession& ps, SequenceId seq, pyb::object ids, pyb::object keys, pyb::object values) {
            std::shared_ptr<Session> s = ps.Get();
            TokenIds t = AsTokenIds(ids, "token_ids");
            KvInput kv = AsKv(*s, keys, values, static_cast<ssize_t>(t.ids().size()), "append");
            return AppendInParts(*s, seq, t.ids(), kv,
                                 [&](uint64_t q, auto part, const void* k, const void* v, DType d) {
                                   return s->Append(q, part, k, v, d);
                                 });
          },
          IntArg("sequence"), pyb::arg("token_ids"), pyb::arg("keys"), pyb::arg("values"),
          R"doc(Stages and commits the K/V of new tokens (``stage`` + ``commit``): keys and values
(len(token_ids), num_layers, num_kv_heads, head_dim). More tokens than the tail slot has
room for are appended in parts, split where each tile fills (each part committed in turn; an
error in a later part leaves the earlier ones committed). Returns the last part's AppendInfo,
``sealed`` if any part sealed a tile.)doc")
      .def(
          "append_inline",
          [](PySession& ps, SequenceId seq, pyb::object ids, pyb::object keys, pyb::object values) {
            std::shared_ptr<Session> s = ps.Get();
            TokenIds t = AsTokenIds(ids, "token_ids");
            KvInput kv =
                AsKv(*s, keys, values, static_cast<ssize_t>(t.ids().size()), "append_inline");
            return AppendInParts(*s, seq, t.ids(), kv,
                                 [&](uint64_t q, auto part, const void* k, const void* v, DType d) {
                                   return s->AppendInline(q, part, k, v, d);
                                 });
          },
          IntArg("sequence"), pyb::arg("token_ids"), pyb::arg("keys"), pyb::arg("values"),
          "As append, with the K/V carried in the request instead of shared memory (remote "
          "sessions).")
      .def(
          "commit_batch", &CommitBatch, pyb::arg("items"),
          R"doc(Commits the staged tokens of many sequences in one call: ``items`` is an iterable of
``(sequence, token_ids)`` pairs. Returns a list with one entry per item: its AppendInfo, or
the kvarn.Error instance (not raised) for an item that failed. Errors of the whole call (an
ended session, a stale epoch) are raised.)doc")
      .def(
          "fork",
          [](PySession& ps, SequenceId seq) {
            return Blocking([&, s = ps.Get()] { return s->Fork(seq); });
          },
          IntArg("sequence"),
          "A new sequence sharing every sealed block of this one (the partial tail is copied). "
          "Returns a "
          "SequenceInfo.")
      .def(
          "release",
          [](PySession& ps, pyb::object seqs) {
            InPython in_python;  // the caller's iterator
            std::shared_ptr<Session> s = ps.Get();
            std::vector<uint64_t> ids;
            if (IsIndex(seqs)) {
              ids.push_back(AsId(seqs, "sequences"));
            } else {
              for (pyb::handle h : seqs) ids.push_back(AsId(h, "a sequence in sequences"));
            }
            Blocking([&] { return s->Release(ids); });
          },
          pyb::arg("sequences"),
          "Releases a sequence (an int) or several (an iterable of ints); sealed blocks stay "
          "cached for prefix hits.")
      .def(
          "table", [](const PySession& ps, SequenceId seq) { return Value(ps.Get()->Table(seq)); },
          IntArg("sequence"),
          "The sequence's SequenceTable as the daemon last returned it (no RPC).")
      .def("attend", &Attend, IntArg("sequence"), IntArg("layer"), pyb::arg("queries"),
           pyb::arg("out") = pyb::none(), pyb::arg("return_lse") = false,
           R"doc(Decode attention of one layer over the whole sequence, read in place from shared
memory (fp16 sink, quantized tiles, fp16 tail; no RPC). ``queries``: (num_query_heads,
head_dim), original frame, num_query_heads a multiple of num_kv_heads (grouped-query
attention: query head i reads kv-head i // (num_query_heads // num_kv_heads)); softmax scale
1/sqrt(head_dim). Returns float32 (num_query_heads, head_dim) (a torch tensor for torch
queries), or writes into ``out`` (a writable C-contiguous float32 numpy array of that
shape) and returns it. With ``return_lse=True`` returns ``(out, lse)``: lse (num_query_heads,)
is the natural log of the softmax denominator over the sequence (scaled scores), so the result
merges exactly with attention over tokens not committed yet (a decode step's own token):
``w = exp(lse - m), u = exp(s_new - m)``, ``(w * out + u * v_new) / (w + u)``. On host and
CUDA pools.)doc")
      .def("dequantize", &Dequantize, IntArg("sequence"), IntArg("layer") = pyb::none(),
           R"doc(The sequence's K/V as the pool holds them, dequantized, original frame, float32:
``(keys, values)`` of shape (tokens, num_layers, num_kv_heads, head_dim), the layout append
takes, or (tokens, num_kv_heads, head_dim) for one ``layer``. Read in place from the mapped
pool (sink and tail converted from fp16, tiles decoded by the codec); a session without a
host mapping (remote, or a pool in GPU memory) reads through the Read RPC instead.)doc")
      .def(
          "dequantize_block", &DequantizeBlock, IntArg("block"), IntArg("layer") = pyb::none(),
          IntArg("head") = pyb::none(),
          R"doc(One quantized block dequantized in place (``Session::DequantizeBlock``), original frame,
float32: ``(keys, values)`` of shape (num_layers, num_kv_heads, G, head_dim), or without the
leading axes fixed by ``layer`` and ``head``.)doc")
      .def(
          "block_bytes",
          [](const PySession& ps, BlockId block) {
            std::shared_ptr<Session> s = ps.Get();
            const BlockLayout& l = s->block_layout();
            if (!s->mapped() || s->on_device()) {
              ThrowStatus(absl::FailedPreconditionError(
                  "block_bytes needs the pool mapped in host memory"));
            }
            const uint32_t blocks =
                s->pool().quant_segments_size() > 0 ? s->pool().quant_segments(0).blocks() : 0;
            if (block >= blocks)
              ThrowValue(
                  absl::StrCat("block ", block.value, " is out of range: the pool has ", blocks));
            pyb::array_t<uint8_t> out({static_cast<ssize_t>(l.num_layers),
                                       static_cast<ssize_t>(l.num_kv_heads),
                                       static_cast<ssize_t>(l.record_bytes)});
            std::memcpy(out.mutable_data(), s->QuantBlock(block), l.quant_block_bytes());
            return out;
          },
          IntArg("block"),
          "A copy of a quantized block's raw bytes, uint8 (num_layers, num_kv_heads, "
          "record_bytes): one codec record "
          "per (layer, kv-head), as kvarn.codec.decode reads them.")
      .def(
          "read",
          [](PySession& ps, SequenceId seq, Int<uint32_t> layer, Int<uint64_t> start_arg,
             std::optional<Int<uint32_t>> count) {
            const uint64_t start = start_arg;
            std::shared_ptr<Session> s = ps.Get();
            CheckLayer(*s, static_cast<int>(layer));
            const SequenceTable t = Value(s->Table(seq));
            if (start > t.tokens)
              ThrowValue(
                  absl::StrCat("start ", start, " is past the sequence's ", t.tokens, " tokens"));
            const uint32_t n = count ? count->value : static_cast<uint32_t>(t.tokens - start);
            std::vector<float> k, v;
            if (n > 0) Blocking([&] { return s->Read(seq, layer, start, n, &k, &v); });
            const BlockLayout& l = s->block_layout();
            const std::vector<ssize_t> shape = {static_cast<ssize_t>(n), l.num_kv_heads,
                                                l.head_dim};
            pyb::array_t<float> keys = NewF32(shape), values = NewF32(shape);
            if (k.size() != static_cast<size_t>(keys.size()) || v.size() != k.size()) {
              ThrowStatus(absl::InternalError("kvarnd's Read reply has the wrong size"));
            }
            std::copy(k.begin(), k.end(), keys.mutable_data());
            std::copy(v.begin(), v.end(), values.mutable_data());
            return pyb::make_tuple(keys, values);
          },
          IntArg("sequence"), IntArg("layer"), IntArg("start") = 0, IntArg("count") = pyb::none(),
          "Dequantized K/V of tokens [start, start + count) of one layer through the Read RPC (the "
          "daemon decodes; "
          "works remotely): (keys, values) float32 (count, num_kv_heads, head_dim). count defaults "
          "to the rest.")
      .def(
          "stats",
          [](PySession& ps) {
            return MessageToDict(Blocking([s = ps.Get()] { return s->Stats(); }));
          },
          "The daemon's Stats (dict): capacity and bytes by block state, block counts, sessions, "
          "sequences, prefix "
          "queried and hit tokens, seals, evictions, epoch, preset, per-session and per-tenant "
          "rows.")
      .def(
          "list_sequences",
          [](PySession& ps) {
            return MessageToDict(Blocking([s = ps.Get()] { return s->ListSequences(); }));
          },
          "The daemon's ListSequences (dict).")
      .def(
          "evict",
          [](PySession& ps, const std::string& scope, Int<uint64_t> bytes,
             const std::string& tenant) {
            v1::EvictRequest::Scope sc;
            if (scope == "tenant") {
              sc = v1::EvictRequest::SCOPE_TENANT;
            } else if (scope == "bytes") {
              sc = v1::EvictRequest::SCOPE_BYTES;
            } else if (scope == "all") {
              sc = v1::EvictRequest::SCOPE_ALL;
            } else {
              ThrowValue("evict scope '" + scope + "' is not 'tenant', 'bytes' or 'all'");
            }
            std::shared_ptr<Session> s = ps.Get();
            return MessageToDict(Blocking([&] { return s->Evict(sc, bytes, tenant); }));
          },
          pyb::arg("scope") = "tenant", pyb::kw_only(), IntArg("bytes") = 0,
          pyb::arg("tenant") = "",
          R"doc(Evicts unreferenced cached blocks: scope ``"tenant"`` (the caller's tenant's, or
``tenant`` for admins), ``"bytes"`` (at least ``bytes``, least recently used first; admin) or
``"all"`` (admin). Returns a dict with ``blocks`` and ``bytes`` evicted.
kvarn.PermissionDeniedError without the admin token.)doc")
      .def(
          "resident",
          [](const PySession& ps) {
            const Session::MemoryUse u = Value(ps.Get()->Resident());
            pyb::dict d;
            d["quant"] = u.quant;
            d["sink"] = u.sink;
            d["tail"] = u.tail;
            return d;
          },
          "Bytes allocated behind the segments this session was lent (dict: quant, sink, tail); "
          "host pools only.");
}

}  // namespace kvarn::py
