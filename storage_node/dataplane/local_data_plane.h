// LocalDataPlane: testonly. A storage node's data plane in this process: the
// extent table, prefetch manager, TCP data server (port 0) and shared-memory
// export over a given device, wired as StorageNode wires them, without the
// master. For transport tests and benchmarks. It verifies capabilities
// signed by TestCapabilities (tests/signing_transport.h signs them).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/test_capabilities.h"
#include "storage_node/dataplane/data_server.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/kv_manager.h"
#include "storage_node/device/memory_device.h"
#include "storage_node/dataplane/shm_export.h"

namespace hymcache::storage {

struct LocalDataPlane {
  // Crashes (value() on an error) if a part cannot start: test setup only.
  explicit LocalDataPlane(std::unique_ptr<MemoryDevice> dev)
      : device(std::move(dev)) {
    ExtentTableOptions e;
    e.regions = device->Regions();
    extents = ExtentTable::Create(e).value();
    KvManagerOptions k;
    k.device = device.get();
    k.extents = extents.get();
    kv = KvManager::Create(k).value();
    DataServerOptions o;
    o.device = device.get();
    o.extents = extents.get();
    o.kv = kv.get();
    o.capabilities = TestCapabilities::Get().verifier();
    server = DataServer::Create(o).value();
    ShmExportOptions so;
    so.areas = device->Areas();
    shm_export = ShmExport::Create(so).value();
  }

  std::string data_address() const {
    return absl::StrCat("127.0.0.1:", server->port());
  }
  // What the storage node publishes for clients (shared memory).
  std::map<std::string, std::string> transport_params() const {
    return shm_export->TransportParams();
  }

  // Destroyed in reverse: the server before what it serves.
  std::unique_ptr<MemoryDevice> device;
  std::unique_ptr<ExtentTable> extents;
  std::unique_ptr<KvManager> kv;
  std::unique_ptr<DataServer> server;
  std::unique_ptr<ShmExport> shm_export;
};

}  // namespace hymcache::storage
