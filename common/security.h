// Identities, roles and TLS for HyMCache's gRPC services (docs/security.md).
//
// Callers prove who they are with a bearer token (gRPC metadata
// "authorization: Bearer <token>") or, over mutual TLS, with a client
// certificate. An identities file maps each credential to an Identity
// (role, tenant, name); tokens are stored only as their SHA-256:
//
//   # role  tenant  name     credential
//   engine  acme    vllm-0   sha256:<64 hex digits of SHA-256(token)>
//   admin   -       alice    sha256:<...>
//   node    -       node-a   cert:node-a.example  nodes=node-a
//
// A node identity's optional fifth field `nodes=NAME[,NAME...]` names the
// storage-node names it may register, heartbeat and reconcile as
// (CheckNodeName); without it the identity may act as any node (the
// behaviour before names were bound; Warnings() says so).
// `cert:NAME` admits a client certificate, verified against the server's
// --tls_ca, whose subject CN or one of its subject alternative names is NAME.
// A path that is a directory reads every regular file in it not starting
// with '.' (a mounted Kubernetes secret), in name order. `hymctl token new`
// generates a token and its line.
//
// Without an identities file authentication is off: every caller is an
// admin of tenant "default" (the local quickstart); the daemons then listen
// on loopback only unless told --insecure (CheckProtectedMode).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class Channel;
class ChannelArguments;
class ServerContextBase;
class ServerCredentials;
}  // namespace grpc

namespace hymcache {

enum class Role : uint8_t {
  kEngine = 1,  // lookup, load, store
  kAdmin = 2,   // hymctl: status, stats, remove, listings, node control
  kNode = 4,    // storage nodes: register, heartbeat, reconcile
};
// "engine", "admin", "node".
const char* RoleName(Role role);
// InvalidArgument for anything else.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// A set of roles allowed to call a method.
class Roles {
 public:
  constexpr Roles() = default;
  constexpr Roles(Role r) : bits_(static_cast<uint8_t>(r)) {}  // NOLINT
  constexpr Roles operator|(Roles o) const { return Roles(bits_ | o.bits_); }
  constexpr bool Contains(Role r) const {
    return (bits_ & static_cast<uint8_t>(r)) != 0;
  }
  // "engine|admin".
  std::string ToString() const;

 private:
  constexpr explicit Roles(int bits) : bits_(static_cast<uint8_t>(bits)) {}
  uint8_t bits_ = 0;
};

// Who is calling.
struct Identity {
  Role role = Role::kAdmin;
  // The tenant whose keys the caller sees. "-" in the file means
  // kDefaultTenant.
  std::string tenant;
  // For logs and error messages.
  std::string name;
  // Role kNode: the node names this identity may act as (`nodes=` in the
  // file). Empty: any name (an unbound node identity).
  std::vector<std::string> node_names;
};

// OK if `id` may act as the storage node `node_name`: any identity that is
// not of role node (authentication off: the anonymous admin), a node
// identity without bound names, or one whose names include `node_name`.
// PermissionDenied naming `method`, the identity and the node otherwise.
absl::Status CheckNodeName(const Identity& id, absl::string_view node_name,
                           absl::string_view method);
inline constexpr absl::string_view kDefaultTenant = "default";

// SHA-256 of `token`, lowercase hex (64 characters).
std::string TokenHash(absl::string_view token);
// A fresh random token: "hym_" followed by 64 hex digits (256 bits from
// OpenSSL's RAND_bytes). Internal if the random source fails.
absl::StatusOr<std::string> NewToken();
// The identities-file line for a token: "role tenant name sha256:HASH",
// followed by " nodes=A,B" when `node_names` is not empty (role node).
std::string IdentityLine(Role role, absl::string_view tenant,
                         absl::string_view name, absl::string_view token,
                         const std::vector<std::string>& node_names = {});
// The token in `path` (surrounding whitespace removed). NotFound /
// PermissionDenied from the file system; InvalidArgument if empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Checks each call's credentials against an identities file. Reload()
// replaces the table atomically (SIGHUP); a file that does not parse keeps
// the old table.
//
// Thread safety: safe for concurrent use without external synchronization.
class Authenticator {
 public:
  // Reads `path` (a file or a directory, see above). InvalidArgument names
  // the file and line of the first bad entry; NotFound if missing.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(
      const std::string& path);

  // Re-reads the path given to Create. On error the old table stays.
  absl::Status Reload();
  // Number of entries loaded.
  size_t size() const;
  // What the loaded table allows that an operator should know about, one
  // message per entry ("FILE:LINE: node identity 'x' is not bound to node
  // names ..."). The daemons log them at start and after each reload.
  std::vector<std::string> Warnings() const;

  // The caller of `ctx`, if it is allowed to call `method`:
  //   Unauthenticated: no credential, or one not in the table;
  //   PermissionDenied: a known identity whose role is not in `allowed`.
  // A bearer token wins over a client certificate when both are present.
  absl::StatusOr<Identity> Check(const grpc::ServerContextBase& ctx,
                                 Roles allowed,
                                 absl::string_view method) const;

  // The same from the raw pieces, for tests without gRPC: `bearer` is the
  // authorization metadata value ("" if none), `cert_names` the verified
  // peer certificate's CN and SANs.
  absl::StatusOr<Identity> CheckCredentials(
      absl::string_view authorization,
      const std::vector<std::string>& cert_names, Roles allowed,
      absl::string_view method) const;

