#include "common/security.h"

#include <arpa/inet.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/limits.h"
#include "common/mutex.h"
#include "common/net.h"

namespace hymcache {

namespace {

constexpr absl::string_view kSha256Prefix = "sha256:";
constexpr absl::string_view kCertPrefix = "cert:";
constexpr absl::string_view kBearer = "Bearer ";
constexpr absl::string_view kNodesPrefix = "nodes=";
// Identities files are small; refuse anything absurd.
constexpr uintmax_t kMaxFileBytes = 16 << 20;

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(absl::StrCat(path, ": ", ec.message()));
    }
    return absl::PermissionDeniedError(absl::StrCat(path, ": ", ec.message()));
  }
  if (size > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": larger than ", kMaxFileBytes, " bytes"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open"));
  }
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return out.str();
}

bool IsLowerHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kEngine:
      return "engine";
    case Role::kAdmin:
      return "admin";
    case Role::kNode:
      return "node";
  }
  return "?";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  if (name == "engine") return Role::kEngine;
  if (name == "admin") return Role::kAdmin;
  if (name == "node") return Role::kNode;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", name, "' (engine, admin or node)"));
}

std::string Roles::ToString() const {
  std::vector<std::string> names;
  for (Role r : {Role::kEngine, Role::kAdmin, Role::kNode}) {
    if (Contains(r)) names.push_back(RoleName(r));
  }
  return names.empty() ? "none" : absl::StrJoin(names, "|");
}

std::string TokenHash(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
         digest);
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(digest), sizeof(digest)));
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("RAND_bytes failed");
  }
  return absl::StrCat("hym_", absl::BytesToHexString(absl::string_view(
                                  reinterpret_cast<const char*>(bytes),
                                  sizeof(bytes))));
}

std::string IdentityLine(Role role, absl::string_view tenant,
                         absl::string_view name, absl::string_view token,
                         const std::vector<std::string>& node_names) {
  std::string line =
      absl::StrCat(RoleName(role), " ", tenant.empty() ? "-" : tenant, " ",
                   name, " ", kSha256Prefix, TokenHash(token));
  if (!node_names.empty()) {
    absl::StrAppend(&line, " ", kNodesPrefix, absl::StrJoin(node_names, ","));
  }
  return line;
}

