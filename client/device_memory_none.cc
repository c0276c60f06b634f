// The DeviceMemory of a build without CUDA: it refuses every device call.
#include <memory>

#include "absl/strings/string_view.h"
#include "client/device_memory.h"

namespace hymcache {
namespace {

absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "device memory: this HyMCache client was built without CUDA (build it "
      "with bazel build --config=cuda)");
}

class NoDeviceMemory : public DeviceMemory {
 public:
  absl::string_view name() const override { return "none"; }
  absl::StatusOr<void*> AllocatePinned(size_t) override { return NoCuda(); }
  void FreePinned(void*) override {}
  absl::StatusOr<std::unique_ptr<DeviceStream>> NewStream(int) override {
    return NoCuda();
  }
};

}  // namespace

std::unique_ptr<DeviceMemory> NewNoDeviceMemory() {
  return std::make_unique<NoDeviceMemory>();
}

}  // namespace hymcache
