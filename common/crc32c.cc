#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace hymcache::crc32c {
namespace {

// Polynomials are kept "reflected": bit 31 is the coefficient of x^0, bit 0
// that of x^31. A raw CRC state (no pre/post inversion) is the remainder of
// the message polynomial times x^32 modulo P; one byte b moves the state s
// to (s ^ b) * x^8 mod P, which is linear in (s, b). Hence, over GF(2):
//   raw(s, A || B) = raw(s, A) * x^(8|B|)  ^  raw(0, B)
// and the standard CRC is ~raw(~crc, data).
constexpr uint32_t kPoly = 0x82F63B78u;
constexpr uint32_t kOne = 1u << 31;  // the polynomial 1 (x^0)

// a * b mod P.
uint32_t MulMod(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = kOne; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;  // b *= x
  }
  return product;
}

// x^(2^k) mod P for k in [0, 67): enough for x^(8n) with any 64-bit n.
struct PowersOfTwo {
  std::array<uint32_t, 67> pow{};
  PowersOfTwo() {
    pow[0] = kOne >> 1;  // x^1
    for (size_t k = 1; k < pow.size(); ++k) pow[k] = MulMod(pow[k - 1], pow[k - 1]);
  }
};

// x^(8 n) mod P: the operator "followed by n zero bytes".
uint32_t XPowBytes(uint64_t n) {
  static const PowersOfTwo kPowers;
  uint32_t result = kOne;
  for (size_t k = 3; n != 0; n >>= 1, ++k) {
    if (n & 1) result = MulMod(kPowers.pow[k], result);
  }
  return result;
}

// ------------------------------------------------------------- table path

struct SliceTables {
  // t[k][b]: the raw state after byte b followed by k zero bytes.
  uint32_t t[8][256];
  SliceTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t i = 0; i < 256; ++i) {
        t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
      }
    }
  }
};

const SliceTables& Slices() {
  static const SliceTables kTables;
  return kTables;
}

// Little-endian loads, whatever the host's byte order.
inline uint32_t Load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

uint32_t RawPortable(uint32_t s, const uint8_t* p, size_t n) {
  const SliceTables& tb = Slices();
  while (n >= 8) {
    const uint32_t lo = s ^ Load32(p);
    const uint32_t hi = Load32(p + 4);
    s = tb.t[7][lo & 0xFF] ^ tb.t[6][(lo >> 8) & 0xFF] ^
        tb.t[5][(lo >> 16) & 0xFF] ^ tb.t[4][lo >> 24] ^ tb.t[3][hi & 0xFF] ^
        tb.t[2][(hi >> 8) & 0xFF] ^ tb.t[1][(hi >> 16) & 0xFF] ^
        tb.t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    s = tb.t[0][(s ^ *p) & 0xFF] ^ (s >> 8);
    ++p;
    --n;
  }
  return s;
}

// ---------------------------------------------------------- hardware path

#if defined(__x86_64__)

// The crc32 instruction takes 3 cycles of latency but can start one per
// cycle: three independent streams over consecutive stripes of a block keep
// it busy; their states are then merged with "times x^(8 stripe)".
constexpr size_t kLongStripe = 8192;
constexpr size_t kShortStripe = 256;

// The linear map s -> s * x^(8 len) mod P, as four byte-indexed tables.
struct ShiftTables {
  uint32_t t[4][256];
  explicit ShiftTables(size_t len) {
    const uint32_t x = XPowBytes(len);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = MulMod(x, b << (8 * k));
    }
  }
  uint32_t Apply(uint32_t s) const {
    return t[0][s & 0xFF] ^ t[1][(s >> 8) & 0xFF] ^ t[2][(s >> 16) & 0xFF] ^
           t[3][s >> 24];
  }
};

struct HardwareTables {
  ShiftTables long_shift{kLongStripe};
  ShiftTables short_shift{kShortStripe};
};

const HardwareTables& Shifts() {
  static const HardwareTables kTables;
  return kTables;
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // x86 is little-endian
  return v;
}

template <size_t kStripe>
__attribute__((target("sse4.2"))) inline uint64_t ThreeWay(
    uint64_t c0, const uint8_t* p, const ShiftTables& shift) {
  uint64_t c1 = 0;
  uint64_t c2 = 0;
  for (const uint8_t* end = p + kStripe; p < end; p += 8) {
    c0 = _mm_crc32_u64(c0, Load64(p));
    c1 = _mm_crc32_u64(c1, Load64(p + kStripe));
    c2 = _mm_crc32_u64(c2, Load64(p + 2 * kStripe));
  }
  c0 = shift.Apply(static_cast<uint32_t>(c0)) ^ c1;
  return shift.Apply(static_cast<uint32_t>(c0)) ^ c2;
}

__attribute__((target("sse4.2"))) uint32_t RawHardware(uint32_t s,
                                                       const uint8_t* p,
                                                       size_t n) {
  const HardwareTables& tb = Shifts();
  uint64_t c = s;
  while (n >= 3 * kLongStripe) {
    c = ThreeWay<kLongStripe>(c, p, tb.long_shift);
    p += 3 * kLongStripe;
    n -= 3 * kLongStripe;
  }
  while (n >= 3 * kShortStripe) {
    c = ThreeWay<kShortStripe>(c, p, tb.short_shift);
    p += 3 * kShortStripe;
    n -= 3 * kShortStripe;
  }
  for (; n >= 8; p += 8, n -= 8) c = _mm_crc32_u64(c, Load64(p));
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}

bool DetectHardware() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}

#else  // !__x86_64__

uint32_t RawHardware(uint32_t s, const uint8_t* p, size_t n) {
  return RawPortable(s, p, n);
}
bool DetectHardware() { return false; }

#endif

using RawFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);

struct Dispatch {
  bool hardware;
  RawFn raw;
  Dispatch() : hardware(DetectHardware()) {
    raw = hardware ? &RawHardware : &RawPortable;
  }
};

const Dispatch& Chosen() {
  static const Dispatch kDispatch;
  return kDispatch;
}

}  // namespace

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  return ~Chosen().raw(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ~RawPortable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n) {
  if (!Chosen().hardware) return ExtendPortable(crc, data, n);
  return ~RawHardware(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // The standard CRCs' inversions cancel out:
  //   crc(A || B) = crc(A) * x^(8|B|) ^ crc(B)   (see the top of this file).
  return MulMod(XPowBytes(len_b), crc_a) ^ crc_b;
}

const char* Implementation() { return Chosen().hardware ? "sse4.2" : "table"; }

bool HardwareAvailable() { return Chosen().hardware; }

}  // namespace hymcache::crc32c
