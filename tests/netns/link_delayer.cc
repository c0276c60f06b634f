#include "tests/netns/link_delayer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace hymcache::testing {
namespace {

// epoll data of the wake eventfd and the timerfd; queues count from 1.
constexpr uint64_t kWakeKey = ~uint64_t{0};
constexpr uint64_t kTimerKey = ~uint64_t{0} - 1;
// Notices read per recvmmsg, and the room for one (metadata only: a few
// hundred bytes).
constexpr int kBatch = 64;
constexpr size_t kNoticeBytes = 2048;

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::string Errno(const char* what) {
  return absl::StrCat(what, ": ", strerror(errno));
}

// A netlink message under construction: nlmsghdr, nfgenmsg, attributes.
class NlMessage {
 public:
  NlMessage(uint16_t type, uint16_t flags, uint16_t queue_num) {
    buf_.resize(NLMSG_ALIGN(sizeof(nlmsghdr)) + NLMSG_ALIGN(sizeof(nfgenmsg)));
    nlmsghdr h = {};
    h.nlmsg_type = static_cast<uint16_t>((NFNL_SUBSYS_QUEUE << 8) | type);
    h.nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | flags);
    std::memcpy(buf_.data(), &h, sizeof(h));
    nfgenmsg g = {};
    g.nfgen_family = AF_UNSPEC;
    g.version = NFNETLINK_V0;
    g.res_id = htons(queue_num);
    std::memcpy(buf_.data() + NLMSG_ALIGN(sizeof(nlmsghdr)), &g, sizeof(g));
  }
  void Attr(uint16_t type, const void* data, size_t len) {
    nlattr a = {};
    a.nla_len = static_cast<uint16_t>(NLA_HDRLEN + len);
    a.nla_type = type;
    const size_t at = buf_.size();
    buf_.resize(at + NLA_ALIGN(NLA_HDRLEN + len));
    std::memcpy(buf_.data() + at, &a, sizeof(a));
    std::memcpy(buf_.data() + at + NLA_HDRLEN, data, len);
  }
  void Be32(uint16_t type, uint32_t v) {
    const uint32_t be = htonl(v);
    Attr(type, &be, sizeof(be));
  }
  // Sends it to the kernel; the errno on failure.
  int Send(int fd) {
    const uint32_t len = static_cast<uint32_t>(buf_.size());
    std::memcpy(buf_.data(), &len, sizeof(len));  // nlmsg_len comes first
    sockaddr_nl to = {};
    to.nl_family = AF_NETLINK;
    const ssize_t n = sendto(fd, buf_.data(), buf_.size(), 0,
                             reinterpret_cast<sockaddr*>(&to), sizeof(to));
    return n == static_cast<ssize_t>(buf_.size()) ? 0 : errno;
  }

 private:
  std::vector<char> buf_;
};

// Binds queue `num` on the (blocking) netlink socket `fd` and configures
// it; the kernel's answer as an errno (0: done).
int BindQueue(int fd, uint16_t num, uint32_t maxlen) {
  NlMessage m(NFQNL_MSG_CONFIG, NLM_F_ACK, num);
  nfqnl_msg_config_cmd cmd = {};
  cmd.command = NFQNL_CFG_CMD_BIND;
  cmd.pf = htons(AF_INET);
  m.Attr(NFQA_CFG_CMD, &cmd, sizeof(cmd));
  // Metadata only: the verdict needs the id, not the bytes.
  nfqnl_msg_config_params params = {};
  params.copy_range = htonl(0);
  params.copy_mode = NFQNL_COPY_META;
  m.Attr(NFQA_CFG_PARAMS, &params, sizeof(params));
  m.Be32(NFQA_CFG_QUEUE_MAXLEN, maxlen);
  // GSO super-packets whole (no segmentation for us); never FAIL_OPEN.
  m.Be32(NFQA_CFG_FLAGS, NFQA_CFG_F_GSO);
  m.Be32(NFQA_CFG_MASK, NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN);
  if (int err = m.Send(fd); err != 0) return err;
  char ack[4096];
  for (;;) {
    const ssize_t n = recv(fd, ack, sizeof(ack), 0);
    if (n < 0) return errno;
    size_t len = static_cast<size_t>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(ack); NLMSG_OK(h, len);
         h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_type != NLMSG_ERROR) continue;
      nlmsgerr e;
      std::memcpy(&e, NLMSG_DATA(h), sizeof(e));
      return -e.error;
    }
  }
}

