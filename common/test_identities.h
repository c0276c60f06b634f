// An Authenticator over identities given as text, for tests: the text is
// written to a fresh identities file under TEST_TMPDIR and read back
// through Authenticator::Create, the path a daemon takes. Test-only.
#pragma once

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/security.h"

namespace hymcache {

// Writes `text` (the identities-file format) to a new file and returns
// Authenticator::Create of it; the file's path in `*path` if not null (its
// errors name it, with the line).
inline absl::StatusOr<std::unique_ptr<Authenticator>> IdentitiesFromText(
    absl::string_view text, std::string* path = nullptr) {
  static std::atomic<int> counter{0};
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string file = absl::StrCat(dir ? dir : "/tmp", "/identities-",
                                        counter.fetch_add(1), ".txt");
  {
    std::ofstream out(file, std::ios::trunc);
    out << text;
  }
  if (path != nullptr) *path = file;
  return Authenticator::Create(file);
}

}  // namespace hymcache
