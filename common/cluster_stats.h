// The master's cluster-wide numbers (GetStats), declared once. Every layer
// that carries them iterates this list instead of naming each by hand: the
// master fills GetStatsResponse and exports the gauges (hymcache_master_*),
// the client copies them into ClusterStatus (client/client.h), the C API
// into hymcache_cluster_stats, the Python binding into Client.stats(), and
// hymctl into `hymctl status --json`. A new number is one line here, one
// field in GetStatsResponse (proto/master.proto; field numbers never
// change) and, for the C API, one field at the end of
// hymcache_cluster_stats; the compiler names every layer that lacks it.
//
//   HYM_CLUSTER_STATS(GAUGE, COUNTER) expands, in order, to
//     GAUGE(field, metric, help)  a value the master computes at each call;
//                                 exported as the gauge `metric`
//     COUNTER(field)              the master's counter of the same name
//                                 (MasterServiceCounters, master_service.h)
//                                 since start, exported by it as
//                                 `field`_total
//   where `field` is the name of the GetStatsResponse field, of the
//   ClusterStatus and hymcache_cluster_stats members, and the key in Python
//   and in hymctl's JSON. Every value is a uint64.
//
// Plain preprocessor text: no includes, no dependencies.
#pragma once

#define HYM_CLUSTER_STATS(GAUGE, COUNTER)                                   \
  GAUGE(object_count, objects, "Committed objects listed")                  \
  GAUGE(object_bytes, object_bytes, "Bytes of committed objects")           \
  GAUGE(pending_puts, puts_in_flight, "Pending puts (started, not committed)") \
  GAUGE(nodes_alive, nodes_alive, "Storage nodes alive")                    \
  GAUGE(nodes_dead, nodes_dead, "Storage node records not alive")           \
  GAUGE(index_bytes_per_entry, index_bytes_per_entry,                       \
        "Heap bytes of the index per entry")                                \
  COUNTER(evicted_objects)                                                  \
  COUNTER(evicted_bytes)                                                    \
  COUNTER(reconciliations)                                                  \
  COUNTER(reconcile_dropped_listings)                                       \
  COUNTER(reconcile_unlisted_extents)                                       \
  COUNTER(read_repairs)

// A uint64_t member per stat, zero-initialized (C++ structs).
#define HYM_CLUSTER_STAT_GAUGE_MEMBER_(field, metric, help) \
  uint64_t field = 0;
#define HYM_CLUSTER_STAT_COUNTER_MEMBER_(field) uint64_t field = 0;
#define HYM_CLUSTER_STAT_MEMBERS                                 \
  HYM_CLUSTER_STATS(HYM_CLUSTER_STAT_GAUGE_MEMBER_,              \
                    HYM_CLUSTER_STAT_COUNTER_MEMBER_)
