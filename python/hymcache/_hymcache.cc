// _hymcache: the pybind11 extension under the `hymcache` Python package, a
// thin layer over the C++ SDK (client/client.h, client/block_key.h). It
// converts Python arguments to the SDK's types and the SDK's results and
// statuses back; every decision (lookups, placement, deadlines, chains) is
// the SDK's.
//
// Buffers: load() and store() take Python objects that export the buffer
// protocol (numpy arrays, bytearray, memoryview, mmap) or DLPack
// (__dlpack__: torch tensors and the like, in host memory). Each is held
// (PyObject_GetBuffer) for the duration of the call, or until a store is
// done, and the SDK reads into or writes from its memory directly: no copy.
// Load and the waits of a store release the GIL.
//
// Thread safety: a Client may be used from several Python threads at once
// (the SDK is thread-safe). Python-side state of the wrappers (the held
// buffers of stores in flight, registered buffers) is only touched with the
// GIL held.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/block_key.h"
#include "client/client.h"
#include "client/options.h"
#include "common/cluster_stats.h"
#include "common/status_reason.h"

namespace py = pybind11;

namespace hymcache::python {
namespace {

// A non-OK absl::Status on its way to Python; the translator registered in
// the module raises the hymcache.errors class of its code.
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

[[noreturn]] void Throw(absl::Status status) {
  throw StatusError(std::move(status));
}

[[noreturn]] void ThrowInvalid(std::string message) {
  Throw(absl::InvalidArgumentError(std::move(message)));
}

template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  if (!v.ok()) Throw(v.status());
  return *std::move(v);
}

// The hymcache.errors exception (an instance) for a non-OK status.
py::object ErrorObject(const absl::Status& status) {
  return py::module_::import("hymcache.errors")
      .attr("_from_status")(static_cast<int>(status.code()),
                            std::string(status.message()),
                            std::string(ReasonName(ReasonOf(status))));
}

// An absolute deadline from seconds-from-now; None = the client's default.
absl::Time DeadlineFrom(std::optional<double> seconds) {
  if (!seconds.has_value()) return absl::InfinitePast();
  if (!std::isfinite(*seconds) || *seconds < 0) {
    ThrowInvalid(absl::StrCat("deadline must be finite seconds >= 0, not ",
                              *seconds));
  }
  return absl::Now() + absl::Seconds(*seconds);
}

// Element formats (struct module syntax) whose bytes are plain data. Object
// arrays (format 'O') hold PyObject pointers: writing KV bytes into them
// would corrupt the interpreter.
bool PlainFormat(const char* format) {
  if (format == nullptr) return true;  // unsigned bytes
  std::string f = format;
  size_t start = f.find_first_not_of("@=<>!");
  if (start == std::string::npos) return false;
  f = f.substr(start);
  if (f.size() == 1) {
    return std::string("?bBhHiIlLqQnNefdgc").find(f[0]) != std::string::npos;
  }
  return f == "Zf" || f == "Zd" || f == "Zg";
}

// DLPack's legacy exchange ABI (the "dltensor" capsule, dlpack.h v0.x), the
// part read here. Debian has no dlpack header; these mirror the spec's
// layout.
struct DLDevice {
  int32_t device_type;  // 1 = CPU, 3 = CUDA host (pinned) memory
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // int, uint, float, bfloat, complex, bool: all plain data
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDAHost = 3;

// A Python buffer held for as long as this object lives (released with the
// GIL held: destroy only under the GIL). Move-only.
class HeldBuffer {
 public:
  // Takes `obj`'s buffer (or, for an object with __dlpack__ and no buffer
  // protocol, its DLPack tensor). InvalidArgument naming buffer `index` when
  // it is neither, not contiguous, of an object dtype, not in host memory,
  // or read-only while `writable` is required.
  static HeldBuffer Acquire(py::handle obj, bool writable, size_t index) {
    if (!PyObject_CheckBuffer(obj.ptr()) && py::hasattr(obj, "__dlpack__")) {
      return AcquireDlpack(obj, index);
    }
    HeldBuffer held;
    if (PyObject_GetBuffer(obj.ptr(), &held.view_,
                           PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      ThrowInvalid(absl::StrCat(
          "buffer ", index, ": a ", Py_TYPE(obj.ptr())->tp_name,
          " exports neither the buffer protocol nor DLPack (use a numpy "
          "array, bytearray, memoryview or a CPU tensor)"));
    }
    held.held_ = true;
    held.data_ = held.view_.buf;
    held.size_ = static_cast<size_t>(held.view_.len);
    if (writable && held.view_.readonly) {
      ThrowInvalid(absl::StrCat("buffer ", index, ": a ",
                                Py_TYPE(obj.ptr())->tp_name,
                                " is read-only; load needs writable memory "
                                "(bytearray, a writable numpy array)"));
    }
    if (!PyBuffer_IsContiguous(&held.view_, 'A')) {
      ThrowInvalid(absl::StrCat("buffer ", index,
                                ": not contiguous (a strided view); pass a "
                                "contiguous array or slice"));
    }
    if (!PlainFormat(held.view_.format)) {
      ThrowInvalid(absl::StrCat("buffer ", index, ": element format '",
                                held.view_.format,
                                "' is not plain data (object or structured "
                                "dtypes cannot hold KV bytes)"));
    }
    return held;
  }

  HeldBuffer() = default;
  HeldBuffer(HeldBuffer&& o) noexcept { *this = std::move(o); }
  HeldBuffer& operator=(HeldBuffer&& o) noexcept {
    if (this != &o) {
      Release();
      view_ = o.view_;
      held_ = std::exchange(o.held_, false);
      dl_ = std::exchange(o.dl_, nullptr);
      data_ = o.data_;
      size_ = o.size_;
    }
    return *this;
  }
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;
  ~HeldBuffer() { Release(); }

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  // A tensor from obj.__dlpack__() (legacy capsule), owned until Release.
  // DLPack has no read-only flag: its tensors count as writable.
  static HeldBuffer AcquireDlpack(py::handle obj, size_t index) {
    py::object capsule;
    try {
      capsule = obj.attr("__dlpack__")();
    } catch (py::error_already_set& e) {
      ThrowInvalid(absl::StrCat("buffer ", index, ": __dlpack__ failed: ",
                                e.what()));
    }
    auto* dl = static_cast<DLManagedTensor*>(
        PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (dl == nullptr) {
      PyErr_Clear();
      ThrowInvalid(absl::StrCat("buffer ", index,
                                ": __dlpack__ returned no unused 'dltensor' "
                                "capsule"));
    }
    // Ours now: the capsule's destructor must not free it.
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");
    HeldBuffer held;
    held.dl_ = dl;
    const DLTensor& t = dl->dl_tensor;
    if (t.device.device_type != kDLCPU &&
        t.device.device_type != kDLCUDAHost) {
      ThrowInvalid(absl::StrCat(
          "buffer ", index, ": a DLPack tensor on device type ",
          t.device.device_type,
          " (not host memory); load into a host (pinned) pool"));
    }
    const uint64_t item_bits =
        static_cast<uint64_t>(t.dtype.bits) * std::max<uint16_t>(t.dtype.lanes, 1);
    if (t.dtype.code > 6 || item_bits % 8 != 0) {
      ThrowInvalid(absl::StrCat("buffer ", index, ": DLPack dtype code ",
                                t.dtype.code, " / ", t.dtype.bits,
                                " bits is not plain byte-sized data"));
    }
    uint64_t elements = 1;
    int64_t expect_stride = 1;
    bool contiguous = true;
    for (int32_t d = t.ndim - 1; d >= 0; --d) {
      if (t.shape[d] < 0) ThrowInvalid("DLPack tensor with a negative shape");
      if (t.strides != nullptr && t.shape[d] > 1 &&
          t.strides[d] != expect_stride) {
        contiguous = false;
      }
      expect_stride *= t.shape[d];
      elements *= static_cast<uint64_t>(t.shape[d]);
    }
    if (!contiguous) {
      ThrowInvalid(absl::StrCat("buffer ", index,
                                ": not contiguous (a strided DLPack tensor); "
                                "pass a contiguous tensor"));
    }
    held.data_ = static_cast<char*>(t.data) + t.byte_offset;
    held.size_ = static_cast<size_t>(elements * (item_bits / 8));
    return held;
  }

  void Release() {
    if (held_) {
      PyBuffer_Release(&view_);
      held_ = false;
    }
    if (dl_ != nullptr) {
      if (dl_->deleter != nullptr) dl_->deleter(dl_);
      dl_ = nullptr;
    }
  }

  Py_buffer view_{};
  bool held_ = false;
  DLManagedTensor* dl_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Holds every buffer of `buffers` (a sequence as long as `keys`).
std::vector<HeldBuffer> HoldAll(const py::sequence& buffers, size_t keys,
                                bool writable) {
  const size_t n = py::len(buffers);
  if (n != keys) {
    ThrowInvalid(absl::StrCat(keys, " keys but ", n, " buffers"));
  }
  std::vector<HeldBuffer> held;
  held.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    held.push_back(HeldBuffer::Acquire(buffers[i], writable, i));
  }
  return held;
}

// The SDK's view of held buffers (MutableBuffer or ConstBuffer).
template <typename Buffer>
std::vector<Buffer> Views(const std::vector<HeldBuffer>& held) {
  std::vector<Buffer> out;
  out.reserve(held.size());
  for (const HeldBuffer& h : held) out.push_back({h.data(), h.size()});
  return out;
}

// Runs the SDK call `f` with the GIL released: it may block on the network,
// and other Python threads run meanwhile. `f` touches no Python object.
template <typename F>
auto WithoutGil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

// Token ids from a sequence of ints or a contiguous int32/int64 array.
std::vector<int32_t> TokensFrom(py::handle obj) {
  if (PyObject_CheckBuffer(obj.ptr())) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) ==
        0) {
      std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> release(
          &view, PyBuffer_Release);
      std::string f = view.format ? view.format : "B";
      f.erase(0, f.find_first_not_of("@=<>!"));
      const size_t n = static_cast<size_t>(view.len / view.itemsize);
      std::vector<int32_t> out(n);
      if (view.itemsize == 4 && (f == "i" || f == "l")) {
        const auto* p = static_cast<const int32_t*>(view.buf);
        out.assign(p, p + n);
        return out;
      }
      if (view.itemsize == 8 && (f == "l" || f == "q")) {
        const auto* p = static_cast<const int64_t*>(view.buf);
        for (size_t i = 0; i < n; ++i) {
          if (p[i] < INT32_MIN || p[i] > INT32_MAX) {
            ThrowInvalid(absl::StrCat("token id ", p[i], " at ", i,
                                      " does not fit in int32"));
          }
          out[i] = static_cast<int32_t>(p[i]);
        }
        return out;
      }
      // Other element types: through the sequence protocol below.
    } else {
      PyErr_Clear();
    }
  }
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj) ||
      py::isinstance<py::bytes>(obj)) {
    ThrowInvalid("token_ids must be a sequence of ints or an int array");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  std::vector<int32_t> out;
  out.reserve(py::len(seq));
  for (size_t i = 0; i < py::len(seq); ++i) {
    py::object item = seq[i];
    long long v = PyLong_AsLongLong(py::int_(item).ptr());
    if ((v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
      PyErr_Clear();
      ThrowInvalid(absl::StrCat("token id at ", i, " does not fit in int32"));
    }
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

// Python views of the SDK's results.
struct PyLoadResult {
  size_t loaded = 0;
  std::vector<uint64_t> lengths;
  size_t hit_prefix = 0;
  uint64_t bytes = 0;
  py::object stop_reason = py::none();
};

struct PyStoreResult {
  size_t stored = 0;
  size_t skipped = 0;
  size_t failed = 0;
  size_t refused = 0;
  uint32_t node_id = 0;
  std::vector<std::string> outcomes;
  py::list errors;  // per key: None or a hymcache.Error
};

const char* OutcomeName(PutOutcome o) {
  switch (o) {
    case PutOutcome::kStored:
      return "stored";
    case PutOutcome::kAlreadyStored:
      return "already_stored";
    case PutOutcome::kInProgress:
      return "in_progress";
    case PutOutcome::kFailed:
      return "failed";
  }
  return "failed";
}

PyStoreResult ToPython(const PutResult& r) {
  PyStoreResult out;
  out.stored = r.stored;
  out.skipped = r.skipped;
  out.failed = r.failed;
  out.refused = r.refused;
  out.node_id = r.node_id;
  for (PutOutcome o : r.outcomes) out.outcomes.push_back(OutcomeName(o));
  for (const absl::Status& s : r.errors) {
    out.errors.append(s.ok() ? py::none() : ErrorObject(s));
  }
  return out;
}

// The future of one store(): the SDK's StoreHandle plus the Python buffers
// it reads from, held until the store is done.
class StoreFuture {
 public:
  StoreFuture(std::shared_ptr<StoreHandle> handle,
              std::vector<HeldBuffer> buffers)
      : handle_(std::move(handle)), buffers_(std::move(buffers)) {}

  // GIL held. Releases the buffers once the store is done.
  bool Done() {
    if (!handle_->Done()) return false;
    buffers_.clear();
    return true;
  }

  PyStoreResult Result(std::optional<double> timeout) {
    absl::Time deadline = absl::InfiniteFuture();
    if (timeout.has_value()) {
      if (!std::isfinite(*timeout) || *timeout < 0) {
        ThrowInvalid("timeout must be finite seconds >= 0");
      }
      deadline = absl::Now() + absl::Seconds(*timeout);
    }
    absl::StatusOr<PutResult> r =
        WithoutGil([&] { return handle_->Wait(deadline); });
    if (!handle_->Done()) {
      Throw(absl::DeadlineExceededError(
          "store not finished within the timeout (it goes on)"));
    }
    buffers_.clear();
    return ToPython(Unwrap(std::move(r)));
  }

  // With the GIL released (the client's close).
  void WaitDone() { handle_->Wait(absl::InfiniteFuture()).IgnoreError(); }

 private:
  const std::shared_ptr<StoreHandle> handle_;
  std::vector<HeldBuffer> buffers_;  // GIL
};

// A call's reference to the SDK client (GIL held). The last reference
// destroys the client with the GIL released: its destructor waits for the
// client's background work.
class ClientRef {
 public:
  explicit ClientRef(std::shared_ptr<Client> client)
      : client_(std::move(client)) {}
  ClientRef(const ClientRef&) = delete;
  ClientRef& operator=(const ClientRef&) = delete;
  ~ClientRef() {
    if (client_.use_count() == 1) {
      py::gil_scoped_release release;
      client_.reset();
    }
  }
  Client& operator*() const { return *client_; }

 private:
  std::shared_ptr<Client> client_;
};

// hymcache.Client.
class PyClient {
 public:
  PyClient(py::object masters, const std::string& transport, double deadline,
           double store_deadline, const std::string& auth_token,
           const std::string& tls_ca_file, const std::string& tls_cert_file,
           const std::string& tls_key_file, const std::string& tls_server_name,
           int store_threads, int max_pending_stores, int master_connections,
           const std::string& grpc_poll_strategy, py::object etcd,
           const std::string& cluster, int64_t location_cache_entries,
           double location_cache_ttl) {
    ClientOptions o;
    std::vector<std::string> list;
    if (py::isinstance<py::str>(masters)) {
      // "A" or "A,B,C".
      list = absl::StrSplit(masters.cast<std::string>(), ',');
    } else if (!masters.is_none()) {  // None: etcd names the leader
      list = masters.cast<std::vector<std::string>>();
    }
    std::vector<std::string> etcd_endpoints;
    if (py::isinstance<py::str>(etcd)) {
      etcd_endpoints =
          absl::StrSplit(etcd.cast<std::string>(), ',', absl::SkipEmpty());
    } else if (!etcd.is_none()) {
      etcd_endpoints = etcd.cast<std::vector<std::string>>();
    }
    for (const std::string& e : etcd_endpoints) {
      if (e.empty() || e.find(',') != std::string::npos) {
        ThrowInvalid(absl::StrCat("etcd: '", e, "' is not one host:port"));
      }
    }
    o.etcd_endpoints = absl::StrJoin(etcd_endpoints, ",");
    o.cluster = cluster;
    // Several masters: one leads, calls follow it (docs/ha.md).
    if (list.empty() && etcd_endpoints.empty()) {
      ThrowInvalid("masters: at least one address expected (or etcd=)");
    }
    for (const std::string& a : list) {
      if (a.empty() || a.find(',') != std::string::npos) {
        ThrowInvalid(absl::StrCat("masters: '", a, "' is not one host:port"));
      }
    }
    o.master_address = absl::StrJoin(list, ",");
    o.transport = Unwrap(ParseTransportKind(transport));
    if (!std::isfinite(deadline) || !std::isfinite(store_deadline)) {
      ThrowInvalid("deadline and store_deadline must be finite seconds");
    }
    o.default_deadline = absl::Seconds(deadline);
    o.default_store_deadline = absl::Seconds(store_deadline);
    o.auth_token = auth_token;
    o.tls_ca_file = tls_ca_file;
    o.tls_cert_file = tls_cert_file;
    o.tls_key_file = tls_key_file;
    o.tls_server_name = tls_server_name;
    o.store_threads = store_threads;
    o.max_pending_stores = max_pending_stores;
    if (location_cache_entries < 0 || location_cache_entries > UINT32_MAX) {
      ThrowInvalid("location_cache_entries must be in 0..2^32-1");
    }
    if (!std::isfinite(location_cache_ttl)) {
      ThrowInvalid("location_cache_ttl must be finite seconds");
    }
    o.location_cache_entries = static_cast<uint32_t>(location_cache_entries);
    o.location_cache_ttl = absl::Seconds(location_cache_ttl);
    o.master_connections = master_connections;
    o.grpc_poll_strategy = grpc_poll_strategy;
    client_ = Unwrap(WithoutGil([&] { return Client::Create(o); }));
  }

  ~PyClient() { Close(); }

  // GIL held. Waits for the stores in flight (each bounded by its
  // deadline), unregisters the buffers, then drops the SDK client (destroyed
  // here, or by the last call still using it on another thread) and lets go
  // of every buffer.
  void Close() {
    if (client_ == nullptr) return;
    std::shared_ptr<Client> client = std::move(client_);
    std::vector<std::shared_ptr<StoreFuture>> stores = std::move(stores_);
    std::map<void*, HeldBuffer> registered = std::move(registered_);
    registered_.clear();
    {
      py::gil_scoped_release release;
      for (auto& s : stores) s->WaitDone();
      for (auto& [data, held] : registered) {
        client->UnregisterMemory(data).IgnoreError();
      }
      client.reset();
    }
    for (auto& s : stores) s->Done();
  }

  PyLoadResult Load(const std::vector<std::string>& keys,
                    const py::sequence& buffers, std::optional<double> deadline,
                    bool prefetch) {
    const ClientRef live = Live();
    Client& c = *live;
    std::vector<HeldBuffer> held = HoldAll(buffers, keys.size(), true);
    const std::vector<MutableBuffer> bufs = Views<MutableBuffer>(held);
    LoadOptions options;
    options.deadline = DeadlineFrom(deadline);
    options.prefetch = prefetch;
    LoadResult got =
        Unwrap(WithoutGil([&] { return c.Load(keys, bufs, options); }));
    PyLoadResult out;
    out.loaded = got.loaded;
    out.lengths = std::move(got.lengths);
    out.hit_prefix = got.hit_prefix;
    out.bytes = got.bytes;
    if (!got.stop_reason.ok()) out.stop_reason = ErrorObject(got.stop_reason);
    return out;
  }

  std::shared_ptr<StoreFuture> Store(const std::vector<std::string>& keys,
                                     const py::sequence& buffers,
                                     std::optional<std::string> parent_key,
                                     std::optional<double> deadline) {
    const ClientRef live = Live();
    Client& c = *live;
    std::vector<HeldBuffer> held = HoldAll(buffers, keys.size(), false);
    const std::vector<ConstBuffer> bufs = Views<ConstBuffer>(held);
    StoreOptions options;
    options.deadline = DeadlineFrom(deadline);
    if (parent_key.has_value()) options.parent_key = *parent_key;
    std::shared_ptr<StoreHandle> handle =
        WithoutGil([&] { return c.Store(keys, bufs, options); });
    auto future = std::make_shared<StoreFuture>(std::move(handle),
                                                std::move(held));
    // Forget the futures that are done (their buffers are released).
    std::vector<std::shared_ptr<StoreFuture>> pending;
    for (auto& s : stores_) {
      if (!s->Done()) pending.push_back(std::move(s));
    }
    pending.push_back(future);
    stores_ = std::move(pending);
    return future;
  }

  py::dict Lookup(const std::vector<std::string>& keys,
                  std::optional<double> deadline) {
    const ClientRef live = Live();
    Client& c = *live;
    CallOptions call;
    call.deadline = DeadlineFrom(deadline);
    LookupResult got =
        Unwrap(WithoutGil([&] { return c.BatchLookup(keys, call); }));
    py::list found, lengths, nodes;
    for (size_t i = 0; i < got.found.size(); ++i) {
      found.append(py::bool_(got.found[i]));
      lengths.append(got.found[i] ? got.locations[i].length : 0);
      nodes.append(got.found[i] ? got.locations[i].node_id : 0);
    }
    py::dict out;
    out["found"] = found;
    out["hit_prefix"] = got.hit_prefix;
    out["lengths"] = lengths;
    out["node_ids"] = nodes;
    return out;
  }

  std::vector<bool> Exists(const std::vector<std::string>& keys,
                           std::optional<double> deadline) {
    const ClientRef live = Live();
    Client& c = *live;
    CallOptions call;
    call.deadline = DeadlineFrom(deadline);
    return Unwrap(WithoutGil([&] { return c.Exists(keys, call); })).found;
  }

  std::vector<bool> Remove(const std::vector<std::string>& keys,
                           std::optional<double> deadline) {
    const ClientRef live = Live();
    Client& c = *live;
    CallOptions call;
    call.deadline = DeadlineFrom(deadline);
    return Unwrap(WithoutGil([&] { return c.Remove(keys, call); }));
  }

  // For routers: {"hit_prefix_length": n, "nodes": [{node_id,
  // longest_prefix, blocks}], "engines": [{engine_id, longest_prefix}]}.
  py::dict PrefixQuery(const std::vector<std::string>& keys,
                       std::optional<double> deadline) {
    const ClientRef live = Live();
    Client& c = *live;
    CallOptions call;
    call.deadline = DeadlineFrom(deadline);
    PrefixAnswer a =
        Unwrap(WithoutGil([&] { return c.PrefixQuery(keys, call); }));
    py::list nodes;
    for (const PrefixAnswer::Node& n : a.nodes) {
      py::dict d;
      d["node_id"] = n.node_id;
      d["longest_prefix"] = n.longest_prefix;
      d["blocks"] = n.blocks;
      nodes.append(d);
    }
    py::list engines;
    for (const PrefixAnswer::Engine& e : a.engines) {
      py::dict d;
      d["engine_id"] = e.engine_id;
      d["longest_prefix"] = e.longest_prefix;
      engines.append(d);
    }
    py::dict out;
    out["hit_prefix_length"] = a.hit_prefix_length;
    out["nodes"] = nodes;
    out["engines"] = engines;
    return out;
  }

  // For an engine's reporter: (blocks the master holds for it, TTL in
  // seconds).
  std::pair<uint64_t, double> ReportEngineBlocks(
      const std::string& engine_id, const std::vector<std::string>& stored,
      const std::vector<std::string>& removed, bool cleared,
      std::optional<double> deadline) {
    const ClientRef live = Live();
    Client& c = *live;
    CallOptions call;
    call.deadline = DeadlineFrom(deadline);
    EngineBlocksReport r;
    r.engine_id = engine_id;
    r.cleared = cleared;
    r.stored = stored;
    r.removed = removed;
    EngineBlocksReply reply =
        Unwrap(WithoutGil([&] { return c.ReportEngineBlocks(r, call); }));
    return {reply.blocks, absl::ToDoubleSeconds(reply.ttl)};
  }

  // Think-time hints: True if queued, False if the client dropped it (its
  // hints in flight at their limit); raises InvalidArgument.
  bool HintNextTurn(const std::vector<std::string>& keys,
                    std::optional<double> expected_in,
                    std::optional<double> hold) {
    const ClientRef live = Live();
    TurnHintOptions o;
    if (expected_in.has_value()) {
      if (!std::isfinite(*expected_in) || *expected_in < 0) {
        ThrowInvalid("expected_in must be a finite number of seconds >= 0");
      }
      o.expected_in = absl::Seconds(*expected_in);
    }
    if (hold.has_value()) {
      if (!std::isfinite(*hold) || *hold <= 0) {
        ThrowInvalid("hold must be a finite number of seconds > 0");
      }
      o.hold = absl::Seconds(*hold);
    }
    Client& c = *live;
    return Queued(c.HintNextTurn(keys, o));
  }

  bool HintConversationEnded(const std::vector<std::string>& keys) {
    const ClientRef live = Live();
    Client& c = *live;
    return Queued(c.HintConversationEnded(keys));
  }

  py::dict Stats(std::optional<double> deadline) {
    const ClientRef live = Live();
    Client& c = *live;
    CallOptions call;
    call.deadline = DeadlineFrom(deadline);
    ClusterStatus st =
        Unwrap(WithoutGil([&] { return c.GetClusterStatus(call); }));
    py::list nodes;
    for (const NodeStatus& n : st.nodes) {
      py::dict d;
      d["node_id"] = n.node_id;
      d["name"] = n.name;
      d["data_address"] = n.data_address;
      d["control_address"] = n.control_address;
      d["alive"] = n.alive;
      d["awaiting_reconcile"] = n.awaiting_reconcile;
      d["last_heartbeat_unix_ms"] = n.last_heartbeat_unix_ms;
      d["capacity_bytes"] = n.capacity_bytes;
      d["used_bytes"] = n.used_bytes;
      d["object_count"] = n.object_count;
      d["device_kind"] = n.device_kind;
      nodes.append(d);
    }
    py::dict out;
    out["nodes"] = nodes;
    // Every cluster stat under its name (common/cluster_stats.h).
#define HYM_PY_GAUGE_(field, metric, help) out[#field] = st.field;
#define HYM_PY_COUNTER_(field) out[#field] = st.field;
    HYM_CLUSTER_STATS(HYM_PY_GAUGE_, HYM_PY_COUNTER_)
#undef HYM_PY_GAUGE_
#undef HYM_PY_COUNTER_
    return out;
  }

  void RegisterBuffer(py::handle obj) {
    const ClientRef live = Live();
    Client& c = *live;
    HeldBuffer held = HeldBuffer::Acquire(obj, /*writable=*/false, 0);
    void* data = held.data();
    const size_t size = held.size();
    absl::Status s = WithoutGil([&] { return c.RegisterMemory(data, size); });
    if (!s.ok()) Throw(s);
    registered_.emplace(data, std::move(held));
  }

  void UnregisterBuffer(py::handle obj) {
    const ClientRef live = Live();
    Client& c = *live;
    void* data = HeldBuffer::Acquire(obj, /*writable=*/false, 0).data();
    auto it = registered_.find(data);
    if (it == registered_.end()) {
      Throw(absl::NotFoundError("buffer is not registered with this client"));
    }
    absl::Status s = WithoutGil([&] { return c.UnregisterMemory(data); });
    registered_.erase(it);
    if (!s.ok()) Throw(s);
  }

  size_t PendingStores() {
    size_t n = 0;
    for (auto& s : stores_) n += s->Done() ? 0 : 1;
    return n;
  }

 private:
  // The SDK client for one call. A call holds it until it returns, so a
  // close() on another thread while the call waits without the GIL cannot
  // destroy it under the call (the last holder destroys it).
  ClientRef Live() {
    if (client_ == nullptr) {
      Throw(absl::FailedPreconditionError("the client is closed"));
    }
    return ClientRef(client_);
  }

  // A hint's outcome: queued, or dropped at the client's limit.
  static bool Queued(const absl::Status& s) {
    if (s.ok()) return true;
    if (absl::IsResourceExhausted(s)) return false;
    Throw(s);
  }

  std::shared_ptr<Client> client_;  // GIL; null once closed
  // GIL: stores whose buffers may still be in use; registered buffers.
  std::vector<std::shared_ptr<StoreFuture>> stores_;
  std::map<void*, HeldBuffer> registered_;
};

KeyNamespace NamespaceFrom(const std::string& model, const std::string& dtype,
                           const std::string& layout, int32_t tp_rank,
                           int32_t tp_size, const std::string& salt) {
  KeyNamespace ns;
  ns.model = model;
  ns.dtype = dtype;
  ns.layout = layout;
  ns.tp_rank = tp_rank;
  ns.tp_size = tp_size;
  ns.salt = salt;
  return ns;
}

// hymcache.KeyBuilder: BlockKeyBuilder with Python arguments.
class PyKeyBuilder {
 public:
  PyKeyBuilder(const std::string& model, const std::string& dtype,
               const std::string& layout, int32_t tp_rank, int32_t tp_size,
               const std::string& salt, size_t block_tokens)
      : builder_(CheckedNamespace(model, dtype, layout, tp_rank, tp_size, salt,
                                  block_tokens),
                 block_tokens) {}

  size_t block_tokens() const { return builder_.block_tokens(); }

  std::vector<py::bytes> Keys(py::handle token_ids,
                              std::optional<std::string> parent) const {
    std::vector<int32_t> tokens = TokensFrom(token_ids);
    std::vector<std::string> keys;
    if (!parent.has_value() || parent->empty()) {
      keys = builder_.Keys(tokens);
    } else {
      // Blocks continuing a chain whose last key is `parent`.
      const size_t bt = builder_.block_tokens();
      std::string prev = *parent;
      for (size_t i = 0; i + bt <= tokens.size(); i += bt) {
        prev = builder_.NextKey(
            prev, absl::MakeConstSpan(tokens.data() + i, bt));
        keys.push_back(prev);
      }
    }
    std::vector<py::bytes> out;
    out.reserve(keys.size());
    for (const std::string& k : keys) out.emplace_back(k);
    return out;
  }

 private:
  static KeyNamespace CheckedNamespace(const std::string& model,
                                       const std::string& dtype,
                                       const std::string& layout,
                                       int32_t tp_rank, int32_t tp_size,
                                       const std::string& salt,
                                       size_t block_tokens) {
    if (block_tokens == 0) ThrowInvalid("block_tokens must be > 0");
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
      ThrowInvalid(absl::StrCat("tp_rank ", tp_rank, " / tp_size ", tp_size,
                                ": need 0 <= tp_rank < tp_size"));
    }
    return NamespaceFrom(model, dtype, layout, tp_rank, tp_size, salt);
  }

  BlockKeyBuilder builder_;
};

}  // namespace
}  // namespace hymcache::python

