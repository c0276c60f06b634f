// Unit tests for the verbs layer that need no RDMA device: device discovery
// on a host without one, and the QpInfo wire encoding. The data path is
// tested on Soft-RoCE by rdma_loopback_test (tests/vmtest/run.sh rdma ...).
#include "common/rdma.h"

#include <catch2/catch.hpp>
#include <string>

namespace hymcache::rdma {
namespace {

QpInfo SampleInfo() {
  QpInfo q;
  q.qpn = 0x123456;
  q.psn = 0xABCDEF;
  q.lid = 0xBEEF;
  for (int i = 0; i < 16; ++i) q.gid[i] = static_cast<uint8_t>(0xF0 + i);
  q.mtu = 4096;
  return q;
}

TEST_CASE("Open without a device is Unavailable, never a crash") {
  if (!ListDevices().empty()) {
    WARN("this host has RDMA devices; checking only a missing name");
  } else {
    CHECK(absl::IsUnavailable(Available()));
    auto dev = Device::Open({});
    REQUIRE_FALSE(dev.ok());
    CHECK(absl::IsUnavailable(dev.status()));
    CHECK(dev.status().message().find("no RDMA device") != std::string::npos);
  }
  DeviceOptions o;
  o.device_name = "hymcache-no-such-device";
  auto dev = Device::Open(o);
  REQUIRE_FALSE(dev.ok());
  CHECK(absl::IsUnavailable(dev.status()));
  CHECK(dev.status().message().find("no RDMA device") != std::string::npos);
}

TEST_CASE("QueuePair::Create without a device is InvalidArgument") {
  auto qp = QueuePair::Create(nullptr, {});
  REQUIRE_FALSE(qp.ok());
  CHECK(absl::IsInvalidArgument(qp.status()));
}

TEST_CASE("QpInfo round-trips through Encode/Decode") {
  QpInfo q = SampleInfo();
  std::string bytes = q.Encode();
  CHECK(bytes.size() == 34);
  CHECK(bytes.substr(0, 4) == "HQP1");
  auto back = QpInfo::Decode(bytes);
  REQUIRE(back.ok());
  CHECK(*back == q);

  for (uint32_t mtu : {256u, 512u, 1024u, 2048u, 4096u}) {
    QpInfo m = q;
    m.mtu = mtu;
    m.lid = 0;
    m.gid = {};
    auto r = QpInfo::Decode(m.Encode());
    REQUIRE(r.ok());
    CHECK(*r == m);
  }
}

TEST_CASE("QpInfo::Decode rejects malformed input") {
  const std::string good = SampleInfo().Encode();
  CHECK(absl::IsInvalidArgument(QpInfo::Decode("").status()));
  CHECK(absl::IsInvalidArgument(
      QpInfo::Decode(good.substr(0, good.size() - 1)).status()));
  CHECK(absl::IsInvalidArgument(QpInfo::Decode(good + "x").status()));

  std::string bad_magic = good;
  bad_magic[3] = '2';
  CHECK(absl::IsInvalidArgument(QpInfo::Decode(bad_magic).status()));

  QpInfo q = SampleInfo();
  q.qpn = 0x1000000;  // 25 bits
  CHECK(absl::IsInvalidArgument(QpInfo::Decode(q.Encode()).status()));
  q = SampleInfo();
  q.psn = 0xFFFFFFFF;
  CHECK(absl::IsInvalidArgument(QpInfo::Decode(q.Encode()).status()));
  for (uint32_t mtu : {0u, 128u, 1500u, 8192u}) {
    q = SampleInfo();
    q.mtu = mtu;
    CHECK(absl::IsInvalidArgument(QpInfo::Decode(q.Encode()).status()));
  }
}

}  // namespace
}  // namespace hymcache::rdma