// Moves the calling thread into the namespace at `path` until destroyed.
class InNetns {
 public:
  absl::Status Enter(const std::string& path) {
    original_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (original_ < 0) return absl::InternalError(Errno("open own netns"));
    const int target = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (target < 0) {
      return absl::InternalError(Errno(absl::StrCat("open ", path).c_str()));
    }
    const int r = setns(target, CLONE_NEWNET);
    const int err = errno;
    close(target);
    if (r != 0) {
      errno = err;
      return absl::InternalError(Errno("setns"));
    }
    entered_ = true;
    return absl::OkStatus();
  }
  ~InNetns() {
    // Failing to go back leaves the thread in a host: a broken invariant.
    if (entered_) PCHECK(setns(original_, CLONE_NEWNET) == 0) << "setns back";
    if (original_ >= 0) close(original_);
  }

 private:
  int original_ = -1;
  bool entered_ = false;
};

}  // namespace

void LinkDelayerStats::Add(const LinkDelayerStats& other) {
  packets += other.packets;
  verdict_batches += other.verdict_batches;
  kernel_dropped += other.kernel_dropped;
  receive_overruns += other.receive_overruns;
  netlink_errors += other.netlink_errors;
  max_lateness = std::max(max_lateness, other.max_lateness);
  thread_cpu += other.thread_cpu;
}

absl::Status LinkDelayerOptions::Validate() const {
  if (queue_maxlen == 0) {
    return absl::InvalidArgumentError(
        "LinkDelayerOptions: queue_maxlen must be positive");
  }
  if (socket_buffer_bytes < (1 << 16)) {
    return absl::InvalidArgumentError(
        "LinkDelayerOptions: socket_buffer_bytes must be at least 64 KiB");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LinkDelayer>> LinkDelayer::Create(
    const LinkDelayerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto d = std::unique_ptr<LinkDelayer>(new LinkDelayer(options));
  d->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  d->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  d->timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (d->epoll_fd_ < 0 || d->wake_fd_ < 0 || d->timer_fd_ < 0) {
    return absl::InternalError(Errno("LinkDelayer: epoll/eventfd/timerfd"));
  }
  for (auto [fd, key] :
       {std::pair{d->wake_fd_, kWakeKey}, std::pair{d->timer_fd_, kTimerKey}}) {
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.u64 = key;
    if (epoll_ctl(d->epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(Errno("LinkDelayer: epoll_ctl"));
    }
  }
  LinkDelayer* self = d.get();
  auto t = Thread::Start("link-delayer", [self] { self->Loop(); });
  if (!t.ok()) return t.status();
  d->thread_ = std::move(t).value();
  return d;
}

LinkDelayer::~LinkDelayer() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) < 0) {
      PLOG(ERROR) << "LinkDelayer: wake";
    }
  }
  thread_.Join();
  {
    MutexLock l(&mu_);
    for (auto& [name, q] : queues_) Close(q);
    queues_.clear();
  }
  for (int fd : {epoll_fd_, wake_fd_, timer_fd_}) {
    if (fd >= 0) close(fd);
  }
}

absl::Status LinkDelayer::Serve(const std::string& netns_path,
                                uint16_t queue_num, absl::Duration latency) {
  if (latency < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("LinkDelayer: negative latency");
  }
  const std::string name = absl::StrCat(netns_path, "#", queue_num);
  {
    MutexLock l(&mu_);
    if (auto it = queues_.find(name); it != queues_.end()) {
      it->second.latency_ns = absl::ToInt64Nanoseconds(latency);
      return absl::OkStatus();
    }
  }
  Queue q;
  q.num = queue_num;
  q.latency_ns = absl::ToInt64Nanoseconds(latency);
  {
    InNetns in;
    if (absl::Status s = in.Enter(netns_path); !s.ok()) return s;
    q.fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    if (q.fd < 0) return absl::InternalError(Errno("netlink socket"));
    // The namespace's queue counters; the open file stays in it.
    q.proc_fd = open("/proc/thread-self/net/netfilter/nfnetlink_queue",
                     O_RDONLY | O_CLOEXEC);
  }
  auto fail = [&q](absl::Status s) {
    close(q.fd);
    if (q.proc_fd >= 0) close(q.proc_fd);
    return s;
  };
  const int buf = options_.socket_buffer_bytes;
  if (setsockopt(q.fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof(buf)) != 0) {
    return fail(absl::InternalError(Errno("SO_RCVBUFFORCE")));
  }
  sockaddr_nl self = {};
  self.nl_family = AF_NETLINK;
  if (bind(q.fd, reinterpret_cast<sockaddr*>(&self), sizeof(self)) != 0) {
    return fail(absl::InternalError(Errno("bind netlink")));
  }
  if (int err = BindQueue(q.fd, queue_num, options_.queue_maxlen); err != 0) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("NFQUEUE ", queue_num, " in ", netns_path,
                     ": the kernel refused to bind it: ", strerror(err))));
  }
  if (q.proc_fd < 0) {
    // Bound, so nfnetlink_queue is there; its counters must be too, or
    // drops would go unseen.
    return fail(
        absl::InternalError(Errno("open /proc/net/netfilter/nfnetlink_queue")));
  }
  const int flags = fcntl(q.fd, F_GETFL);
  if (flags < 0 || fcntl(q.fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return fail(absl::InternalError(Errno("O_NONBLOCK")));
  }
  MutexLock l(&mu_);
  q.key = next_key_++;
  epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = q.key;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, q.fd, &ev) != 0) {
    return fail(absl::InternalError(Errno("epoll_ctl")));
  }
  queues_.emplace(name, std::move(q));
  return absl::OkStatus();
}

