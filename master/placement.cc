#include "master/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace hymcache {
namespace master {

absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(absl::string_view name) {
  if (name == "load_aware") return PlacementPolicy::kLoadAware;
  if (name == "round_robin") return PlacementPolicy::kRoundRobin;
  return absl::InvalidArgumentError(absl::StrCat(
      "placement policy '", name, "': must be load_aware or round_robin"));
}

const char* PlacementPolicyName(PlacementPolicy policy) {
  return policy == PlacementPolicy::kRoundRobin ? "round_robin" : "load_aware";
}

absl::Status PlacementOptions::Validate() const {
  if (!(chain_spill_over >= 0 && chain_spill_over <= 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: chain_spill_over must be in [0, 10] (is ",
                     chain_spill_over, ")"));
  }
  if (!(chain_spill_min_fill >= 0 && chain_spill_min_fill <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: chain_spill_min_fill must be in [0, 1] (is ",
                     chain_spill_min_fill, ")"));
  }
  if (!(load_weight >= 0 && load_weight <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement: load_weight must be in [0, 1] (is ", load_weight, ")"));
  }
  if (load_half_life < absl::Milliseconds(100) ||
      load_half_life > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: load_half_life must be in [100ms, 1h] (is ",
                     absl::FormatDuration(load_half_life), ")"));
  }
  if (!(max_tenant_share_per_node > 0 && max_tenant_share_per_node <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement: max_tenant_share_per_node must be in (0, 1] (is ",
        max_tenant_share_per_node, ")"));
  }
  return absl::OkStatus();
}

namespace {

// exp(-ln2 * dt / half_life): what remains of a sum after dt.
double Decay(absl::Duration dt, absl::Duration half_life) {
  if (dt <= absl::ZeroDuration()) return 1;
  return std::exp2(-absl::FDivDuration(dt, half_life));
}

}  // namespace

void DecayingRate::Add(uint64_t bytes, absl::Time now,
                       absl::Duration half_life) {
  if (at_ != absl::InfinitePast()) sum_ *= Decay(now - at_, half_life);
  if (now > at_) at_ = now;
  sum_ += static_cast<double>(bytes);
}

double DecayingRate::PerSecond(absl::Time now, absl::Duration half_life) const {
  if (at_ == absl::InfinitePast()) return 0;
  // A decayed sum with half-life h integrates a steady rate r to
  // r * h / ln 2.
  return sum_ * Decay(now - at_, half_life) * std::log(2.0) /
         absl::ToDoubleSeconds(half_life);
}

PlacementRanking RankNodes(const PlacementOptions& options,
                           absl::Span<const PlacementCandidate> candidates,
                           uint64_t put_bytes, bool named_tenant,
                           uint64_t tenant_bytes, size_t round_robin_start) {
  PlacementRanking out;
  const size_t n = candidates.size();
  if (n == 0) return out;
  const size_t start = round_robin_start % n;
  // Round-robin position of each candidate (ties, and kRoundRobin).
  auto turn = [&](size_t i) { return (i + n - start) % n; };
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});

  if (options.policy == PlacementPolicy::kRoundRobin) {
    auto first = [&](size_t i) {
      return candidates[i].requested || candidates[i].chain_node;
    };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (candidates[a].holds_copy != candidates[b].holds_copy) {
        return candidates[b].holds_copy;
      }
      if (first(a) != first(b)) return first(a);
      return turn(a) < turn(b);
    });
    out.order = std::move(order);
    return out;
  }

  double used = 0, capacity = 0, traffic = 0, in_flight = 0;
  for (const PlacementCandidate& c : candidates) {
    used += static_cast<double>(c.used_bytes);
    capacity += static_cast<double>(c.capacity_bytes);
    traffic += c.traffic;
    in_flight += c.puts_in_flight;
  }
  const double put = static_cast<double>(put_bytes);
  auto fill_after = [&](const PlacementCandidate& c) {
    return c.capacity_bytes == 0 ? 1.0
                                 : (static_cast<double>(c.used_bytes) + put) /
                                       static_cast<double>(c.capacity_bytes);
  };
  const double mean_fill_after = capacity > 0 ? (used + put) / capacity : 1.0;
  const double mean_traffic = traffic / static_cast<double>(n);
  const double mean_in_flight = in_flight / static_cast<double>(n);
  // 0 at or below the mean, 1 at 4x the mean and beyond.
  auto above_mean = [](double x, double mean) {
    if (mean <= 0) return x > 0 ? 1.0 : 0.0;
    return std::clamp((x / mean - 1) / 3, 0.0, 1.0);
  };
  std::vector<double> score(n);
  for (size_t i = 0; i < n; ++i) {
    const PlacementCandidate& c = candidates[i];
    score[i] = fill_after(c) +
               options.load_weight *
                   std::max(above_mean(c.traffic, mean_traffic),
                            above_mean(c.puts_in_flight, mean_in_flight));
  }

  // The tenant's share: which nodes it would exceed.
  std::vector<bool> over_share(n, false);
  const double tenant_after = static_cast<double>(tenant_bytes) + put;
  if (named_tenant && options.max_tenant_share_per_node < 1 && n > 1 &&
      tenant_after >= static_cast<double>(options.tenant_share_min_bytes)) {
    size_t over = 0;
    for (size_t i = 0; i < n; ++i) {
      over_share[i] = static_cast<double>(candidates[i].tenant_bytes) + put >
                      options.max_tenant_share_per_node * tenant_after;
      over += over_share[i];
    }
    if (over == n) {
      out.tenant_share_ignored = true;
      std::fill(over_share.begin(), over_share.end(), false);
    }
  }

  // The chain's node, kept while within the spill margin.
  // 0: the requested node or the kept chain node; 1: the rest; 2: over the
  // share; 3: the spilled chain node; 4: a node holding another copy.
  std::vector<int> group(n, 1);
  for (size_t i = 0; i < n; ++i) {
    if (candidates[i].holds_copy) {
      group[i] = 4;
      continue;
    }
    if (over_share[i]) group[i] = 2;
    if (candidates[i].requested) {
      group[i] = 0;
      continue;
    }
    if (!candidates[i].chain_node) continue;
    if (fill_after(candidates[i]) <=
            (1 + options.chain_spill_over) * mean_fill_after +
                options.chain_spill_min_fill &&
        !over_share[i]) {
      group[i] = 0;
    } else {
      group[i] = 3;
      out.chain_spilled = n > 1;
    }
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (group[a] != group[b]) return group[a] < group[b];
    if (score[a] != score[b]) return score[a] < score[b];
    return turn(a) < turn(b);
  });
  out.order = std::move(order);
  return out;
}

