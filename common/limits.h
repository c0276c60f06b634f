// Limits that more than one component enforces, each stated once here.
//
// A name the master registers must also fit every place that stores or
// checks it (the identities file's nodes= lists, a capacity file's header),
// so those places take the limit from here instead of repeating a number.
#pragma once

#include <cstddef>

namespace hymcache {

// Bytes in a storage node's name: what RegisterNode accepts (documented in
// proto/master.proto), what an identity's nodes= list may name, what a
// capacity file records and what StorageNodeOptions::Validate allows.
inline constexpr size_t kMaxNodeNameBytes = 128;

// Bytes in a host name (a DNS name's most): a storage node's host
// (RegisterNodeRequest.host) and a reader's (BatchLookupRequest.reader_host,
// ClientOptions::host), which the master compares.
inline constexpr size_t kMaxHostBytes = 253;

// Bytes in an engine's id (ReportEngineBlocksRequest.engine_id: 1..this;
// the C API's HYMCACHE_MAX_ENGINE_ID).
inline constexpr size_t kMaxEngineIdBytes = 128;

}  // namespace hymcache