absl::Status LinkDelayer::Stop(const std::string& netns_path,
                               uint16_t queue_num) {
  MutexLock l(&mu_);
  auto it = queues_.find(absl::StrCat(netns_path, "#", queue_num));
  if (it == queues_.end()) {
    return absl::NotFoundError(absl::StrCat("LinkDelayer: NFQUEUE ", queue_num,
                                            " of ", netns_path,
                                            " is not served"));
  }
  Close(it->second);
  queues_.erase(it);
  ArmTimer();
  return absl::OkStatus();
}

int LinkDelayer::queues() const {
  MutexLock l(&mu_);
  return static_cast<int>(queues_.size());
}

LinkDelayerStats LinkDelayer::stats() const {
  MutexLock l(&mu_);
  LinkDelayerStats s = stats_;
  for (const auto& [name, q] : queues_) s.kernel_dropped += KernelDropped(q);
  timespec cpu;
  if (have_cpu_clock_ && clock_gettime(cpu_clock_, &cpu) == 0) {
    s.thread_cpu = absl::DurationFromTimespec(cpu);
  }
  return s;
}

void LinkDelayer::Close(Queue& q) {
  // What is still held goes out now; what the rules queue later is dropped
  // by the kernel (no listener, no bypass).
  Drain(q);
  Release(q, 0, /*all=*/true);
  const uint64_t dropped = KernelDropped(q);
  if (dropped > 0) {
    LOG(WARNING) << "LinkDelayer: NFQUEUE " << q.num << " dropped " << dropped
                 << " packets (queue full or notices lost)";
  }
  stats_.kernel_dropped += dropped;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, q.fd, nullptr);
  close(q.fd);
  close(q.proc_fd);
  q.fd = q.proc_fd = -1;
}

uint64_t LinkDelayer::KernelDropped(const Queue& q) const {
  // Lines: queue_num portid queue_total copy_mode copy_range queue_dropped
  // queue_user_dropped id_sequence 1.
  // Read afresh from the start each time (a seq_file).
  char text[4096];
  ssize_t n = -1;
  if (lseek(q.proc_fd, 0, SEEK_SET) == 0) {
    n = read(q.proc_fd, text, sizeof(text) - 1);
  }
  if (n < 0) {
    PLOG(ERROR) << "LinkDelayer: reading nfnetlink_queue's counters";
    return 0;
  }
  text[n] = '\0';
  uint64_t dropped = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> f =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint32_t num = 0, full = 0, lost = 0;
    if (f.size() >= 7 && absl::SimpleAtoi(f[0], &num) && num == q.num &&
        absl::SimpleAtoi(f[5], &full) && absl::SimpleAtoi(f[6], &lost)) {
      dropped += uint64_t{full} + lost;
    }
  }
  return dropped;
}

