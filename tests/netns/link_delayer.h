// LinkDelayer: added latency for a host's link where the kernel has no
// sch_netem, as a userspace packet delayer on NFQUEUE (tests only; used by
// VirtualNetwork::ShapeLink, tests/netns/README.md).
//
// An iptables rule in a host's namespace sends the packets it matches to
// an NFQUEUE number; LinkDelayer binds that queue from a netlink socket
// created inside the namespace, is told each packet's id (metadata only:
// no payload is copied, GSO super-packets stay whole), and gives the
// ACCEPT verdict once the packet's latency has passed since it was read.
// Every packet of a queue waits the same latency, so packets leave in the
// order they came and one NFQNL_MSG_VERDICT_BATCH releases every id up to
// the newest one due.
//
// One thread ("link-delayer") serves every queue: epoll over the queues'
// sockets, an eventfd to wake it and a timerfd armed at the next packet's
// absolute due time (CLOCK_MONOTONIC, sub-millisecond).
//
// Never fail-open: a packet the kernel cannot queue (more than
// queue_maxlen waiting, or this socket's receive buffer full) is dropped,
// not let through undelayed, and counted (stats(): kernel_dropped from
// /proc/net/netfilter/nfnetlink_queue, receive_overruns).
//
// Raw netlink with the kernel's UAPI headers, not libnetfilter_queue: the
// four messages used here (config, packet, verdict batch, error) need no
// library and no new Debian package on every build machine.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <time.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/thread.h"

namespace hymcache::testing {

struct LinkDelayerOptions {
  // Packets one queue holds at most (NFQA_CFG_QUEUE_MAXLEN); the kernel
  // drops the ones beyond (counted). Default: 65536.
  uint32_t queue_maxlen = 65536;
  // Receive buffer of each queue's netlink socket (SO_RCVBUFFORCE): the
  // packet notices not yet read; the kernel drops packets whose notice does
  // not fit (counted). Default: 32 MiB.
  int socket_buffer_bytes = 32 << 20;

  // InvalidArgument naming the bad field.
  absl::Status Validate() const;
};

// Counters since Create, over every queue served so far.
struct LinkDelayerStats {
  // Packets released (ACCEPTed) after their latency.
  uint64_t packets = 0;
  // NFQNL_MSG_VERDICT_BATCH messages sent (each releases >= 1 packet).
  uint64_t verdict_batches = 0;
  // Packets the kernel dropped instead of queueing: the queue was full
  // (queue_dropped) or its notice did not fit the socket
  // (queue_user_dropped).
  uint64_t kernel_dropped = 0;
  // Times the socket reported ENOBUFS (notices lost, packets dropped).
  uint64_t receive_overruns = 0;
  // Errors the kernel answered a verdict with.
  uint64_t netlink_errors = 0;
  // The latest a packet was released after its due time (scheduling).
  absl::Duration max_lateness = absl::ZeroDuration();
  // CPU time the delayer's thread has used (user and system).
  absl::Duration thread_cpu = absl::ZeroDuration();

  // Adds `other`'s counts (the larger max_lateness).
  void Add(const LinkDelayerStats& other);
};

class LinkDelayer {
 public:
  // Starts the thread. Errors: InvalidArgument (options); Internal
  // (epoll, eventfd, timerfd); ResourceExhausted (no thread).
  static absl::StatusOr<std::unique_ptr<LinkDelayer>> Create(
      const LinkDelayerOptions& options);
  // Stops and joins the thread, releases every packet still held and
  // closes the sockets (the kernel then drops what later rules queue).
  ~LinkDelayer();
  LinkDelayer(const LinkDelayer&) = delete;
  LinkDelayer& operator=(const LinkDelayer&) = delete;

  // Serves NFQUEUE `queue_num` of the network namespace at `netns_path`
  // (/run/netns/NAME), holding each packet `latency` (zero: released as
  // soon as read, the delayer's own cost). The socket is created on the
  // calling thread inside the namespace, which the thread then leaves.
  // Called again for the same queue: the new latency applies to packets
  // read from now on, never releasing one before an earlier one.
  // Errors: InvalidArgument (negative latency); FailedPrecondition (the
  // kernel refuses the queue: no nfnetlink_queue, or bound by another
  // process: its errno); Internal (open, setns, socket).
  absl::Status Serve(const std::string& netns_path, uint16_t queue_num,
                     absl::Duration latency);
  // Releases what the queue still holds and closes its socket. Remove the
  // rules that feed it first: packets queued later are dropped.
  // NotFound when the queue is not served.
  absl::Status Stop(const std::string& netns_path, uint16_t queue_num);

  // How many queues are served.
  int queues() const;
  LinkDelayerStats stats() const;

 private:
  struct Held {
    int64_t due_ns;  // CLOCK_MONOTONIC
    uint32_t id;
  };
  struct Queue {
    uint64_t key = 0;  // epoll data
    uint16_t num = 0;
    int fd = -1;       // the netlink socket, in the host's namespace
    int proc_fd = -1;  // its namespace's /proc/net/netfilter/nfnetlink_queue
    int64_t latency_ns = 0;
    int64_t last_due_ns = 0;
    std::deque<Held> held;
  };

  explicit LinkDelayer(const LinkDelayerOptions& options) : options_(options) {}
  void Loop();
  // Reads every notice waiting on `q`'s socket.
  void Drain(Queue& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases `q`'s packets due by `now_ns` (all, with `all`).
  void Release(Queue& q, int64_t now_ns, bool all)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The kernel's drop counters of `q` (0 where unreadable).
  uint64_t KernelDropped(const Queue& q) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Close(Queue& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ArmTimer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const LinkDelayerOptions options_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int timer_fd_ = -1;
  Thread thread_;

  mutable Mutex mu_;
  // By "netns_path#queue_num".
  std::map<std::string, Queue> queues_ ABSL_GUARDED_BY(mu_);
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The thread's CPU clock, once it runs.
  bool have_cpu_clock_ ABSL_GUARDED_BY(mu_) = false;
  clockid_t cpu_clock_ ABSL_GUARDED_BY(mu_);
  LinkDelayerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache::testing
