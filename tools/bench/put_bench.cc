// put_bench: what node-confirmed commits cost a Put (PutStart, the write to
// the storage node, PutCommit), side by side in one run: two clusters of
// real daemons on loopback (a master and a DRAM storage node each, child
// processes), one whose master requires write receipts (the default) and
// one started with --require_write_receipts=false. Both nodes sign
// receipts (nodes always do); the difference is the master's check and the
// receipts' bytes in PutCommit. Trials alternate between the two so that
// drift in the machine's load hits both alike; every Put stores new keys.
//
//   bazel run -c opt //tools/bench:put_bench
//   bazel run -c opt //tools/bench:put_bench -- --blocks=32 --block_kib=64
//
// Prints, per side, the median Puts per second over the trials and the
// blocks per second, their ratio (receipts / none), and the load average
// before and after. Exit status 1 if a Put stores less than all its blocks.
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/cli.h"
#include "tests/daemon.h"

DEFINE_int32(blocks, 8, "blocks per Put");
DEFINE_int32(block_kib, 16, "block size in KiB");
DEFINE_int32(puts, 300, "Puts per trial");
DEFINE_int32(trials, 5, "trials of each side, alternating");
DEFINE_string(transport, "tcp", "client transport: tcp or shm");

namespace hymcache {
namespace {

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One cluster: a master (with `master_flags`), a node and a client.
struct Side {
  std::string name;
  testing::MasterProcess master;
  testing::StorageProcess node;
  std::unique_ptr<Client> client;
  std::vector<double> puts_per_s;
  uint64_t next_key = 0;
};

absl::Status Start(Side* side, const std::string& dir,
                   std::vector<std::string> master_flags) {
  auto master = testing::MasterProcess::Start(dir + "/master", "127.0.0.1:0",
                                              std::move(master_flags));
  if (!master.ok()) return master.status();
  side->master = std::move(*master);
  auto node = testing::StorageProcess::Start(
      side->master.address, side->name + "-node", {"--dram_bytes=256M"});
  if (!node.ok()) return node.status();
  side->node = std::move(*node);
  ClientOptions o;
  o.master_address = side->master.address;
  o.transport =
      FLAGS_transport == "shm" ? TransportKind::kShm : TransportKind::kTcp;
  auto client = Client::Create(o);
  if (!client.ok()) return client.status();
  side->client = std::move(*client);
  return absl::OkStatus();
}

// `n` Puts of new keys; false if one stored less than all its blocks.
bool Puts(Side* side, int n, const std::vector<ConstBuffer>& in,
          double* puts_per_s) {
  std::vector<std::string> keys(in.size());
  const absl::Time t0 = absl::Now();
  for (int p = 0; p < n; ++p) {
    for (std::string& k : keys)
      k = absl::StrCat("put-bench-", side->next_key++);
    auto r = side->client->Put(keys, in);
    if (!r.ok() || r->stored != in.size()) {
      std::fprintf(
          stderr, "%s: a Put stored %zu of %zu blocks: %s\n",
          side->name.c_str(), r.ok() ? r->stored : 0, in.size(),
          r.ok() ? (r->errors.empty() ? "" : r->errors[0].ToString().c_str())
                 : r.status().ToString().c_str());
      return false;
    }
  }
  if (puts_per_s != nullptr) {
    *puts_per_s = n / absl::ToDoubleSeconds(absl::Now() - t0);
  }
  return true;
}

int Run() {
  if (FLAGS_blocks < 1 || FLAGS_block_kib < 1 || FLAGS_puts < 1 ||
      FLAGS_trials < 1) {
    std::fprintf(stderr, "--blocks, --block_kib, --puts, --trials >= 1\n");
    return 2;
  }
  const std::string dir = testing::TempDir("put_bench");
  Side on{"receipts"}, off{"none"};
  for (auto [side, flags] :
       {std::make_pair(&on, std::vector<std::string>{}),
        std::make_pair(&off, std::vector<std::string>{
                                 "--require_write_receipts=false"})}) {
    absl::Status s = Start(side, dir + "/" + side->name, flags);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", side->name.c_str(),
                   s.ToString().c_str());
      return 1;
    }
  }
  const size_t block = static_cast<size_t>(FLAGS_block_kib) << 10;
  std::vector<std::vector<uint8_t>> data(FLAGS_blocks,
                                         std::vector<uint8_t>(block));
  std::vector<ConstBuffer> in;
  for (size_t i = 0; i < data.size(); ++i) {
    std::fill(data[i].begin(), data[i].end(), static_cast<uint8_t>(i));
    in.push_back({data[i].data(), block});
  }
  // A fresh node registers within a second or two; then warm up.
  for (Side* side : {&on, &off}) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!Puts(side, 1, in, nullptr)) {
      if (absl::Now() > give_up) return 1;
      absl::SleepFor(absl::Milliseconds(200));
    }
    if (!Puts(side, FLAGS_puts / 4 + 1, in, nullptr)) return 1;
  }
  const std::string load_before = LoadAverage();
  for (int t = 0; t < FLAGS_trials; ++t) {
    for (Side* side : t % 2 == 0 ? std::vector<Side*>{&on, &off}
                                 : std::vector<Side*>{&off, &on}) {
      double rate = 0;
      if (!Puts(side, FLAGS_puts, in, &rate)) return 1;
      side->puts_per_s.push_back(rate);
    }
  }
  const std::string load_after = LoadAverage();
  std::printf(
      "put_bench: %d x %d KiB per Put (%s), %d Puts per trial, %d trials "
      "each, alternating; loadavg before %s, after %s\n",
      FLAGS_blocks, FLAGS_block_kib, FLAGS_transport.c_str(), FLAGS_puts,
      FLAGS_trials, load_before.c_str(), load_after.c_str());
  std::printf("%-10s %12s %14s   trials (Puts/s)\n", "side", "Puts/s",
              "blocks/s");
  for (Side* side : {&on, &off}) {
    const double m = Median(side->puts_per_s);
    std::string all;
    for (double r : side->puts_per_s) absl::StrAppend(&all, " ", int(r));
    std::printf("%-10s %12.0f %14.0f  %s\n", side->name.c_str(), m,
                m * FLAGS_blocks, all.c_str());
  }
  std::printf("ratio receipts/none: %.3f\n",
              Median(on.puts_per_s) / Median(off.puts_per_s));
  return 0;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "put_bench",
       .usage = "put_bench: Put throughput with node-confirmed commits "
                "against without, side by side, against real daemons",
       .main_file = __FILE__},
      &argc, &argv);
  return hymcache::Run();
}
