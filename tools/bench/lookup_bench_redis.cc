#include "tools/bench/lookup_bench.h"

namespace hymcache::lookup_bench {

// One MGET of `batch` consecutive stored keys from a random start; its
// microseconds. Misses and failures go to `tally`.
double TimedMget(Resp* c, const std::vector<std::string>& keys, int batch,
                 std::mt19937_64& rng, Tally* tally) {
  const size_t start = rng() % (keys.size() - batch + 1);
  std::vector<absl::string_view> args = {"MGET"};
  for (int i = 0; i < batch; ++i) args.push_back(keys[start + i]);
  absl::Time t0 = absl::Now();
  c->Add(args);
  int64_t found = c->Flush() ? c->Read() : -1;
  double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
  if (found < 0) {
    tally->errors.fetch_add(1, std::memory_order_relaxed);
  } else if (found != batch) {
    tally->misses.fetch_add(batch - found, std::memory_order_relaxed);
  }
  return us;
}

Row MeasureRedis(int port, const std::vector<std::string>& keys, int batch,
                 int threads) {
  Row row{batch, threads, false};
  Tally tally;
  if (FLAGS_client_processes) {
    if (!RunProcesses(threads, "redis",
                      {absl::StrCat("--worker_target=", port),
                       absl::StrCat("--worker_batch=", batch)},
                      &row, &tally)) {
      std::fprintf(stderr, "redis clients: a client process failed\n");
      ++tally.errors;
    }
  } else {
    std::vector<std::unique_ptr<Resp>> conns;
    for (int t = 0; t < threads; ++t) {
      conns.push_back(std::make_unique<Resp>());
      if (!conns.back()->Connect(port)) std::exit(1);
    }
    for (int t = 0; t < threads; ++t) {
      std::mt19937_64 rng(t);
      for (int i = 0; i < kWarmupCalls; ++i) {
        TimedMget(conns[t].get(), keys, batch, rng, &tally);
      }
    }
    std::vector<std::mt19937_64> rngs;
    for (int t = 0; t < threads; ++t) rngs.emplace_back(1000 + t);
    RunThreads(
        threads, "redis-bench",
        [&](int t) {
          return TimedMget(conns[t].get(), keys, batch, rngs[t], &tally);
        },
        &row);
  }
  row.misses = tally.misses.load();
  row.errors = tally.errors.load();
  return row;
}

}  // namespace hymcache::lookup_bench