absl::Status CheckNodeName(const Identity& id, absl::string_view node_name,
                           absl::string_view method) {
  if (id.role != Role::kNode || id.node_names.empty()) {
    return absl::OkStatus();
  }
  for (const std::string& n : id.node_names) {
    if (n == node_name) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      method, ": identity '", id.name, "' may act as node",
      id.node_names.size() == 1 ? " '" : "s '",
      absl::StrJoin(id.node_names, "', '"), "' only, not as node '", node_name,
      "' (nodes= in the identities file)"));
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  auto text = ReadSmallFile(path);
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": empty token"));
  }
  if (std::any_of(token.begin(), token.end(), [](char c) {
        return absl::ascii_isspace(static_cast<unsigned char>(c)) ||
               !absl::ascii_isprint(static_cast<unsigned char>(c));
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a token is one word of printable characters"));
  }
  return token;
}

Identity AnonymousAdmin() {
  return Identity{Role::kAdmin, std::string(kDefaultTenant), "anonymous"};
}

// ---------------------------------------------------------------------------
// Authenticator

absl::Status Authenticator::ParseInto(absl::string_view text,
                                      absl::string_view source, Table* table) {
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_no, ": ", why,
                       " (expected: role tenant name sha256:HEX | cert:NAME "
                       "[nodes=NAME,...])"));
    };
    if (f.size() != 4 && f.size() != 5) return bad("4 or 5 fields required");
    auto role = ParseRole(f[0]);
    if (!role.ok()) return bad(role.status().message());
    Identity id;
    id.role = *role;
    id.tenant = f[1] == "-" ? std::string(kDefaultTenant) : std::string(f[1]);
    id.name = std::string(f[2]);
    if (id.tenant.size() > 64 || id.name.size() > 128) {
      return bad("tenant (64) or name (128) too long");
    }
    if (f.size() == 5) {
      absl::string_view nodes = f[4];
      if (!absl::ConsumePrefix(&nodes, kNodesPrefix)) {
        return bad("the fifth field must be nodes=NAME[,NAME...]");
      }
      if (id.role != Role::kNode) return bad("nodes= is for role node only");
      for (absl::string_view n : absl::StrSplit(nodes, ',')) {
        if (n.empty() || n.size() > kMaxNodeNameBytes) {
          return bad(absl::StrCat("nodes= takes node names of 1..",
                                  kMaxNodeNameBytes,
                                  " bytes, comma-separated"));
        }
        id.node_names.emplace_back(n);
      }
    } else if (id.role == Role::kNode) {
      table->warnings.push_back(absl::StrCat(
          source, ":", line_no, ": node identity '", id.name,
          "' is not bound to node names: it may register as any node (add "
          "nodes=NAME[,NAME...], see docs/security.md)"));
    }
    absl::string_view cred = f[3];
    if (absl::ConsumePrefix(&cred, kSha256Prefix)) {
      if (cred.size() != 64 || !IsLowerHex(cred)) {
        return bad("sha256: takes 64 lowercase hex digits");
      }
      if (!table->by_token_hash.emplace(std::string(cred), id).second) {
        return bad("the same token twice");
      }
    } else if (absl::ConsumePrefix(&cred, kCertPrefix)) {
      if (cred.empty()) return bad("cert: takes a certificate name");
      if (!table->by_cert_name.emplace(std::string(cred), id).second) {
        return bad("the same certificate name twice");
      }
    } else {
      return bad("credential must start with sha256: or cert:");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Authenticator::Table> Authenticator::Load(
    const std::string& path) {
  Table table;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      // Kubernetes secret mounts hold ..data and dotted symlinks.
      if (name.empty() || name[0] == '.') continue;
      if (!std::filesystem::is_regular_file(e.path(), ec)) continue;
      files.push_back(e.path().string());
    }
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat(path, ": ", ec.message()));
    }
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      auto text = ReadSmallFile(f);
      if (!text.ok()) return text.status();
      absl::Status s = ParseInto(*text, f, &table);
      if (!s.ok()) return s;
    }
  } else {
    auto text = ReadSmallFile(path);
    if (!text.ok()) return text.status();
    absl::Status s = ParseInto(*text, path, &table);
    if (!s.ok()) return s;
  }
  return table;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(
    const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError("identities file: empty path");
  }
  auto table = Load(path);
  if (!table.ok()) return table.status();
  std::unique_ptr<Authenticator> a(new Authenticator(path));
  a->table_ = std::make_shared<const Table>(std::move(table).value());
  return a;
}

absl::Status Authenticator::Reload() {
  if (path_.empty()) return absl::OkStatus();
  auto table = Load(path_);
  if (!table.ok()) return table.status();
  std::atomic_store(&table_, std::make_shared<const Table>(
                                 std::move(table).value()));
  return absl::OkStatus();
}

size_t Authenticator::size() const {
  return std::atomic_load(&table_)->size();
}

std::vector<std::string> Authenticator::Warnings() const {
  return std::atomic_load(&table_)->warnings;
}

absl::StatusOr<Identity> Authenticator::CheckCredentials(
    absl::string_view authorization,
    const std::vector<std::string>& cert_names, Roles allowed,
    absl::string_view method) const {
  const std::shared_ptr<const Table> table = std::atomic_load(&table_);
  const Identity* id = nullptr;
  if (!authorization.empty()) {
    absl::string_view token = authorization;
    if (!absl::ConsumePrefix(&token, kBearer) || token.empty()) {
      return absl::UnauthenticatedError(
          absl::StrCat(method, ": the authorization metadata must be "
                               "'Bearer <token>'"));
    }
    auto it = table->by_token_hash.find(TokenHash(token));
    if (it == table->by_token_hash.end()) {
      return absl::UnauthenticatedError(absl::StrCat(
          method, ": unknown token (not in the server's identities file; "
                  "revoked, or from another cluster)"));
    }
    id = &it->second;
  } else {
    for (const std::string& n : cert_names) {
      auto it = table->by_cert_name.find(n);
      if (it != table->by_cert_name.end()) {
        id = &it->second;
        break;
      }
    }
    if (id == nullptr) {
      return absl::UnauthenticatedError(absl::StrCat(
          method,
          cert_names.empty()
              ? ": no credentials (pass a token with --token_file, or a "
                "client certificate named in the identities file)"
              : absl::StrCat(": client certificate '", cert_names.front(),
                             "' is not in the server's identities file")));
    }
  }
  if (!allowed.Contains(id->role)) {
    return absl::PermissionDeniedError(absl::StrCat(
        method, ": '", id->name, "' has role ", RoleName(id->role),
        "; this method needs ", allowed.ToString()));
  }
  return *id;
}