PYBIND11_MODULE(_hymcache, m) {
  using namespace hymcache;          // NOLINT: the bindings name many types
  using namespace hymcache::python;  // NOLINT
  const ClientOptions kSdkDefaults;
  m.doc() =
      "Native core of the hymcache package (pybind11 over the C++ SDK). "
      "Import `hymcache`, not this module.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      try {
        py::object exc = ErrorObject(e.status());
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())),
                        exc.ptr());
      } catch (py::error_already_set& inner) {
        inner.restore();
      }
    }
  });

  py::class_<PyLoadResult>(m, "LoadResult",
                           "What load() did: blocks [0, loaded) are in the "
                           "caller's buffers, complete.")
      .def_readonly("loaded", &PyLoadResult::loaded,
                    "Number of leading blocks loaded.")
      .def_readonly("lengths", &PyLoadResult::lengths,
                    "Byte length of each loaded block.")
      .def_readonly("hit_prefix", &PyLoadResult::hit_prefix,
                    "Leading keys the master reported stored (>= loaded).")
      .def_readonly("bytes", &PyLoadResult::bytes, "Bytes loaded.")
      .def_readonly("stop_reason", &PyLoadResult::stop_reason,
                    "None when every block loaded; else why loading stopped "
                    "(a hymcache.Error: NotFound, DeadlineExceeded, "
                    "Unavailable, OutOfRange for a buffer too small).")
      .def("__int__", [](const PyLoadResult& r) { return r.loaded; })
      .def("__repr__", [](const PyLoadResult& r) {
        return absl::StrCat("LoadResult(loaded=", r.loaded,
                            ", hit_prefix=", r.hit_prefix, ", bytes=", r.bytes,
                            ", stop_reason=",
                            py::repr(r.stop_reason).cast<std::string>(), ")");
      });

  py::class_<PyStoreResult>(m, "StoreResult",
                            "What a store did, per key and in total.")
      .def_readonly("stored", &PyStoreResult::stored)
      .def_readonly("skipped", &PyStoreResult::skipped,
                    "Keys already stored or being stored by another writer.")
      .def_readonly("failed", &PyStoreResult::failed)
      .def_readonly("refused", &PyStoreResult::refused,
                    "Of failed: refused for lack of room (never retried).")
      .def_readonly("node_id", &PyStoreResult::node_id,
                    "Node the (last chunk of) stored blocks went to.")
      .def_readonly("outcomes", &PyStoreResult::outcomes,
                    "Per key: 'stored', 'already_stored', 'in_progress' or "
                    "'failed'.")
      .def_readonly("errors", &PyStoreResult::errors,
                    "Per key: None or the hymcache.Error it failed with.")
      .def("__repr__", [](const PyStoreResult& r) {
        return absl::StrCat("StoreResult(stored=", r.stored,
                            ", skipped=", r.skipped, ", failed=", r.failed,
                            ", refused=", r.refused, ")");
      });

  py::class_<StoreFuture, std::shared_ptr<StoreFuture>>(
      m, "StoreFuture",
      "Completion of one store(). The store's buffers are held (and must not "
      "change) until done() is true.")
      .def("done", &StoreFuture::Done,
           "Whether the store finished (its buffers are no longer used).")
      .def("result", &StoreFuture::Result, py::arg("timeout") = py::none(),
           "Waits (GIL released) up to `timeout` seconds (None: until done) "
           "and returns the StoreResult. Raises DeadlineExceeded if the "
           "store is still running (it goes on), or the store's whole-call "
           "error (InvalidArgument, Unavailable, ResourceExhausted when the "
           "client's store queue is full).");

  py::class_<PyClient>(m, "Client", R"doc(A connection to a HyMCache cluster.

Client(masters, transport="auto", deadline=10.0, store_deadline=2.0, ...)
Client(etcd="E1,E2,E3", cluster="default", ...)

masters: the master's "host:port", or several masters of which one leads
  (a list, or one string "A,B,C"; docs/ha.md): calls follow the leader.
etcd, cluster: instead of (or besides) masters, the etcd cluster the
  masters campaign on (its client endpoints, a list or one string "A,B,C")
  and the masters' --cluster name: the client reads who leads from etcd
  (once here, within `deadline`), watches it, and sends a call the old
  leader refuses or does not answer to the new one within its deadline.
transport: "auto" (shared memory for nodes on this host, else RDMA when
  both sides have it, else TCP), "tcp", "shm" or "rdma".
deadline: seconds a call may take when given none; past it, load returns
  the blocks it finished.
store_deadline: seconds a store may keep using its buffers at most.
master_connections, grpc_poll_strategy: for a process whose threads look
  up at once (ClientOptions in client/options.h): connections to the master
  (opened when first used; default 8), and gRPC's poll strategy ("auto", the
  default: "poll", which lets each thread complete its own lookups, unless
  gRPC already runs in the process or GRPC_POLL_STRATEGY names one; "" for
  gRPC's choice; "poll" or "epoll1", which must be set before anything in
  the process starts gRPC).
