#include "common/crc32c.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace hymcache::crc32c {
namespace {

// Bit by bit, straight from the definition: the reference the fast paths
// are checked against.
uint32_t Reference(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

using Fn = uint32_t (*)(uint32_t, const void*, size_t);

struct Impl {
  const char* name;
  Fn extend;
};

std::vector<Impl> Impls() {
  std::vector<Impl> v = {{"dispatch", &Extend}, {"table", &ExtendPortable}};
  if (HardwareAvailable()) v.push_back({"sse4.2", &ExtendHardware});
  return v;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

TEST_CASE("RFC 3720 B.4 test vectors and the check value") {
  uint8_t buf[32];
  for (const Impl& impl : Impls()) {
    INFO(impl.name);
    std::memset(buf, 0, sizeof(buf));
    CHECK(impl.extend(0, buf, sizeof(buf)) == 0x8A9136AAu);
    std::memset(buf, 0xFF, sizeof(buf));
    CHECK(impl.extend(0, buf, sizeof(buf)) == 0x62A8AB43u);
    for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
    CHECK(impl.extend(0, buf, sizeof(buf)) == 0x46DD794Eu);
    for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
    CHECK(impl.extend(0, buf, sizeof(buf)) == 0x113FDB5Cu);
    // An iSCSI SCSI Read (10) command PDU.
    const uint8_t pdu[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    CHECK(impl.extend(0, pdu, sizeof(pdu)) == 0xD9963A56u);
    // The catalogue's check value.
    CHECK(impl.extend(0, "123456789", 9) == 0xE3069283u);
    CHECK(impl.extend(0, "", 0) == 0);
  }
  CHECK(Value("123456789", 9) == 0xE3069283u);
}

TEST_CASE("Every path agrees with the bitwise reference, at any length and alignment") {
  // Long enough for several three-way blocks of both stripe sizes plus
  // every kind of tail.
  const std::vector<uint8_t> data = RandomBytes(3 * 3 * 8192 + 5000, 7);
  std::mt19937 gen(11);
  std::vector<size_t> lengths = {0, 1, 7, 8, 9, 255, 256, 767, 768, 769,
                                 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1,
                                 2 * 3 * 8192 + 3 * 256 + 13};
  for (int i = 0; i < 40; ++i) lengths.push_back(gen() % (data.size() - 64));
  for (size_t len : lengths) {
    for (size_t misalign : {size_t{0}, size_t{1}, size_t{3}, size_t{5}}) {
      const uint8_t* p = data.data() + misalign;
      const uint32_t want = Reference(p, len);
      for (const Impl& impl : Impls()) {
        INFO(impl.name << " len " << len << " misalign " << misalign);
        CHECK(impl.extend(0, p, len) == want);
      }
    }
  }
}

TEST_CASE("Extend continues a CRC; Combine merges CRCs of pieces") {
  const std::vector<uint8_t> data = RandomBytes(200000, 3);
  const uint32_t whole = Value(data.data(), data.size());
  std::mt19937 gen(5);
  for (int i = 0; i < 30; ++i) {
    const size_t cut = gen() % (data.size() + 1);
    const uint32_t a = Value(data.data(), cut);
    const uint32_t b = Value(data.data() + cut, data.size() - cut);
    INFO("cut " << cut);
    CHECK(Extend(a, data.data() + cut, data.size() - cut) == whole);
    CHECK(ExtendPortable(a, data.data() + cut, data.size() - cut) == whole);
    CHECK(Combine(a, b, data.size() - cut) == whole);
  }
  // Many small pieces, in order, as a streaming reader extends.
  uint32_t c = 0;
  for (size_t off = 0; off < data.size();) {
    const size_t n = std::min<size_t>(1 + gen() % 5000, data.size() - off);
    c = Extend(c, data.data() + off, n);
    off += n;
  }
  CHECK(c == whole);
  // Empty pieces change nothing.
  CHECK(Combine(whole, 0, 0) == whole);
  CHECK(Combine(0, whole, data.size()) == whole);
  // A long run of zeros: the shift by a large length.
  std::vector<uint8_t> zeros(1 << 20, 0);
  const uint32_t z = Value(zeros.data(), zeros.size());
  CHECK(Combine(whole, z, zeros.size()) ==
        Extend(whole, zeros.data(), zeros.size()));
}

TEST_CASE("A flipped bit or a torn tail changes the CRC") {
  std::vector<uint8_t> data = RandomBytes(64 * 1024, 9);
  const uint32_t good = Value(data.data(), data.size());
  data[40000] ^= 0x10;
  CHECK(Value(data.data(), data.size()) != good);
  data[40000] ^= 0x10;
  std::memset(data.data() + 60 * 1024, 0, 4 * 1024);
  CHECK(Value(data.data(), data.size()) != good);
}

TEST_CASE("The implementation is reported") {
  const std::string impl = Implementation();
  CHECK((impl == "sse4.2" || impl == "table"));
  CHECK((impl == "sse4.2") == HardwareAvailable());
}

}  // namespace
}  // namespace hymcache::crc32c