bool CopyChooser::PrefersCopy(const Holder& copy, const Holder& block) const {
  if (copy.on_reader_host != block.on_reader_host) return copy.on_reader_host;
  return Load(copy.node, *copy.traffic) < Load(block.node, *block.traffic);
}

void CopyChooser::Served(uint32_t node, uint64_t bytes) {
  for (auto& [id, sum] : served_) {
    if (id == node) {
      sum += bytes;
      return;
    }
  }
  served_.emplace_back(node, bytes);
}

double CopyChooser::Load(uint32_t node, const DecayingRate& traffic) const {
  double load = traffic.PerSecond(now_, half_life_);
  for (const auto& [id, sum] : served_) {
    if (id == node) {
      // What DecayingRate::Add(sum) would add to PerSecond.
      load += static_cast<double>(sum) * std::log(2.0) /
              absl::ToDoubleSeconds(half_life_);
      break;
    }
  }
  return load;
}

double PlacementImbalance(absl::Span<const uint64_t> used) {
  if (used.empty()) return 0;
  double sum = 0, most = 0;
  for (uint64_t u : used) {
    sum += static_cast<double>(u);
    most = std::max(most, static_cast<double>(u));
  }
  if (sum <= 0) return 0;
  return most / (sum / static_cast<double>(used.size()));
}

}  // namespace master
}  // namespace hymcache
