// tls_bench: what TLS would cost the TCP data plane. Moves --blocks blocks
// of --block_bytes (16 MiB) over one loopback TCP connection, the way a GET
// streams an object (a sender thread writes, the receiver reads into a
// caller's buffer), first in plaintext (send/recv), then through OpenSSL TLS
// 1.3 with AES-128-GCM (SSL_write/SSL_read, user space), alternating for
// --trials rounds; prints GB/s of each and the ratio. With --ktls it asks
// OpenSSL for kernel TLS (needs the kernel's "tls" ULP; reported whether it
// was used).
//
//   bazel run -c opt //tools/bench:tls_bench
//   bazel run -c opt //tools/bench:tls_bench -- --ktls
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cli.h"
#include "common/thread.h"

DEFINE_uint64(block_bytes, 16 << 20, "bytes per block (one GET's object)");
DEFINE_int32(blocks, 64, "blocks per measurement");
DEFINE_int32(trials, 3, "alternating plaintext / TLS rounds");
DEFINE_bool(ktls, false, "ask OpenSSL for kernel TLS offload");
DEFINE_string(cipher, "TLS_AES_128_GCM_SHA256", "TLS 1.3 cipher suite");

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "tls_bench: %s\n", what);
  ERR_print_errors_fp(stderr);
  std::exit(1);
}

// A connected loopback TCP pair: {sender, receiver}.
std::pair<int, int> Connect() {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (ls < 0 || bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(ls, 1) != 0 ||
      getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Die("listen");
  }
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    Die("connect");
  }
  int s = accept(ls, nullptr, nullptr);
  close(ls);
  int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {s, c};
}

// A self-signed P-256 certificate for the server side.
void SelfSigned(SSL_CTX* ctx) {
  EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  X509* x = X509_new();
  if (key == nullptr || x == nullptr) Die("keygen");
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), 0);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* n = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("bench"),
                             -1, -1, 0);
  X509_set_issuer_name(x, n);
  if (X509_sign(x, key, EVP_sha256()) == 0) Die("sign");
  if (SSL_CTX_use_certificate(ctx, x) != 1 ||
      SSL_CTX_use_PrivateKey(ctx, key) != 1) {
    Die("use cert");
  }
  X509_free(x);
  EVP_PKEY_free(key);
}

double Plain(std::vector<char>& src, std::vector<char>& dst) {
  auto [s, c] = Connect();
  const absl::Time t0 = absl::Now();
  hymcache::Thread sender("tls-bench-tx", [&, s = s] {
    for (int b = 0; b < FLAGS_blocks; ++b) {
      size_t off = 0;
      while (off < src.size()) {
        ssize_t n = send(s, src.data() + off, src.size() - off, 0);
        if (n <= 0) Die("send");
        off += n;
      }
    }
  });
  for (int b = 0; b < FLAGS_blocks; ++b) {
    size_t off = 0;
    while (off < dst.size()) {
      ssize_t n = recv(c, dst.data() + off, dst.size() - off, 0);
      if (n <= 0) Die("recv");
      off += n;
    }
  }
  sender.Join();
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  close(s);
  close(c);
  return static_cast<double>(FLAGS_blocks) * dst.size() / secs / 1e9;
}

double Tls(std::vector<char>& src, std::vector<char>& dst, bool* ktls_used) {
  SSL_CTX* sctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX* cctx = SSL_CTX_new(TLS_client_method());
  for (SSL_CTX* ctx : {sctx, cctx}) {
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_ciphersuites(ctx, FLAGS_cipher.c_str());
    if (FLAGS_ktls) SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
  }
  SelfSigned(sctx);
  auto [s, c] = Connect();
  SSL* ss = SSL_new(sctx);
  SSL* cs = SSL_new(cctx);
  SSL_set_fd(ss, s);
  SSL_set_fd(cs, c);
  hymcache::Thread handshake("tls-bench-hs", [ss = ss] {
    if (SSL_accept(ss) != 1) Die("accept");
  });
  if (SSL_connect(cs) != 1) Die("connect");
  handshake.Join();
  *ktls_used = BIO_get_ktls_send(SSL_get_wbio(ss)) != 0;
  const absl::Time t0 = absl::Now();
  hymcache::Thread sender("tls-bench-tx", [&, ss = ss] {
    for (int b = 0; b < FLAGS_blocks; ++b) {
      size_t off = 0;
      while (off < src.size()) {
        size_t n = 0;
        if (SSL_write_ex(ss, src.data() + off, src.size() - off, &n) != 1) {
          Die("SSL_write");
        }
        off += n;
      }
    }
  });
  for (int b = 0; b < FLAGS_blocks; ++b) {
    size_t off = 0;
    while (off < dst.size()) {
      size_t n = 0;
      if (SSL_read_ex(cs, dst.data() + off, dst.size() - off, &n) != 1) {
        Die("SSL_read");
      }
      off += n;
    }
  }
  sender.Join();
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  SSL_free(ss);
  SSL_free(cs);
  close(s);
  close(c);
  SSL_CTX_free(sctx);
  SSL_CTX_free(cctx);
  return static_cast<double>(FLAGS_blocks) * dst.size() / secs / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "tls_bench",
       .usage = "tls_bench: what TLS would cost the TCP data plane",
       .main_file = __FILE__},
      &argc, &argv);
  if (FLAGS_trials < 1 || FLAGS_blocks < 1 || FLAGS_block_bytes == 0) {
    Die("--trials, --blocks and --block_bytes must be at least 1");
  }
  std::vector<char> src(FLAGS_block_bytes), dst(FLAGS_block_bytes);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131);
  std::vector<double> plain, tls;
  bool ktls = false;
  for (int t = 0; t < FLAGS_trials; ++t) {
    plain.push_back(Plain(src, dst));
    tls.push_back(Tls(src, dst, &ktls));
    if (std::memcmp(src.data(), dst.data(), dst.size()) != 0) {
      Die("received bytes differ");
    }
  }
  std::sort(plain.begin(), plain.end());
  std::sort(tls.begin(), tls.end());
  const double p = plain[plain.size() / 2], s = tls[tls.size() / 2];
  std::printf(
      "block_bytes=%lu blocks=%d trials=%d cipher=%s ktls=%s\n"
      "plaintext %.2f GB/s, TLS %.2f GB/s (medians): TLS/plaintext = %.2fx, "
      "cost %.2fx\n",
      static_cast<unsigned long>(FLAGS_block_bytes), FLAGS_blocks,
      FLAGS_trials, FLAGS_cipher.c_str(),
      FLAGS_ktls ? (ktls ? "used" : "requested, not available") : "off", p, s,
      s / p, p / s);
  return 0;
}