void LinkDelayer::Drain(Queue& q) {
  static thread_local std::vector<char> space(kBatch * kNoticeBytes);
  iovec iov[kBatch];
  mmsghdr msgs[kBatch];
  for (;;) {
    for (int i = 0; i < kBatch; ++i) {
      iov[i] = {space.data() + i * kNoticeBytes, kNoticeBytes};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    const int got = recvmmsg(q.fd, msgs, kBatch, MSG_DONTWAIT, nullptr);
    if (got < 0) {
      if (errno == ENOBUFS) {
        // Notices lost: the kernel dropped those packets (counted there).
        ++stats_.receive_overruns;
        continue;
      }
      if (errno != EAGAIN && errno != EINTR) {
        PLOG(ERROR) << "LinkDelayer: recvmmsg on NFQUEUE " << q.num;
      }
      return;
    }
    const int64_t now = NowNs();
    const int64_t due = std::max(now + q.latency_ns, q.last_due_ns);
    for (int i = 0; i < got; ++i) {
      size_t len = msgs[i].msg_len;
      for (auto* h = reinterpret_cast<nlmsghdr*>(iov[i].iov_base);
           NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
        if (h->nlmsg_type == NLMSG_ERROR) {
          nlmsgerr e;
          std::memcpy(&e, NLMSG_DATA(h), sizeof(e));
          if (e.error != 0) ++stats_.netlink_errors;
          continue;
        }
        if (h->nlmsg_type != ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET)) {
          continue;
        }
        const char* p = static_cast<const char*>(NLMSG_DATA(h)) +
                        NLMSG_ALIGN(sizeof(nfgenmsg));
        const char* end = reinterpret_cast<const char*>(h) + h->nlmsg_len;
        while (p + NLA_HDRLEN <= end) {
          nlattr a;
          std::memcpy(&a, p, sizeof(a));
          if (a.nla_len < NLA_HDRLEN || p + a.nla_len > end) break;
          if ((a.nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR &&
              a.nla_len >= NLA_HDRLEN + sizeof(nfqnl_msg_packet_hdr)) {
            nfqnl_msg_packet_hdr ph;
            std::memcpy(&ph, p + NLA_HDRLEN, sizeof(ph));
            q.held.push_back({due, ntohl(ph.packet_id)});
            break;
          }
          p += NLA_ALIGN(a.nla_len);
        }
      }
    }
    q.last_due_ns = due;
    if (got < kBatch) return;
  }
}

void LinkDelayer::Release(Queue& q, int64_t now_ns, bool all) {
  size_t n = 0;
  while (n < q.held.size() && (all || q.held[n].due_ns <= now_ns)) ++n;
  if (n == 0) return;
  if (!all) {
    const int64_t late = now_ns - q.held.front().due_ns;
    stats_.max_lateness =
        std::max(stats_.max_lateness, absl::Nanoseconds(late));
  }
  NlMessage m(NFQNL_MSG_VERDICT_BATCH, 0, q.num);
  nfqnl_msg_verdict_hdr v = {};
  v.verdict = htonl(NF_ACCEPT);
  v.id = htonl(q.held[n - 1].id);
  m.Attr(NFQA_VERDICT_HDR, &v, sizeof(v));
  if (int err = m.Send(q.fd); err != 0) {
    // Held packets stay held: the kernel frees them with the queue.
    ++stats_.netlink_errors;
    LOG(ERROR) << "LinkDelayer: verdict on NFQUEUE " << q.num << ": "
               << strerror(err);
    return;
  }
  ++stats_.verdict_batches;
  stats_.packets += n;
  q.held.erase(q.held.begin(), q.held.begin() + n);
}

void LinkDelayer::ArmTimer() {
  int64_t next = 0;
  for (const auto& [name, q] : queues_) {
    if (!q.held.empty() && (next == 0 || q.held.front().due_ns < next)) {
      next = q.held.front().due_ns;
    }
  }
  itimerspec t = {};  // zero: disarmed
  if (next > 0) {
    t.it_value.tv_sec = next / 1'000'000'000;
    t.it_value.tv_nsec = next % 1'000'000'000;
  }
  if (timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &t, nullptr) != 0) {
    PLOG(ERROR) << "LinkDelayer: timerfd_settime";
  }
}

void LinkDelayer::Loop() {
  {
    MutexLock l(&mu_);
    have_cpu_clock_ = pthread_getcpuclockid(pthread_self(), &cpu_clock_) == 0;
  }
  epoll_event events[32];
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events, 32, -1);
    if (n < 0 && errno != EINTR) {
      PLOG(ERROR) << "LinkDelayer: epoll_wait";
      return;
    }
    MutexLock l(&mu_);
    if (stopping_) return;
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == kWakeKey || key == kTimerKey) {
        uint64_t count;
        if (read(key == kWakeKey ? wake_fd_ : timer_fd_, &count,
                 sizeof(count)) < 0) {
          // EAGAIN: already read.
        }
        continue;
      }
      for (auto& [name, q] : queues_) {
        if (q.key == key) Drain(q);
      }
    }
    const int64_t now = NowNs();
    for (auto& [name, q] : queues_) Release(q, now, /*all=*/false);
    ArmTimer();
  }
}

}  // namespace hymcache::testing
