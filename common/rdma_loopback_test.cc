// Loopback test of the verbs layer against a real RDMA device: two RC queue
// pairs in one process, connected to each other through QpInfo
// Encode/Decode, moving bytes with batched one-sided WRITE and READ, then the
// failure paths (bad rkey, missed deadline) and recovery on a fresh pair;
// then type-2 memory windows (a window grants exactly its range, its access
// and its queue pair; an invalidated window grants nothing).
//
// Runs on Soft-RoCE inside the QEMU guest:
//   bazel build -c opt //common:rdma_loopback_test
//   tests/vmtest/run.sh rdma "$(bazel info -c opt
//   bazel-bin)/common/rdma_loopback_test"
// Without a device it prints why and exits 0 ("skipped"), unless
// HYMCACHE_REQUIRE_RDMA=1 or --require_rdma turns that into a failure.
// Flags: --device=NAME (default: first device), --gid_index=N (default: auto).
// Output: one "PASS name (seconds)" or "FAIL name: status" line per case, then
// "N passed, N failed".
#include <stdlib.h>
#include <string.h>

#include <cstring>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rdma.h"
#include "common/thread.h"

namespace hymcache::rdma {
namespace {

#define EXPECT_TRUE(cond, ...)                                                 \
  do {                                                                         \
    if (!(cond)) {                                                             \
      return absl::InternalError(absl::StrCat(                                 \
          __FILE__, ":", __LINE__, ": expected ", #cond, " ", ##__VA_ARGS__)); \
    }                                                                          \
  } while (0)

#define EXPECT_OK(expr)                                                      \
  do {                                                                       \
    absl::Status st_ = (expr);                                               \
    if (!st_.ok()) {                                                         \
      return absl::InternalError(absl::StrCat(__FILE__, ":", __LINE__, ": ", \
                                              #expr, ": ", st_.ToString())); \
    }                                                                        \
  } while (0)

constexpr size_t kBuf = 4 << 20;  // each buffer
constexpr size_t kMiB = 1 << 20;

struct Env {
  std::unique_ptr<Device> dev;
  std::vector<uint8_t> src, remote, dst;
  std::unique_ptr<MemoryRegion> src_mr, remote_mr, dst_mr;
};

absl::Time Soon() { return absl::Now() + absl::Seconds(60); }

void Fill(std::vector<uint8_t>* v, uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto& b : *v) b = static_cast<uint8_t>(rng());
}

// Two queue pairs connected to each other, as two hosts would do it: each
// side's QpInfo goes through Encode/Decode.
struct Pair {
  std::unique_ptr<QueuePair> a, b;
};
absl::StatusOr<Pair> MakePair(Device* dev, const QueuePairOptions& o = {}) {
  Pair p;
  auto a = QueuePair::Create(dev, o);
  if (!a.ok()) return a.status();
  auto b = QueuePair::Create(dev, o);
  if (!b.ok()) return b.status();
  p.a = std::move(*a);
  p.b = std::move(*b);
  auto ai = QpInfo::Decode(p.a->local_info().Encode());
  auto bi = QpInfo::Decode(p.b->local_info().Encode());
  if (!ai.ok()) return ai.status();
  if (!bi.ok()) return bi.status();
  absl::Status st = p.a->Connect(*bi);
  if (!st.ok()) return st;
  st = p.b->Connect(*ai);
  if (!st.ok()) return st;
  return p;
}

OneSidedOp Write(Env& e, size_t off, size_t len, size_t remote_off) {
  return {OneSidedOp::Kind::kWrite,
          e.src.data() + off,
          e.src_mr->lkey(),
          reinterpret_cast<uint64_t>(e.remote.data() + remote_off),
          e.remote_mr->rkey(),
          static_cast<uint32_t>(len)};
}
OneSidedOp Read(Env& e, size_t off, size_t len, size_t remote_off) {
  return {OneSidedOp::Kind::kRead,
          e.dst.data() + off,
          e.dst_mr->lkey(),
          reinterpret_cast<uint64_t>(e.remote.data() + remote_off),
          e.remote_mr->rkey(),
          static_cast<uint32_t>(len)};
}

absl::Status AllOk(const std::vector<absl::Status>& st) {
  for (size_t i = 0; i < st.size(); ++i) {
    if (!st[i].ok()) {
      return absl::InternalError(
          absl::StrCat("op ", i, ": ", st[i].ToString()));
    }
  }
  return absl::OkStatus();
}

absl::Status TestSizes(Env& e) {
  auto p = MakePair(e.dev.get());
  EXPECT_OK(p.status());
  for (size_t len : {size_t{1}, size_t{64}, size_t{4096}, size_t{65536},
                     size_t{kMiB}, size_t{kBuf}}) {
    Fill(&e.src, static_cast<uint32_t>(len));
    std::fill(e.remote.begin(), e.remote.end(), 0);
    std::fill(e.dst.begin(), e.dst.end(), 0);
    absl::Time t0 = absl::Now();
    EXPECT_OK(AllOk(p->a->Execute({Write(e, 0, len, 0)}, Soon())));
    double tw = absl::ToDoubleSeconds(absl::Now() - t0);
    EXPECT_TRUE(memcmp(e.src.data(), e.remote.data(), len) == 0, "(WRITE of ",
                len, " bytes)");
    EXPECT_TRUE(e.remote[len] == 0, "(WRITE past its end)");
    for (size_t i = 0; i < len; ++i) e.remote[i] ^= 0x5a;
    t0 = absl::Now();
    EXPECT_OK(AllOk(p->b->Execute({Read(e, 0, len, 0)}, Soon())));
    double tr = absl::ToDoubleSeconds(absl::Now() - t0);
    EXPECT_TRUE(memcmp(e.dst.data(), e.remote.data(), len) == 0, "(READ of ",
                len, " bytes)");
    EXPECT_TRUE(e.dst[len] == 0, "(READ past its end)");
    if (len >= kMiB) {
      printf("  %zu bytes: WRITE %.1f MB/s, READ %.1f MB/s\n", len,
             len / tw / 1e6, len / tr / 1e6);
    }
  }
  EXPECT_TRUE(p->a->healthy() && p->b->healthy());
  return absl::OkStatus();
}

absl::Status TestBatch64(Env& e) {
  auto p = MakePair(e.dev.get());
  EXPECT_OK(p.status());
  Fill(&e.src, 64);
  std::fill(e.remote.begin(), e.remote.end(), 0);
  std::fill(e.dst.begin(), e.dst.end(), 0);
  // 64 writes of 16 KiB into scattered (reversed) remote slots.
  constexpr size_t kLen = 16 << 10;
  std::vector<OneSidedOp> ops;
  for (size_t i = 0; i < 64; ++i)
    ops.push_back(Write(e, i * kLen, kLen, (63 - i) * kLen));
  absl::Time t0 = absl::Now();
  EXPECT_OK(AllOk(p->a->Execute(ops, Soon())));
  double tw = absl::ToDoubleSeconds(absl::Now() - t0);
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_TRUE(memcmp(e.src.data() + i * kLen,
                       e.remote.data() + (63 - i) * kLen, kLen) == 0,
                "(batched WRITE ", i, ")");
  }
  // 64 reads of varying sizes (1 B .. 64 KiB) into packed local slots.
  ops.clear();
  size_t off = 0, roff = 0, total = 0;
  std::vector<std::pair<size_t, size_t>> where;  // (local off, remote off)
  std::vector<size_t> lens;
  for (size_t i = 0; i < 64; ++i) {
    size_t len = size_t{1} << (i % 17);
    ops.push_back(Read(e, off, len, roff));
    where.push_back({off, roff});
    lens.push_back(len);
    off += len + 7;
    roff += len + 13;
    total += len;
  }
  t0 = absl::Now();
  EXPECT_OK(AllOk(p->b->Execute(ops, Soon())));
  double tr = absl::ToDoubleSeconds(absl::Now() - t0);
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_TRUE(memcmp(e.dst.data() + where[i].first,
                       e.remote.data() + where[i].second, lens[i]) == 0,
                "(batched READ ", i, ")");
  }
  printf(
      "  64 x 16 KiB WRITE %.1f MB/s; 64 mixed READs (%zu bytes) %.1f MB/s\n",
      64 * kLen / tw / 1e6, total, total / tr / 1e6);
  return absl::OkStatus();
}

absl::Status TestWindowed(Env& e) {
  // More ops than max_outstanding: Execute must refill the send queue as
  // completions arrive.
  QueuePairOptions o;
  o.max_outstanding = 16;
  o.signal_interval = 5;
  auto p = MakePair(e.dev.get(), o);
  EXPECT_OK(p.status());
  Fill(&e.src, 300);
  std::fill(e.remote.begin(), e.remote.end(), 0);
  std::vector<OneSidedOp> ops;
  constexpr size_t kLen = 4096 + 100;
  for (size_t i = 0; i < 300; ++i)
    ops.push_back(Write(e, i * kLen, kLen, i * kLen));
  EXPECT_OK(AllOk(p->a->Execute(ops, Soon())));
  EXPECT_TRUE(memcmp(e.src.data(), e.remote.data(), 300 * kLen) == 0);
  std::fill(e.dst.begin(), e.dst.end(), 0);
  ops.clear();
  for (size_t i = 0; i < 300; ++i)
    ops.push_back(Read(e, i * kLen, kLen, i * kLen));
  EXPECT_OK(AllOk(p->a->Execute(ops, Soon())));
  EXPECT_TRUE(memcmp(e.dst.data(), e.remote.data(), 300 * kLen) == 0);
  return absl::OkStatus();
}

absl::Status TestConcurrentExecute(Env& e) {
  // Two threads share one queue pair (Execute calls are serialized) while a
  // third uses its own pair.
  auto p = MakePair(e.dev.get());
  EXPECT_OK(p.status());
  auto q = MakePair(e.dev.get());
  EXPECT_OK(q.status());
  Fill(&e.src, 3);
  std::fill(e.remote.begin(), e.remote.end(), 0);
  std::fill(e.dst.begin(), e.dst.end(), 0);
  constexpr size_t kSlice = kBuf / 3;
  std::vector<absl::Status> result(3);
  {
    std::vector<Thread> threads;
    for (int t = 0; t < 3; ++t) {
      QueuePair* qp = t < 2 ? p->a.get() : q->a.get();
      threads.emplace_back(absl::StrCat("rdma-test-", t), [&, t, qp] {
        for (int it = 0; it < 20 && result[t].ok(); ++it) {
          size_t base = t * kSlice;
          size_t len = 4096 * (1 + (it % 8));
          std::vector<OneSidedOp> ops;
          for (size_t k = 0; k < 8; ++k) {
            size_t off = base + ((it * 8 + k) * len) % (kSlice - len);
            ops.push_back(Write(e, off, len, off));
          }
          for (size_t k = 0; k < 8; ++k) {
            size_t off = base + ((it * 8 + k) * len) % (kSlice - len);
            ops.push_back(Read(e, off, len, off));
          }
          absl::Status st = AllOk(qp->Execute(ops, Soon()));
          if (!st.ok()) result[t] = st;
        }
      });
    }
  }
  for (int t = 0; t < 3; ++t) EXPECT_OK(result[t]);
  // Whatever was written and read back must match the source.
  for (size_t i = 0; i < 3 * kSlice; ++i) {
    if (e.dst[i] != 0) EXPECT_TRUE(e.dst[i] == e.src[i], "(byte ", i, ")");
  }
  return absl::OkStatus();
}

absl::Status TestInvalidAndExpired(Env& e) {
  auto p = MakePair(e.dev.get());
  EXPECT_OK(p.status());
  OneSidedOp bad = Write(e, 0, 4096, 0);
  bad.local = nullptr;
  auto st = p->a->Execute({Write(e, 0, 64, 0), bad}, Soon());
  EXPECT_TRUE(absl::IsInvalidArgument(st[0]) && absl::IsInvalidArgument(st[1]),
              st[0].ToString(), " / ", st[1].ToString());
  EXPECT_TRUE(p->a->healthy(), "(an invalid batch must not break the pair)");
  st = p->a->Execute({Write(e, 0, 64, 0)}, absl::Now() - absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(st[0]), st[0].ToString());
  EXPECT_TRUE(p->a->healthy(), "(an expired deadline before posting)");
  EXPECT_TRUE(p->a->Execute({}, Soon()).empty());
  EXPECT_OK(AllOk(p->a->Execute({Write(e, 0, 64, 0)}, Soon())));
  // Registration errors.
  EXPECT_TRUE(
      absl::IsInvalidArgument(e.dev->Register(nullptr, 10, true).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(e.dev->Register(e.src.data(), 0, true).status()));
  // A queue pair that is not connected.
  auto lone = QueuePair::Create(e.dev.get(), {});
  EXPECT_OK(lone.status());
  st = (*lone)->Execute({Write(e, 0, 64, 0)}, Soon());
  EXPECT_TRUE(absl::IsFailedPrecondition(st[0]), st[0].ToString());
  EXPECT_TRUE(!(*lone)->healthy());
  return absl::OkStatus();
}

absl::Status TestBadRkey(Env& e) {
  auto p = MakePair(e.dev.get());
  EXPECT_OK(p.status());
  Fill(&e.src, 7);
  std::fill(e.remote.begin(), e.remote.end(), 0);
  OneSidedOp bad = Write(e, 8192, 4096, 8192);
  bad.rkey ^= 0x5a5a00;
  std::vector<OneSidedOp> ops = {Write(e, 0, 4096, 0),
                                 Write(e, 4096, 4096, 4096), bad,
                                 Write(e, 12288, 4096, 12288)};
  auto st = p->a->Execute(ops, Soon());
  printf("  statuses: [%s] [%s] [%s] [%s]\n", st[0].ToString().c_str(),
         st[1].ToString().c_str(), st[2].ToString().c_str(),
         st[3].ToString().c_str());
  EXPECT_TRUE(st[0].ok() && st[1].ok(), "(ops before the bad one)");
  EXPECT_TRUE(absl::IsPermissionDenied(st[2]), st[2].ToString());
  EXPECT_TRUE(!st[3].ok(), "(op after the bad one)");
  EXPECT_TRUE(memcmp(e.src.data(), e.remote.data(), 8192) == 0);
  EXPECT_TRUE(!p->a->healthy());
  st = p->a->Execute({Write(e, 0, 64, 0)}, Soon());
  EXPECT_TRUE(absl::IsFailedPrecondition(st[0]), st[0].ToString());
  // The responder side saw the access error too; on its next use it fails
  // (or, on some devices, still works) and must never hang.
  st = p->b->Execute({Read(e, 0, 64, 0)}, absl::Now() + absl::Seconds(10));
  printf("  peer after the error: %s, healthy=%d\n", st[0].ToString().c_str(),
         p->b->healthy());
  EXPECT_TRUE(!absl::IsDeadlineExceeded(st[0]), st[0].ToString());
  // A fresh pair works.
  auto fresh = MakePair(e.dev.get());
  EXPECT_OK(fresh.status());
  Fill(&e.src, 8);
  EXPECT_OK(AllOk(fresh->a->Execute({Write(e, 0, kMiB, 0)}, Soon())));
  EXPECT_TRUE(memcmp(e.src.data(), e.remote.data(), kMiB) == 0);
  EXPECT_OK(AllOk(fresh->b->Execute({Read(e, 0, kMiB, 0)}, Soon())));
  EXPECT_TRUE(memcmp(e.dst.data(), e.remote.data(), kMiB) == 0);
  EXPECT_TRUE(fresh->a->healthy() && fresh->b->healthy());
  return absl::OkStatus();
}

absl::Status TestDeadlineDrains(Env& e) {
  // Two work requests in flight at a time: Soft-RoCE (6.1) runs the
  // requester inside ibv_post_send, so a long chain would be sent before
  // Execute could look at the deadline.
  QueuePairOptions o;
  o.max_outstanding = 2;
  auto p = MakePair(e.dev.get(), o);
  EXPECT_OK(p.status());
  Fill(&e.remote, 9);
  std::fill(e.dst.begin(), e.dst.end(), 0);
  // 64 x 4 MiB of READs into the same local buffer: far more than the
  // deadline allows on Soft-RoCE.
  std::vector<OneSidedOp> ops(64, Read(e, 0, kBuf, 0));
  absl::Time t0 = absl::Now();
  auto st = p->a->Execute(ops, absl::Now() + absl::Milliseconds(30));
  double took = absl::ToDoubleSeconds(absl::Now() - t0);
  size_t ok = 0, expired = 0;
  for (const auto& s : st) {
    if (s.ok()) {
      ++ok;
    } else {
      EXPECT_TRUE(absl::IsDeadlineExceeded(s), s.ToString());
      ++expired;
    }
  }
  printf("  %zu completed, %zu past the deadline, Execute took %.3f s\n", ok,
         expired, took);
  if (expired == 0) {
    printf("  (device finished 256 MiB within 30 ms; deadline path not hit)\n");
    return absl::OkStatus();
  }
  EXPECT_TRUE(!p->a->healthy());
  // Nothing may land in the local buffer after Execute returned.
  std::vector<uint8_t> snap = e.dst;
  usleep(300 * 1000);
  EXPECT_TRUE(snap == e.dst, "(local buffer changed after Execute returned)");
  // A fresh pair works.
  auto fresh = MakePair(e.dev.get());
  EXPECT_OK(fresh.status());
  std::fill(e.dst.begin(), e.dst.end(), 0);
  EXPECT_OK(AllOk(fresh->a->Execute({Read(e, 0, kMiB, 0)}, Soon())));
  EXPECT_TRUE(memcmp(e.dst.data(), e.remote.data(), kMiB) == 0);
  return absl::OkStatus();
}

// Type-2 memory windows: a region registered for windows only; object A at
// [0, 4 KiB), object B at [4 KiB, 8 KiB). Queue pair b (the "node") binds
// windows; a (the "client") uses them. Every access outside what a window
// grants completes with a remote access error.
constexpr size_t kObj = 4096;

struct WindowEnv {
  std::vector<uint8_t> mem;  // A, B
  std::unique_ptr<MemoryRegion> mr;
};

// A fresh pair and a window bound on its node side over A.
struct Bound {
  Pair p;
  std::unique_ptr<MemoryWindow> w;
};
absl::StatusOr<Bound> BindA(Env& e, WindowEnv& we, bool remote_write) {
  auto p = MakePair(e.dev.get());
  if (!p.ok()) return p.status();
  auto w = e.dev->AllocateWindow();
  if (!w.ok()) return w.status();
  WindowOp op{WindowOp::Kind::kBind, w->get(), we.mr.get(), we.mem.data(),
              kObj, remote_write};
  absl::Status st = p->b->ExecuteWindowOps({op}, Soon())[0];
  if (!st.ok()) return st;
  return Bound{std::move(*p), std::move(*w)};
}

OneSidedOp At(Env& e, WindowEnv& we, OneSidedOp::Kind kind, size_t obj,
              uint32_t rkey) {
  const bool read = kind == OneSidedOp::Kind::kRead;
  return {kind,
          read ? e.dst.data() : e.src.data(),
          read ? e.dst_mr->lkey() : e.src_mr->lkey(),
          reinterpret_cast<uint64_t>(we.mem.data() + obj * kObj), rkey,
          static_cast<uint32_t>(kObj)};
}

absl::Status TestMemoryWindows(Env& e) {
  printf("  max_mw %d, type-2 windows: %s\n", e.dev->max_mw(),
         e.dev->supports_windows() ? "yes" : "no");
  if (!e.dev->supports_windows()) {
    EXPECT_TRUE(absl::IsFailedPrecondition(e.dev->AllocateWindow().status()));
    printf("  (no type-2 windows on this device: nothing more to test)\n");
    return absl::OkStatus();
  }
  const absl::Time t_bounds = absl::Now();
  auto bounded = e.dev->ProbeWindowBounds();
  EXPECT_OK(bounded.status());
  printf("  ProbeWindowBounds: %.2f s\n",
         absl::ToDoubleSeconds(absl::Now() - t_bounds));
  printf("  the device confines a window's peer to %s\n",
         *bounded ? "the window's range" : "the window's REGION (not its range)");
  WindowEnv we;
  we.mem.assign(2 * kObj, 0);
  Fill(&we.mem, 21);
  auto mr = e.dev->RegisterForWindows(we.mem.data(), we.mem.size());
  EXPECT_OK(mr.status());
  we.mr = std::move(*mr);
  using K = OneSidedOp::Kind;

  // Granted: READ of A through its window, byte for byte.
  auto b = BindA(e, we, /*remote_write=*/false);
  EXPECT_OK(b.status());
  const uint32_t key_a = b->w->rkey();
  EXPECT_TRUE(b->w->bound());
  std::fill(e.dst.begin(), e.dst.end(), 0);
  EXPECT_OK(AllOk(b->p.a->Execute({At(e, we, K::kRead, 0, key_a)}, Soon())));
  EXPECT_TRUE(memcmp(e.dst.data(), we.mem.data(), kObj) == 0);

  // Refused, each on a fresh pair (an access error breaks the pair):
  // B with A's key; A and B with the region's own keys (what a node without
  // windows would publish); a WRITE of A through its read window; A's key
  // from a queue pair the window is not bound on.
  struct Probe {
    const char* what;
    K kind;
    size_t obj;
    int key;  // 0: the window's, 1: region rkey, 2: region lkey
    bool write_window;
    // Only outside the window's range, inside its region: refused only
    // where the device checks a window's range (ProbeWindowBounds).
    bool range_only;
  };
  const Probe probes[] = {
      {"read B with A's window key", K::kRead, 1, 0, false, true},
      {"write B with A's write window key", K::kWrite, 1, 0, true, true},
      {"write B with A's read window key", K::kWrite, 1, 0, false, false},
      {"read A with the region's rkey", K::kRead, 0, 1, false, false},
      {"read B with the region's rkey", K::kRead, 1, 1, false, false},
      {"write B with the region's rkey", K::kWrite, 1, 1, false, false},
      {"read B with the region's lkey", K::kRead, 1, 2, false, false},
      {"write A through a read window", K::kWrite, 0, 0, false, false},
  };
  const std::vector<uint8_t> before = we.mem;
  for (const Probe& pr : probes) {
    const absl::Time t_probe = absl::Now();
    auto pb = BindA(e, we, pr.write_window);
    EXPECT_OK(pb.status());
    const uint32_t key = pr.key == 0   ? pb->w->rkey()
                         : pr.key == 1 ? we.mr->rkey()
                                       : we.mr->lkey();
    Fill(&e.src, 99);
    auto st = pb->p.a->Execute({At(e, we, pr.kind, pr.obj, key)}, Soon());
    printf("  %s: %s (%.2f s)\n", pr.what, st[0].ToString().c_str(),
           absl::ToDoubleSeconds(absl::Now() - t_probe));
    if (pr.range_only && !*bounded) {
      EXPECT_TRUE(st[0].ok(), "(ProbeWindowBounds said unbounded) ", pr.what,
                  ": ", st[0].ToString());
      if (pr.kind == K::kWrite) {
        std::memcpy(we.mem.data() + kObj, before.data() + kObj, kObj);
      }
      continue;
    }
    EXPECT_TRUE(absl::IsPermissionDenied(st[0]), pr.what, ": ",
                st[0].ToString());
  }
  {
    auto other = MakePair(e.dev.get());
    EXPECT_OK(other.status());
    auto st = other->a->Execute({At(e, we, K::kRead, 0, key_a)}, Soon());
    printf("  A's key from another queue pair: %s\n", st[0].ToString().c_str());
    EXPECT_TRUE(absl::IsPermissionDenied(st[0]), st[0].ToString());
  }
  EXPECT_TRUE(we.mem == before, "(a refused WRITE changed the memory)");

  // Invalidated: the key stops working; a new bind has a new key, and the
  // old one does not work on it.
  EXPECT_OK(AllOk(b->p.b->ExecuteWindowOps(
      {{WindowOp::Kind::kInvalidate, b->w.get()}}, Soon())));
  EXPECT_TRUE(!b->w->bound() && b->w->usable());
  {
    auto st = b->p.a->Execute({At(e, we, K::kRead, 0, key_a)}, Soon());
    printf("  read A after invalidation: %s\n", st[0].ToString().c_str());
    EXPECT_TRUE(absl::IsPermissionDenied(st[0]), st[0].ToString());
  }
  {
    auto again = BindA(e, we, false);
    EXPECT_OK(again.status());
    // Rebind the same window object on a fresh pair.
    EXPECT_OK(AllOk(again->p.b->ExecuteWindowOps(
        {{WindowOp::Kind::kInvalidate, again->w.get()}}, Soon())));
    const uint32_t k1 = again->w->rkey();
    EXPECT_OK(AllOk(again->p.b->ExecuteWindowOps(
        {{WindowOp::Kind::kBind, again->w.get(), we.mr.get(), we.mem.data(),
          kObj, false}},
        Soon())));
    EXPECT_TRUE(again->w->rkey() != k1, "(a new bind keeps its key)");
    EXPECT_OK(AllOk(
        again->p.a->Execute({At(e, we, K::kRead, 0, again->w->rkey())}, Soon())));
    auto st = again->p.a->Execute({At(e, we, K::kRead, 0, k1)}, Soon());
    EXPECT_TRUE(absl::IsPermissionDenied(st[0]), "(the previous binding's key) ",
                st[0].ToString());
  }

  // A write window: WRITE lands in A only; READ through it is refused.
  {
    auto w = BindA(e, we, /*remote_write=*/true);
    EXPECT_OK(w.status());
    Fill(&e.src, 5);
    EXPECT_OK(AllOk(
        w->p.a->Execute({At(e, we, K::kWrite, 0, w->w->rkey())}, Soon())));
    EXPECT_TRUE(memcmp(we.mem.data(), e.src.data(), kObj) == 0);
    EXPECT_TRUE(memcmp(we.mem.data() + kObj, before.data() + kObj, kObj) == 0);
    auto st = w->p.a->Execute({At(e, we, K::kRead, 0, w->w->rkey())}, Soon());
    EXPECT_TRUE(absl::IsPermissionDenied(st[0]), "(read through a write window) ",
                st[0].ToString());
  }

  // Malformed window ops are refused before posting; the pair stays healthy.
  {
    auto p = MakePair(e.dev.get());
    EXPECT_OK(p.status());
    auto w = e.dev->AllocateWindow();
    EXPECT_OK(w.status());
    auto st = p->b->ExecuteWindowOps(
        {{WindowOp::Kind::kBind, w->get(), we.mr.get(), we.mem.data() + kObj,
          2 * kObj, false}},
        Soon());
    EXPECT_TRUE(absl::IsInvalidArgument(st[0]), st[0].ToString());
    st = p->b->ExecuteWindowOps({{WindowOp::Kind::kInvalidate, w->get()}},
                                Soon());
    EXPECT_TRUE(absl::IsInvalidArgument(st[0]), "(not bound) ",
                st[0].ToString());
    EXPECT_TRUE(p->b->healthy());
  }

  // What a bind + invalidation costs (batches of 16, as for an acquire of
  // 16 blocks and its release).
  {
    auto p = MakePair(e.dev.get());
    EXPECT_OK(p.status());
    std::vector<std::unique_ptr<MemoryWindow>> ws;
    for (int i = 0; i < 16; ++i) {
      auto w = e.dev->AllocateWindow();
      EXPECT_OK(w.status());
      ws.push_back(std::move(*w));
    }
    const int rounds = 50;
    absl::Time t0 = absl::Now();
    for (int r = 0; r < rounds; ++r) {
      std::vector<WindowOp> bind, inv;
      for (auto& w : ws) {
        bind.push_back({WindowOp::Kind::kBind, w.get(), we.mr.get(),
                        we.mem.data(), kObj, false});
        inv.push_back({WindowOp::Kind::kInvalidate, w.get()});
      }
      EXPECT_OK(AllOk(p->b->ExecuteWindowOps(bind, Soon())));
      EXPECT_OK(AllOk(p->b->ExecuteWindowOps(inv, Soon())));
    }
    double us = absl::ToDoubleMicroseconds(absl::Now() - t0) / rounds;
    printf("  16 binds + 16 invalidations: %.0f us per round (%.1f us per "
           "window)\n",
           us, us / 16);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  DeviceOptions opts;
  bool require = false;
  if (const char* r = getenv("HYMCACHE_REQUIRE_RDMA");
      r && strcmp(r, "1") == 0) {
    require = true;
  }
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--device=")) {
      opts.device_name = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--gid_index=")) {
      if (!absl::SimpleAtoi(a, &opts.gid_index)) {
        fprintf(stderr, "bad --gid_index\n");
        return 2;
      }
    } else if (a == "--require_rdma") {
      require = true;
    } else {
      fprintf(stderr,
              "usage: %s [--device=NAME] [--gid_index=N] [--require_rdma]\n",
              argv[0]);
      return 2;
    }
  }

  Env e;
  if (absl::Status av = Available(); !av.ok()) {
    if (require) {
      printf("FAIL open: %s (HYMCACHE_REQUIRE_RDMA=1)\n0 passed, 1 failed\n",
             av.ToString().c_str());
      return 1;
    }
    printf(
        "SKIP rdma_loopback_test: %s (set HYMCACHE_REQUIRE_RDMA=1 to fail "
        "instead)\n",
        av.ToString().c_str());
    return 0;
  }
  // A device exists: failing to open it is a failure, not a skip.
  auto dev = Device::Open(opts);
  if (!dev.ok()) {
    printf("FAIL open: %s\n0 passed, 1 failed\n",
           dev.status().ToString().c_str());
    return 1;
  }
  e.dev = std::move(*dev);
  printf(
      "device %s: port %d, gid_index %d, active_mtu %u, max_mr_size %llu, "
      "max_msg_size %u\n",
      e.dev->name().c_str(), e.dev->port(), e.dev->gid_index(),
      e.dev->active_mtu(),
      static_cast<unsigned long long>(e.dev->max_mr_size()),
      e.dev->max_msg_size());
  // One spare byte past each buffer's end detects overruns.
  e.src.assign(kBuf + 1, 0);
  e.remote.assign(kBuf + 1, 0);
  e.dst.assign(kBuf + 1, 0);
  for (auto [v, mr] : {std::make_pair(&e.src, &e.src_mr),
                       std::make_pair(&e.remote, &e.remote_mr),
                       std::make_pair(&e.dst, &e.dst_mr)}) {
    auto r = e.dev->Register(v->data(), v->size(), /*remote_write=*/true);
    if (!r.ok()) {
      printf("FAIL register: %s\n0 passed, 1 failed\n",
             r.status().ToString().c_str());
      return 1;
    }
    *mr = std::move(*r);
  }

  struct Case {
    const char* name;
    absl::Status (*fn)(Env&);
  };
  const Case cases[] = {
      {"write_read_sizes", TestSizes},
      {"batch_64", TestBatch64},
      {"windowed_300_ops", TestWindowed},
      {"concurrent_execute", TestConcurrentExecute},
      {"invalid_and_expired", TestInvalidAndExpired},
      {"bad_rkey_breaks_pair", TestBadRkey},
      {"deadline_drains", TestDeadlineDrains},
      {"memory_windows", TestMemoryWindows},
  };
  int passed = 0, failed = 0;
  for (const Case& c : cases) {
    absl::Time t0 = absl::Now();
    absl::Status st = c.fn(e);
    double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    if (st.ok()) {
      ++passed;
      printf("PASS %s (%.2f s)\n", c.name, secs);
    } else {
      ++failed;
      printf("FAIL %s (%.2f s): %s\n", c.name, secs, st.ToString().c_str());
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace hymcache::rdma

int main(int argc, char** argv) { return hymcache::rdma::Main(argc, argv); }
