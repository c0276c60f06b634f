#include "common/security.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/test_identities.h"

namespace hymcache {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name + "." +
         std::to_string(getpid());
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

TEST_CASE("TokenHash is SHA-256 in lowercase hex") {
  // echo -n abc | sha256sum
  CHECK(TokenHash("abc") ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("NewToken is random and its line parses back to the identity") {
  auto a = NewToken();
  auto b = NewToken();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a != *b);
  CHECK(a->size() == 4 + 64);
  const std::string line = IdentityLine(Role::kEngine, "acme", "vllm-0", *a);
  auto auth = IdentitiesFromText(line + "\n");
  REQUIRE(auth.ok());
  auto id = (*auth)->CheckCredentials("Bearer " + *a, {}, Role::kEngine,
                                      "PutStart");
  REQUIRE(id.ok());
  CHECK(id->role == Role::kEngine);
  CHECK(id->tenant == "acme");
  CHECK(id->name == "vllm-0");
}

TEST_CASE("CheckCredentials: unauthenticated, wrong role, certificates") {
  const std::string text =
      "# comment\n"
      "engine acme e1 sha256:" + TokenHash("tok-engine") + "\n" +
      "admin - a1 sha256:" + TokenHash("tok-admin") + "  # trailing\n" +
      "node - n1 cert:node-1.example\n";
  auto auth = IdentitiesFromText(text);
  REQUIRE(auth.ok());
  CHECK((*auth)->size() == 3);
  auto none = (*auth)->CheckCredentials("", {}, Role::kEngine, "PutStart");
  CHECK(absl::IsUnauthenticated(none.status()));
  CHECK(absl::StrContains(none.status().message(), "PutStart"));
  CHECK(absl::IsUnauthenticated(
      (*auth)->CheckCredentials("Bearer nope", {}, Role::kEngine, "M")
          .status()));
  CHECK(absl::IsUnauthenticated(
      (*auth)->CheckCredentials("tok-engine", {}, Role::kEngine, "M")
          .status()));
  auto wrong = (*auth)->CheckCredentials("Bearer tok-engine", {},
                                         Role::kAdmin, "ListNodes");
  CHECK(absl::IsPermissionDenied(wrong.status()));
  CHECK(absl::StrContains(wrong.status().message(), "role engine"));
  auto admin = (*auth)->CheckCredentials("Bearer tok-admin", {},
                                         Roles(Role::kAdmin) | Role::kEngine,
                                         "M");
  REQUIRE(admin.ok());
  CHECK(admin->tenant == kDefaultTenant);
  auto cert = (*auth)->CheckCredentials("", {"other", "node-1.example"},
                                        Role::kNode, "Heartbeat");
  REQUIRE(cert.ok());
  CHECK(cert->name == "n1");
  CHECK(absl::IsUnauthenticated(
      (*auth)->CheckCredentials("", {"stranger"}, Role::kNode, "M").status()));
}

TEST_CASE("Bad identities lines are refused with file and line") {
  for (const char* bad :
       {"engine acme e1\n", "root - x sha256:00\n",
        "engine - x sha256:ABCDEF\n", "engine - x plain-token\n",
        "engine - x cert:\n"}) {
    std::string path;
    auto a = IdentitiesFromText(std::string("\n") + bad, &path);
    CHECK(absl::IsInvalidArgument(a.status()));
    CHECK(absl::StrContains(a.status().message(), path + ":2"));
  }
  const std::string h = TokenHash("t");
  CHECK(absl::IsInvalidArgument(IdentitiesFromText("engine - a sha256:" + h +
                                                   "\nadmin - b sha256:" + h +
                                                   "\n")
                                    .status()));
}

TEST_CASE("nodes= binds a node identity to node names") {
  const std::string text =
      "node - bound sha256:" + TokenHash("tok-bound") +
      " nodes=node-a,node-b\n" + "node - free sha256:" + TokenHash("tok-free") +
      "\n" + "node - by-cert cert:node-c.example nodes=node-c\n" +
      "admin - a sha256:" + TokenHash("tok-admin") + "\n";
  std::string path;
  auto auth = IdentitiesFromText(text, &path);
  REQUIRE(auth.ok());
  auto bound = (*auth)->CheckCredentials("Bearer tok-bound", {}, Role::kNode,
                                         "RegisterNode");
  REQUIRE(bound.ok());
  CHECK(bound->node_names == std::vector<std::string>{"node-a", "node-b"});
  CHECK(CheckNodeName(*bound, "node-a", "RegisterNode").ok());
  CHECK(CheckNodeName(*bound, "node-b", "Heartbeat").ok());
  absl::Status s = CheckNodeName(*bound, "node-x", "Heartbeat");
  CHECK(absl::IsPermissionDenied(s));
  CHECK(s.message() ==
        "Heartbeat: identity 'bound' may act as nodes 'node-a', 'node-b' "
        "only, not as node 'node-x' (nodes= in the identities file)");
  CHECK(absl::IsPermissionDenied(CheckNodeName(*bound, "node-a2", "M")));
  CHECK(absl::IsPermissionDenied(CheckNodeName(*bound, "", "M")));
  auto cert =
      (*auth)->CheckCredentials("", {"node-c.example"}, Role::kNode, "M");
  REQUIRE(cert.ok());
  CHECK(CheckNodeName(*cert, "node-c", "M").ok());
  CHECK(absl::StrContains(CheckNodeName(*cert, "node-a", "M").message(),
                          "may act as node 'node-c' only"));
  // Unbound: any name, and a warning naming the line.
  auto free =
      (*auth)->CheckCredentials("Bearer tok-free", {}, Role::kNode, "M");
  REQUIRE(free.ok());
  CHECK(free->node_names.empty());
  CHECK(CheckNodeName(*free, "anything", "M").ok());
  const std::vector<std::string> warnings = (*auth)->Warnings();
  REQUIRE(warnings.size() == 1);
  CHECK(absl::StartsWith(warnings[0], path + ":2: node identity 'free' is "
                                             "not bound to node names"));
  // Other roles never act as nodes through the master's node methods; the
  // check itself does not concern them.
  auto admin =
      (*auth)->CheckCredentials("Bearer tok-admin", {}, Role::kAdmin, "M");
  REQUIRE(admin.ok());
  CHECK(CheckNodeName(*admin, "node-a", "M").ok());
  // The identities line hymctl prints parses back to the binding.
  const std::string line =
      IdentityLine(Role::kNode, "", "n", "tok-n", {"host1-dram0"});
  CHECK(absl::EndsWith(line, " nodes=host1-dram0"));
  auto again = IdentitiesFromText(line);
  REQUIRE(again.ok());
  CHECK((*again)->Warnings().empty());
  auto n = (*again)->CheckCredentials("Bearer tok-n", {}, Role::kNode, "M");
  REQUIRE(n.ok());
  CHECK(n->node_names == std::vector<std::string>{"host1-dram0"});
  // Bad bindings are refused with file and line.
  const std::string h = TokenHash("t");
  for (const std::string& bad :
       {"node - n sha256:" + h + " nodes=\n",
        "node - n sha256:" + h + " nodes=a,,b\n",
        "node - n sha256:" + h + " names=a\n",
        "engine - n sha256:" + h + " nodes=a\n",
        "node - n sha256:" + h + " nodes=" + std::string(129, 'x') + "\n",
        "node - n sha256:" + h + " nodes=a extra\n"}) {
    std::string path;
    auto a = IdentitiesFromText("\n" + bad, &path);
    CHECK(absl::IsInvalidArgument(a.status()));
    CHECK(absl::StrContains(a.status().message(), path + ":2"));
  }
}

TEST_CASE("Reload replaces the table; a bad file keeps the old one") {
  const std::string path = TempPath("identities");
  Write(path, "engine - e sha256:" + TokenHash("old") + "\n");
  auto auth = Authenticator::Create(path);
  REQUIRE(auth.ok());
  CHECK((*auth)->CheckCredentials("Bearer old", {}, Role::kEngine, "M").ok());
  Write(path, "engine - e sha256:" + TokenHash("new") + "\n");
  REQUIRE((*auth)->Reload().ok());
  CHECK(absl::IsUnauthenticated(
      (*auth)->CheckCredentials("Bearer old", {}, Role::kEngine, "M")
          .status()));
  CHECK((*auth)->CheckCredentials("Bearer new", {}, Role::kEngine, "M").ok());
  Write(path, "garbage\n");
  CHECK(absl::IsInvalidArgument((*auth)->Reload()));
  CHECK((*auth)->CheckCredentials("Bearer new", {}, Role::kEngine, "M").ok());
  std::filesystem::remove(path);
  CHECK(absl::IsNotFound(Authenticator::Create(path).status()));
}

TEST_CASE("A directory of identities files (a mounted secret)") {
  const std::string dir = TempPath("identities.d");
  std::filesystem::create_directories(dir);
  Write(dir + "/engines", "engine a e sha256:" + TokenHash("e") + "\n");
  Write(dir + "/admins", "admin - a sha256:" + TokenHash("a") + "\n");
  Write(dir + "/.hidden", "garbage\n");
  auto auth = Authenticator::Create(dir);
  REQUIRE(auth.ok());
  CHECK((*auth)->size() == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("ReadTokenFile trims whitespace and refuses empty files") {
  const std::string path = TempPath("token");
  Write(path, "  hym_abc\n");
  auto t = ReadTokenFile(path);
  REQUIRE(t.ok());
  CHECK(*t == "hym_abc");
  Write(path, "\n");
  CHECK(absl::IsInvalidArgument(ReadTokenFile(path).status()));
  Write(path, "two words\n");
  CHECK(absl::IsInvalidArgument(ReadTokenFile(path).status()));
  std::filesystem::remove(path);
  CHECK(absl::IsNotFound(ReadTokenFile(path).status()));
}

TEST_CASE("Protected mode: loopback only without identities") {
  CHECK(IsLoopbackHost("127.0.0.1"));
  CHECK(IsLoopbackHost("127.1.2.3"));
  CHECK(IsLoopbackHost("::1"));
  CHECK(IsLoopbackHost("[::1]"));
  CHECK(IsLoopbackHost("localhost"));
  CHECK_FALSE(IsLoopbackHost("0.0.0.0"));
  CHECK_FALSE(IsLoopbackHost("::"));
  CHECK_FALSE(IsLoopbackHost("10.0.0.5"));
  CHECK_FALSE(IsLoopbackHost("example.com"));
  CHECK(CheckProtectedMode("master", "127.0.0.1", false, false).ok());
  auto s = CheckProtectedMode("master", "0.0.0.0", false, false);
  CHECK(absl::IsInvalidArgument(s));
  CHECK(absl::StrContains(s.message(), "--insecure"));
  CHECK(CheckProtectedMode("master", "0.0.0.0", true, false).ok());
  CHECK(CheckProtectedMode("master", "0.0.0.0", false, true).ok());
  // host:port form (--metrics_listen).
  CHECK(CheckProtectedListen("m", "127.0.0.1:9451", false, false).ok());
  CHECK(CheckProtectedListen("m", "[::1]:0", false, false).ok());
  CHECK(absl::IsInvalidArgument(
      CheckProtectedListen("m", "0.0.0.0:9451", false, false)));
  CHECK(CheckProtectedListen("m", "0.0.0.0:9451", true, false).ok());
  s = CheckProtectedListen("m", "9451", false, false);
  CHECK(absl::IsInvalidArgument(s));
  CHECK(absl::StartsWith(s.message(), "m: "));
}

TEST_CASE("TlsOptions::Validate") {
  TlsOptions t;
  CHECK(t.Validate().ok());
  t.cert_file = "c.pem";
  CHECK(absl::IsInvalidArgument(t.Validate()));
  t.key_file = "k.pem";
  CHECK(t.Validate().ok());
  t.require_client_cert = true;
  CHECK(absl::IsInvalidArgument(t.Validate()));
  t.ca_file = "ca.pem";
  CHECK(t.Validate().ok());
}

}  // namespace
}  // namespace hymcache
