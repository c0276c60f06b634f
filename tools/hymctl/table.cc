#include "tools/hymctl/table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hymcache::hymctl {

std::string Human(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B")
                : absl::StrFormat("%.1f %s", v, units[u]);
}

void Table(std::ostream& out,
           const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); ++i)
      width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size())
        line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

std::string ShortBytes(uint64_t bytes) {
  const char* units[] = {"B", "K", "M", "G", "T", "P"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 999.5 && u < 5) {
    v /= 1024;
    ++u;
  }
  return v < 9.95 && u > 0 ? absl::StrFormat("%.1f%s", v, units[u])
                           : absl::StrFormat("%.0f%s", v, units[u]);
}

std::string ShortAge(absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  if (s < 0) return "0s";
  if (s < 10) return absl::StrFormat("%.1fs", s);
  if (s < 120) return absl::StrFormat("%.0fs", s);
  if (s < 7200) return absl::StrFormat("%.0fm", s / 60);
  if (s < 172800) return absl::StrFormat("%.0fh", s / 3600);
  return absl::StrFormat("%.0fd", s / 86400);
}

std::string NodeState(const hymcache::v1::NodeInfo& n) {
  if (n.alive()) return n.draining() ? "DRAINING" : "alive";
  const std::string base = n.awaiting_reconcile() ? "RECONCILING" : "DEAD";
  return n.draining() ? base + ",DRAINING" : base;
}

std::string NarrowState(const hymcache::v1::NodeInfo& n) {
  if (n.alive()) return n.draining() ? "DRAINING" : "alive";
  const std::string base = n.awaiting_reconcile() ? "RECONCILING" : "DEAD";
  return n.draining() ? (n.awaiting_reconcile() ? "RECONC,DRAIN" : "DEAD,DRAIN")
                      : base;
}

std::string DeviceKind(const hymcache::v1::NodeInfo& n) {
  return n.regions_size() > 0 ? n.regions(0).device_kind() : "";
}

}  // namespace hymcache::hymctl