 private:
  struct Table {
    absl::flat_hash_map<std::string, Identity> by_token_hash;
    absl::flat_hash_map<std::string, Identity> by_cert_name;
    std::vector<std::string> warnings;
    size_t size() const { return by_token_hash.size() + by_cert_name.size(); }
  };
  static absl::Status ParseInto(absl::string_view text,
                                absl::string_view source, Table* table);
  static absl::StatusOr<Table> Load(const std::string& path);
  explicit Authenticator(std::string path) : path_(std::move(path)) {}

  // Constant after Create.
  const std::string path_;

  // Replaced whole by Reload (std::atomic_load / atomic_store: every call
  // reads it, and a mutex here cost more than the check itself).
  std::shared_ptr<const Table> table_;
};

// The caller when authentication is off: an admin of the default tenant.
Identity AnonymousAdmin();

// TLS material from PEM files. Servers: cert_file + key_file present their
// certificate; ca_file verifies client certificates (required with
// require_client_cert, else requested and verified when offered). Clients:
// ca_file verifies the server; cert_file + key_file are the client
// certificate for mutual TLS.
struct TlsOptions {
  // PEM certificate chain. Default: "" (no TLS on a server).
  std::string cert_file;
  // PEM private key of cert_file. Default: "".
  std::string key_file;
  // PEM CA certificates. A client with only ca_file set uses TLS without a
  // certificate of its own. Default: "".
  std::string ca_file;
  // Server: refuse connections without a client certificate signed by
  // ca_file. Default: false.
  bool require_client_cert = false;
  // Client: the name the server's certificate must carry instead of the
  // host in the target address. Default: "".
  std::string server_name;

  // Server side uses TLS.
  bool ServerEnabled() const { return !cert_file.empty(); }
  // Client side uses TLS.
  bool ClientEnabled() const { return !ca_file.empty() || !cert_file.empty(); }
  // InvalidArgument: cert without key (or the reverse), require_client_cert
  // without ca_file.
  absl::Status Validate() const;
};

// Server credentials: insecure when !tls.ServerEnabled(). Errors: the files'
// read errors. The files are read once; ReloadableServerTls re-reads them.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls);

// A gRPC server's credentials whose certificate, key and CA files are
// re-read by Reload() (SIGHUP). gRPC asks for the current material at each
// new TLS handshake (its SSL certificate-config fetcher), so connections
// made after a successful Reload use the new files; open connections keep
// what they were made with.
//
// Thread safety: safe for concurrent use without external synchronization.
// A server built with credentials() may outlive it: from its destruction on,
// that server's handshakes use the material gRPC last fetched, which no
// longer reloads (gRPC's fetcher may be called until the process exits, so
// the little it reaches is kept until then; this object's copy of the key
// is dropped).
class ReloadableServerTls {
 public:
  // Reads and checks the files (as Reload). Insecure credentials, and a
  // Reload that does nothing, when !tls.ServerEnabled(). Errors:
  // InvalidArgument (options, or files that do not parse), NotFound /
  // PermissionDenied (files).
  static absl::StatusOr<std::unique_ptr<ReloadableServerTls>> Create(
      const TlsOptions& tls);
  ~ReloadableServerTls();

  // For ServerBuilder::AddListeningPort; every port added with them follows
  // Reload.
  std::shared_ptr<grpc::ServerCredentials> credentials() const {
    return credentials_;
  }

  // Re-reads cert_file, key_file and ca_file. A file that cannot be read,
  // does not parse as PEM, or a key that does not match the certificate
  // leaves the material in force unchanged (InvalidArgument / NotFound /
  // PermissionDenied naming the file). OkStatus without TLS.
  absl::Status Reload();
  // Successful Reload calls that changed something, since Create.
  uint64_t reloads() const;

  // What each listening port hands gRPC (internal).
  struct State;

 private:
  ReloadableServerTls() = default;

  // Constant after Create.
  std::shared_ptr<State> state_;  // null without TLS
  std::shared_ptr<grpc::ServerCredentials> credentials_;
};

// What a gRPC client presents.
struct ChannelSecurity {
  TlsOptions tls;
  // Bearer token sent with every call; "" sends none. Default: "".
  std::string token;
};

// A channel to `target` with `security` (TLS when tls.ClientEnabled(); the
// token in every call's metadata). Errors: the files' read errors.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& target, const ChannelSecurity& security,
    const grpc::ChannelArguments& args);
// The same with default channel arguments.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& target, const ChannelSecurity& security);

// Whether `host` (no port) is a loopback address or "localhost".
bool IsLoopbackHost(absl::string_view host);

// Protected mode: without identities a daemon listens on loopback only.
// InvalidArgument when `host` is not loopback, `have_identities` is false
// and `insecure` is false; `what` names the daemon and flag in the message.
absl::Status CheckProtectedMode(absl::string_view what, absl::string_view host,
                                bool have_identities, bool insecure);
// The same for a "host:port" (e.g. --metrics_listen): InvalidArgument, naming
// `what`, also when it does not parse.
absl::Status CheckProtectedListen(absl::string_view what,
                                  const std::string& host_port,
                                  bool have_identities, bool insecure);

}  // namespace hymcache