absl::StatusOr<Identity> Authenticator::Check(
    const grpc::ServerContextBase& ctx, Roles allowed,
    absl::string_view method) const {
  absl::string_view authorization;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  std::vector<std::string> cert_names;
  if (authorization.empty()) {
    std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    // Peer identity is set only for a certificate the TLS layer verified.
    if (auth != nullptr && auth->IsPeerAuthenticated()) {
      for (const char* prop :
           {"x509_common_name", "x509_subject_alternative_name"}) {
        for (const grpc::string_ref& v : auth->FindPropertyValues(prop)) {
          cert_names.emplace_back(v.data(), v.size());
        }
      }
    }
  }
  return CheckCredentials(authorization, cert_names, allowed, method);
}

// ---------------------------------------------------------------------------
// TLS and channels

absl::Status TlsOptions::Validate() const {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls: cert_file and key_file go together");
  }
  if (require_client_cert && ca_file.empty()) {
    return absl::InvalidArgumentError(
        "tls: require_client_cert needs ca_file (the CA of client "
        "certificates)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls) {
  absl::Status valid = tls.Validate();
  if (!valid.ok()) return valid;
  if (!tls.ServerEnabled()) {
    if (tls.require_client_cert) {
      return absl::InvalidArgumentError(
          "tls: require_client_cert without a server certificate");
    }
    return grpc::InsecureServerCredentials();
  }
  auto cert = ReadSmallFile(tls.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadSmallFile(tls.key_file);
  if (!key.ok()) return key.status();
  grpc_ssl_client_certificate_request_type request =
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  std::string ca;
  if (!tls.ca_file.empty()) {
    auto c = ReadSmallFile(tls.ca_file);
    if (!c.ok()) return c.status();
    ca = std::move(c).value();
    request = tls.require_client_cert
                  ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                  : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  grpc::SslServerCredentialsOptions o(request);
  o.pem_root_certs = ca;
  o.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(o);
}

// ---------------------------------------------------------------------------
// ReloadableServerTls

namespace {

struct TlsMaterial {
  std::string cert;
  std::string key;
  std::string ca;  // "" without ca_file
};

// Every certificate in `pem` (at least one). InvalidArgument naming `path`.
absl::Status CheckCertificates(const std::string& pem, const std::string& path,
                               X509** first) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new_mem_buf");
  int n = 0;
  while (X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    if (n++ == 0 && first != nullptr) {
      *first = x;
    } else {
      X509_free(x);
    }
  }
  BIO_free(bio);
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no PEM certificate in it"));
  }
  return absl::OkStatus();
}

// Reads the files and checks that they parse and that the key is the
// certificate's.
absl::StatusOr<TlsMaterial> ReadTlsMaterial(const TlsOptions& tls) {
  TlsMaterial m;
  auto cert = ReadSmallFile(tls.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadSmallFile(tls.key_file);
  if (!key.ok()) return key.status();
  m.cert = std::move(cert).value();
  m.key = std::move(key).value();
  if (!tls.ca_file.empty()) {
    auto ca = ReadSmallFile(tls.ca_file);
    if (!ca.ok()) return ca.status();
    m.ca = std::move(ca).value();
    absl::Status s = CheckCertificates(m.ca, tls.ca_file, nullptr);
    if (!s.ok()) return s;
  }
  X509* leaf = nullptr;
  absl::Status s = CheckCertificates(m.cert, tls.cert_file, &leaf);
  if (!s.ok()) return s;
  BIO* bio = BIO_new_mem_buf(m.key.data(), static_cast<int>(m.key.size()));
  EVP_PKEY* pkey =
      bio == nullptr ? nullptr
                     : PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  if (bio != nullptr) BIO_free(bio);
  if (pkey == nullptr) {
    s = absl::InvalidArgumentError(
        absl::StrCat(tls.key_file, ": no PEM private key in it"));
  } else if (X509_check_private_key(leaf, pkey) != 1) {
    s = absl::InvalidArgumentError(
        absl::StrCat(tls.key_file, ": not the private key of ", tls.cert_file));
  }
  EVP_PKEY_free(pkey);
  X509_free(leaf);
  if (!s.ok()) return s;
  return m;
}

}  // namespace

struct ReloadableServerTls::State {
  // One per listening port: gRPC makes one security connector per port, and
  // each must be told of a new version once. gRPC's certificate-config
  // fetcher has no release callback, and a handshake that began before its
  // server shut down can call Fetch after the server and the
  // ReloadableServerTls are gone; so every Port, and the State it holds, is
  // kept until the process exits (PortRegistry: a few hundred bytes per
  // listening port ever made). ~ReloadableServerTls drops its copy of the
  // material; a Fetch after that leaves gRPC with the config it last handed
  // (gRPC's own copy), so the server's certificate no longer reloads.
  struct Port {
    std::shared_ptr<State> state;
    uint64_t version_handed = 0;  // guarded by state->mu
  };

  TlsOptions options;
  mutable Mutex mu;
  TlsMaterial material ABSL_GUARDED_BY(mu);
  uint64_t version ABSL_GUARDED_BY(mu) = 1;
  // Set by ~ReloadableServerTls, with the material cleared.
  bool closed ABSL_GUARDED_BY(mu) = false;

  // grpc_ssl_server_certificate_config_callback: gRPC calls it at each new
  // handshake on the port (under the port's connector lock) and owns the
  // config it returns.
  static grpc_ssl_certificate_config_reload_status Fetch(
      void* user_data, grpc_ssl_server_certificate_config** config) {
    Port* port = static_cast<Port*>(user_data);
    State* st = port->state.get();
    MutexLock l(&st->mu);
    if (st->closed) {
      // gRPC keeps the config it was last handed.
      return port->version_handed == 0
                 ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL
                 : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    }
    if (port->version_handed == st->version) {
      return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    }
    grpc_ssl_pem_key_cert_pair pair{st->material.key.c_str(),
                                    st->material.cert.c_str()};
    // gRPC requires root certificates in a fetched config even when it
    // requests no client certificate (it then never uses them): without a
    // CA, the server's own chain stands in.
    const std::string& roots =
        st->material.ca.empty() ? st->material.cert : st->material.ca;
    *config =
        grpc_ssl_server_certificate_config_create(roots.c_str(), &pair, 1);
    if (*config == nullptr) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    port->version_handed = st->version;
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
  }

  // A new Port of `state`, kept until the process exits (see Port).
  static Port* NewPort(std::shared_ptr<State> state);
};

namespace {

// Every Port ever handed to gRPC (see ReloadableServerTls::State::Port).
// Never destroyed: a handshake thread may use a Port during exit.
class PortRegistry {
 public:
  static PortRegistry& Get() {
    static PortRegistry* const registry = new PortRegistry;
    return *registry;
  }
  ReloadableServerTls::State::Port* Add(
      std::unique_ptr<ReloadableServerTls::State::Port> port) {
    MutexLock l(&mu_);
    ports_.push_back(std::move(port));
    return ports_.back().get();
  }

 private:
  Mutex mu_;
  std::vector<std::unique_ptr<ReloadableServerTls::State::Port>> ports_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

ReloadableServerTls::State::Port* ReloadableServerTls::State::NewPort(
    std::shared_ptr<State> state) {
  auto port = std::make_unique<Port>();
  port->state = std::move(state);
  return PortRegistry::Get().Add(std::move(port));
}

namespace {

// grpc::ServerCredentials over the C core's SSL credentials with a
// certificate-config fetcher (the C++ API offers only static SSL material,
// or a file watcher that polls and drops bad files).
class ReloadingServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit ReloadingServerCredentials(
      std::shared_ptr<ReloadableServerTls::State> state)
      : state_(std::move(state)) {}

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/)
      override {
    // Unused: callers are checked by Authenticator in the handlers.
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    ReloadableServerTls::State::Port* port =
        ReloadableServerTls::State::NewPort(state_);
    const TlsOptions& tls = state_->options;
    grpc_ssl_client_certificate_request_type request =
        GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
    if (!tls.ca_file.empty()) {
      request = tls.require_client_cert
                    ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                    : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    grpc_ssl_server_credentials_options* options =
        grpc_ssl_server_credentials_create_options_using_config_fetcher(
            request, &ReloadableServerTls::State::Fetch, port);
    // Takes ownership of `options`.
    grpc_server_credentials* creds =
        grpc_ssl_server_credentials_create_with_options(options);
    if (creds == nullptr) return 0;
    const int bound = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);  // the port holds its own ref
    return bound;
  }

  const std::shared_ptr<ReloadableServerTls::State> state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReloadableServerTls>>
ReloadableServerTls::Create(const TlsOptions& tls) {
  absl::Status valid = tls.Validate();
  if (!valid.ok()) return valid;
  std::unique_ptr<ReloadableServerTls> t(new ReloadableServerTls);
  if (!tls.ServerEnabled()) {
    if (tls.require_client_cert) {
      return absl::InvalidArgumentError(
          "tls: require_client_cert without a server certificate");
    }
    t->credentials_ = grpc::InsecureServerCredentials();
    return t;
  }
  auto material = ReadTlsMaterial(tls);
  if (!material.ok()) return material.status();
  t->state_ = std::make_shared<State>();
  t->state_->options = tls;
  {
    MutexLock l(&t->state_->mu);
    t->state_->material = std::move(material).value();
  }
  t->credentials_ = std::make_shared<ReloadingServerCredentials>(t->state_);
  return t;
}

ReloadableServerTls::~ReloadableServerTls() {
  if (state_ == nullptr) return;
  // The State outlives this object (its ports are gRPC's until exit): drop
  // our copy of the key now; gRPC keeps the config it last fetched.
  MutexLock l(&state_->mu);
  state_->closed = true;
  state_->material = TlsMaterial();
}

absl::Status ReloadableServerTls::Reload() {
  if (state_ == nullptr) return absl::OkStatus();
  auto material = ReadTlsMaterial(state_->options);
  if (!material.ok()) return material.status();
  MutexLock l(&state_->mu);
  if (material->cert == state_->material.cert &&
      material->key == state_->material.key &&
      material->ca == state_->material.ca) {
    return absl::OkStatus();
  }
  state_->material = std::move(material).value();
  ++state_->version;
  return absl::OkStatus();
}

uint64_t ReloadableServerTls::reloads() const {
  if (state_ == nullptr) return 0;
  MutexLock l(&state_->mu);
  return state_->version - 1;
}

namespace {

// Adds "authorization: Bearer <token>" to every call's initial metadata.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(std::string value) : value_(std::move(value)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      m->GetSendInitialMetadata()->emplace("authorization", value_);
    }
    m->Proceed();
  }

 private:
  const std::string value_;
};

class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token)
      : value_(absl::StrCat(kBearer, token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerInterceptor(value_);
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& target, const ChannelSecurity& security,
    const grpc::ChannelArguments& args_in) {
  absl::Status valid = security.tls.Validate();
  if (!valid.ok()) return valid;
  grpc::ChannelArguments args = args_in;
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (security.tls.ClientEnabled()) {
    grpc::SslCredentialsOptions o;
    if (!security.tls.ca_file.empty()) {
      auto ca = ReadSmallFile(security.tls.ca_file);
      if (!ca.ok()) return ca.status();
      o.pem_root_certs = std::move(ca).value();
    }
    if (!security.tls.cert_file.empty()) {
      auto cert = ReadSmallFile(security.tls.cert_file);
      if (!cert.ok()) return cert.status();
      auto key = ReadSmallFile(security.tls.key_file);
      if (!key.ok()) return key.status();
      o.pem_cert_chain = std::move(cert).value();
      o.pem_private_key = std::move(key).value();
    }
    if (!security.tls.server_name.empty()) {
      args.SetSslTargetNameOverride(security.tls.server_name);
    }
    creds = grpc::SslCredentials(o);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  if (security.token.empty()) {
    return grpc::CreateCustomChannel(target, creds, args);
  }
  std::vector<std::unique_ptr<
      grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<BearerInterceptorFactory>(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, creds, args, std::move(interceptors));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& target, const ChannelSecurity& security) {
  return CreateChannel(target, security, grpc::ChannelArguments());
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  if (absl::AsciiStrToLower(host) == "localhost") return true;
  std::string h(host);
  in_addr a4;
  if (inet_pton(AF_INET, h.c_str(), &a4) == 1) {
    return (ntohl(a4.s_addr) >> 24) == 127;
  }
  in6_addr a6;
  if (inet_pton(AF_INET6, h.c_str(), &a6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&a6) ||
           (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
  }
  return false;
}

absl::Status CheckProtectedMode(absl::string_view what, absl::string_view host,
                                bool have_identities, bool insecure) {
  if (have_identities || insecure || IsLoopbackHost(host)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": refusing to listen on '", host,
      "' without identities (protected mode: loopback only). Give "
      "--auth_tokens_file (see docs/security.md), or --insecure to serve "
      "every caller on this address"));
}

absl::Status CheckProtectedListen(absl::string_view what,
                                  const std::string& host_port,
                                  bool have_identities, bool insecure) {
  absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(host_port);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", hp.status().message()));
  }
  return CheckProtectedMode(what, hp->first, have_identities, insecure);
}

}  // namespace hymcache
