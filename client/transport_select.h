// Transport selection: the data plane ClientOptions::transport asks for
// (TCP, shared memory, RDMA, or the first that reaches each node).
//
// Internal to the client library.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "client/options.h"
#include "client/transport.h"

namespace hymcache {

// Errors: Unavailable (kRdma on a host without an RDMA device).
absl::StatusOr<std::unique_ptr<Transport>> NewTransportFor(
    const ClientOptions& options);

}  // namespace hymcache
