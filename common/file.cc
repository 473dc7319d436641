#include "common/file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

namespace arlo {

namespace {
Status io_error(const char* what, const std::filesystem::path& p, int err) {
  return make_error(ErrorCode::kIo, fmt::format("{} {}: {}", what, p.string(), std::strerror(err)));
}

// Closes `fd` and removes `tmp`, then returns the error of `what` (errno as it was when it failed).
Status fail(const char* what, const std::filesystem::path& p, int fd, const std::filesystem::path& tmp) {
  const int err = errno;
  if (fd >= 0) ::close(fd);
  ::unlink(tmp.c_str());
  return io_error(what, p, err);
}
}  // namespace

Status write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  static std::atomic<std::uint64_t> counter{0};
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::kIo, fmt::format("creating {}: {}", dir.string(), ec.message()));
  const std::filesystem::path tmp =
      dir / fmt::format(".{}.tmp.{}.{}", path.filename().string(), ::getpid(), counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("creating", tmp, errno);
  for (std::size_t done = 0; done < contents.size();) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("writing", tmp, fd, tmp);
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("fsync of", tmp, fd, tmp);
  if (::close(fd) != 0) return fail("closing", tmp, -1, tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("renaming a temporary file into", path, -1, tmp);
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);  // the rename itself survives a crash (best effort: some filesystems refuse)
    ::close(dfd);
  }
  return ok();
}

Status drop_partial_last_line(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};  // no file yet
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.empty() || text.back() == '\n') return {};
  const auto newline = text.rfind('\n');
  const std::size_t keep = newline == std::string::npos ? 0 : newline + 1;
  std::error_code ec;
  std::filesystem::resize_file(path, keep, ec);
  if (ec) return make_error(ErrorCode::kIo, "cutting the partial last line of " + path.string() + ": " + ec.message());
  return {};
}

}  // namespace arlo
