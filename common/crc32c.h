// CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78): the
// checksum of iSCSI (RFC 3720), ext4 metadata, RocksDB and leveldb blocks.
// HyMCache uses it for the capacity file's header and for every object the
// hybrid device flushes to its capacity tier.
//
// Two implementations, chosen once at run time (never by #ifdef):
//   * "sse4.2": the x86 crc32 instruction, three independent streams
//     interleaved (the instruction's latency is three times its issue
//     interval) and merged with precomputed shift tables;
//   * "table": portable slicing-by-8 (eight 256-entry tables, 8 bytes per
//     step).
// Both give identical results for every input (crc32c_test).
//
// API in the style of leveldb's crc32c::Extend: Value(data) is the CRC of
// data; Extend(Value(a), b) == Value(a + b); Combine(Value(a), Value(b),
// len(b)) == Value(a + b) without touching the bytes again (for CRCs
// computed in parallel over pieces).
//
// Thread safety: every function is safe to call concurrently (the tables
// are built once, on first use, under the C++ static-initialization lock).
#pragma once

#include <cstddef>
#include <cstdint>

namespace hymcache::crc32c {

// The CRC32C of concat(A, data[0, n)), where `crc` is the CRC32C of some
// string A (0 for the empty string).
uint32_t Extend(uint32_t crc, const void* data, size_t n);

// The CRC32C of data[0, n).
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

// The CRC32C of concat(A, B) from crc_a = Value(A), crc_b = Value(B) and
// len_b = |B|. O(log len_b), independent of the bytes.
uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// The implementation Extend uses on this CPU: "sse4.2" or "table".
const char* Implementation();

// Whether the CPU has the SSE4.2 crc32 instruction.
bool HardwareAvailable();

// The two implementations, for tests and benchmarks. ExtendHardware
// REQUIRES: HardwareAvailable() (otherwise it returns ExtendPortable's
// result).
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n);

}  // namespace hymcache::crc32c