location_cache_entries, location_cache_ttl: where recent loads found their
  keys, so that a load of keys found within the ttl (seconds, default 1)
  reads from the nodes without asking the master; 0 entries turns it off
  (client/location_cache.h).

Connects lazily: calls raise Unavailable while the master is down. Safe to
use from several threads; every call that waits releases the GIL. close()
(or leaving a `with` block) waits for stores in flight and frees the client.
)doc")
      .def(py::init<py::object, const std::string&, double, double,
                    const std::string&, const std::string&, const std::string&,
                    const std::string&, const std::string&, int, int, int,
                    const std::string&, py::object, const std::string&, int64_t,
                    double>(),
           // The SDK's defaults (client/options.h), not copies; only the
           // transport differs: Python picks the best plane ("auto").
           py::arg("masters") = py::none(), py::kw_only(),
           py::arg("transport") = "auto",
           py::arg("deadline") =
               absl::ToDoubleSeconds(kSdkDefaults.default_deadline),
           py::arg("store_deadline") =
               absl::ToDoubleSeconds(kSdkDefaults.default_store_deadline),
           py::arg("auth_token") = kSdkDefaults.auth_token,
           py::arg("tls_ca_file") = kSdkDefaults.tls_ca_file,
           py::arg("tls_cert_file") = kSdkDefaults.tls_cert_file,
           py::arg("tls_key_file") = kSdkDefaults.tls_key_file,
           py::arg("tls_server_name") = kSdkDefaults.tls_server_name,
           py::arg("store_threads") = kSdkDefaults.store_threads,
           py::arg("max_pending_stores") = kSdkDefaults.max_pending_stores,
           py::arg("master_connections") = kSdkDefaults.master_connections,
           py::arg("grpc_poll_strategy") = kSdkDefaults.grpc_poll_strategy,
           py::arg("etcd") = py::none(),
           py::arg("cluster") = kSdkDefaults.cluster,
           py::arg("location_cache_entries") =
               kSdkDefaults.location_cache_entries,
           py::arg("location_cache_ttl") =
               absl::ToDoubleSeconds(kSdkDefaults.location_cache_ttl))
      .def(
          "load", &PyClient::Load, py::arg("keys"), py::arg("buffers"),
          py::kw_only(), py::arg("deadline") = py::none(),
          py::arg("prefetch") = true,
          R"doc(Loads the leading run of stored `keys` into `buffers`, in place.

buffers: one writable, contiguous buffer per key (numpy arrays or views of
  a pool, bytearray, memoryview; DLPack CPU tensors), at least as large as
  its block. The SDK writes straight into their memory; nothing writes into
  them after load returns.
deadline: seconds from now (None: the client's deadline). When it passes,
  load returns what it finished.
prefetch: tell the nodes the ordered list of blocks first (they stage them
  ahead of the reads); not sent when one read takes every block found (a
  one-block load is a lookup and a read).
Returns a LoadResult (blocks [0, loaded) are complete; stop_reason says why
it stopped). A miss, a dead node, a buffer too small or the deadline is not
an exception: it ends the loaded prefix. Raises InvalidArgument (key and
buffer counts differ, read-only / strided / object-dtype buffers, empty key
list), Unavailable or DeadlineExceeded (the master, before anything loaded).
)doc")
      .def("store", &PyClient::Store, py::arg("keys"), py::arg("buffers"),
           py::kw_only(), py::arg("parent_key") = py::none(),
           py::arg("deadline") = py::none(),
           R"doc(Stores blocks in the background; returns a StoreFuture at once.

keys are one chain (keys[i+1] extends keys[i]); parent_key is the key of the
block before keys[0] (the last block of the loaded prefix), so the new blocks
join its node. buffers (any contiguous buffers, read-only ones too) are held
until the future is done and must not change until then. A node refusing a
write is reported in the result, never retried. deadline: seconds from now
(None: the client's store_deadline).
)doc")
      .def("lookup", &PyClient::Lookup, py::arg("keys"), py::kw_only(),
           py::arg("deadline") = py::none(),
           "Looks keys up in order: {'found': [bool], 'hit_prefix': int, "
           "'lengths': [int], 'node_ids': [int]}. Raises InvalidArgument, "
           "Unavailable, DeadlineExceeded.")
      .def("exists", &PyClient::Exists, py::arg("keys"), py::kw_only(),
           py::arg("deadline") = py::none(),
           "Which keys are stored, in order: [bool]. Cheaper than lookup "
           "(no locations: the master signs nothing, the answer is a "
           "bitmap). Raises InvalidArgument, Unavailable, DeadlineExceeded.")
      .def("remove", &PyClient::Remove, py::arg("keys"), py::kw_only(),
           py::arg("deadline") = py::none(),
           "Removes keys (and the blocks after each in its chain); per key "
           "whether it was stored.")
      .def("prefix_query", &PyClient::PrefixQuery, py::arg("keys"),
           py::kw_only(), py::arg("deadline") = py::none(),
           "For routers: how much of the chain keys is cached, and where: "
           "{'hit_prefix_length': n, 'nodes': [{'node_id', "
           "'longest_prefix', 'blocks'}], 'engines': [{'engine_id', "
           "'longest_prefix'}]} (engines: those whose own caches hold "
           "keys[0], as they report them, longest first). Raises "
           "InvalidArgument, Unavailable, DeadlineExceeded.")
      .def("report_engine_blocks", &PyClient::ReportEngineBlocks,
           py::arg("engine_id"), py::kw_only(),
           py::arg("stored") = std::vector<std::string>(),
           py::arg("removed") = std::vector<std::string>(),
           py::arg("cleared") = false, py::arg("deadline") = py::none(),
           "For an engine's reporter (python -m hymcache.engine_blocks): "
           "the keys engine_id's own cache gained and lost (applied: "
           "cleared, removed, stored). Returns (blocks the master now holds "
           "for it, TTL in seconds: report again within it). Raises "
           "InvalidArgument, ResourceExhausted (engines_full), "
           "FailedPrecondition (engine_reports_off).")
      .def("hint_next_turn", &PyClient::HintNextTurn, py::arg("keys"),
           py::kw_only(), py::arg("expected_in") = py::none(),
           py::arg("hold") = py::none(),
           "Think-time hint: keys are a conversation's chain, in order, just "
           "answered; its next turn is expected in about expected_in seconds "
           "(None: unknown). Hybrid nodes stage the chain while idle and hold "
           "it hold seconds past that (None: 60), so the turn loads it from "
           "DRAM. Advice: returns at once, True if queued, False if dropped "
           "(too many hints in flight). Raises InvalidArgument.")
      .def("hint_conversation_ended", &PyClient::HintConversationEnded,
           py::arg("keys"),
           "Think-time hint: the conversation will not come back; the nodes "
           "drop its hints. True if queued, False if dropped.")
      .def("stats", &PyClient::Stats, py::kw_only(),
           py::arg("deadline") = py::none(),
           "The cluster: nodes (liveness, capacity, use, objects) and the "
           "master's object and eviction counts, as a dict.")
      .def("register_buffer", &PyClient::RegisterBuffer, py::arg("buffer"),
           "Registers a buffer (e.g. the engine's KV pool) for direct "
           "transfers: RDMA reads land in it and writes leave from it without "
           "a bounce copy. Held (and pinned) until unregister_buffer or "
           "close. A no-op for the tcp and shm planes. Raises "
           "InvalidArgument (overlapping a registration), ResourceExhausted "
           "(the locked-memory limit).")
      .def("unregister_buffer", &PyClient::UnregisterBuffer, py::arg("buffer"),
           "Undoes register_buffer. Raises NotFound if not registered.")
      .def("pending_stores", &PyClient::PendingStores,
           "Stores of this client not yet done.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyClient& c, py::args) {
             c.Close();
             return false;
           })
      .def("close", &PyClient::Close,
           "Waits for stores in flight (each bounded by its deadline), "
           "unregisters buffers and disconnects. Idempotent; later calls "
           "raise FailedPrecondition.");

  py::class_<PyKeyBuilder>(m, "KeyBuilder", R"doc(Prefix-chained block keys.

KeyBuilder(model="", dtype="", layout="", tp_rank=0, tp_size=1, salt="",
           block_tokens=512)

The namespace names everything that makes KV bytes differ; key i depends on
every token of blocks 0..i. Identical to the C++ BlockKeyBuilder: a C++
engine and a Python one compute the same keys.
)doc")
      .def(py::init<const std::string&, const std::string&,
                    const std::string&, int32_t, int32_t, const std::string&,
                    size_t>(),
           py::kw_only(), py::arg("model") = "", py::arg("dtype") = "",
           py::arg("layout") = "", py::arg("tp_rank") = 0,
           py::arg("tp_size") = 1, py::arg("salt") = "",
           py::arg("block_tokens") = 512)
      .def_property_readonly("block_tokens", &PyKeyBuilder::block_tokens)
      .def("keys", &PyKeyBuilder::Keys, py::arg("token_ids"),
           py::kw_only(), py::arg("parent") = py::none(),
           "Keys (32 bytes each) of every full block of token_ids (a "
           "sequence of ints or an int32/int64 array); a trailing partial "
           "block gets none. parent: the key of the block before token_ids[0] "
           "(None: token_ids start the chain).");

  m.def(
      "key_to_hex", [](const std::string& key) { return KeyToHex(key); },
      py::arg("key"), "Lower-case hex of a key.");
}
