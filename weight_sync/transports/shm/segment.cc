// The shm transport's segment (segment.h): creating, opening and unlinking one, and the copy
// helper the receivers use.
#include "weight_sync/transports/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <new>

namespace arlo::weight_sync::shm {

std::string segment_name(const std::string& channel) {
  std::string out = "/arlo-ws-";
  for (char c : channel)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out;
}

void set_text(char* dst, std::size_t cap, const std::string& text) {
  const std::size_t n = std::min(cap - 1, text.size());
  std::memcpy(dst, text.data(), n);
  dst[n] = 0;
}

std::string get_text(const char* src, std::size_t cap) { return std::string(src, strnlen(src, cap)); }

Result<std::unique_ptr<Segment>> Segment::create(const std::string& name, std::uint64_t manifest_cap,
                                                 std::uint64_t slot_cap) {
  // A leftover from a dead publisher is removed; a live one is a configuration error.
  if (auto old = open(name)) {
    const pid_t owner = static_cast<pid_t>((*old)->h->publisher_pid.load());
    if (owner != ::getpid() && process_alive(owner) && !(*old)->h->retired.load())
      return make_error(ErrorCode::kUnavailable, "shm segment " + name + " is in use by publisher pid " +
                                                     std::to_string(owner) + "; pick another weight_sync.shm_name");
    (*old)->unlink_if_same();
  }
  auto s = std::unique_ptr<Segment>(new Segment());
  s->name_ = name;
  s->owner_ = true;
  const std::uint64_t moff = align_up(sizeof(Header), 4096);
  const std::uint64_t s0 = align_up(moff + manifest_cap, 4096);
  const std::uint64_t s1 = align_up(s0 + slot_cap, 4096);
  const std::uint64_t total = align_up(s1 + slot_cap, 4096);
  s->fd_ = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (s->fd_ < 0) return make_error(ErrorCode::kIo, "shm_open " + name + ": " + std::strerror(errno));
  if (::ftruncate(s->fd_, static_cast<off_t>(total)) != 0) {
    ::shm_unlink(name.c_str());
    return make_error(ErrorCode::kResourceExhausted,
                      "ftruncate " + name + " to " + std::to_string(total) + " bytes: " + std::strerror(errno));
  }
  ARLO_TRY(s->map(total));
  Header* h = new (s->base_) Header();
  h->total_size = total;
  h->manifest_offset = moff;
  h->manifest_capacity = manifest_cap;
  h->slot_offset[0] = s0;
  h->slot_offset[1] = s1;
  h->slot_capacity = slot_cap;
  h->publisher_pid = static_cast<std::uint32_t>(::getpid());
  h->slots[0].index = kNoBucket;
  h->slots[1].index = kNoBucket;
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<std::uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
  s->h = h;
  return s;
}

Result<std::unique_ptr<Segment>> Segment::open(const std::string& name) {
  auto s = std::unique_ptr<Segment>(new Segment());
  s->name_ = name;
  s->fd_ = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (s->fd_ < 0) return make_error(ErrorCode::kNotFound, "shm segment " + name + " does not exist (yet)");
  struct stat st {};
  ::fstat(s->fd_, &st);
  if (static_cast<std::uint64_t>(st.st_size) < sizeof(Header))
    return make_error(ErrorCode::kUnavailable, "shm segment " + name + " is being created");
  ARLO_TRY(s->map(static_cast<std::uint64_t>(st.st_size)));
  s->h = reinterpret_cast<Header*>(s->base_);
  if (reinterpret_cast<std::atomic<std::uint64_t>*>(&s->h->magic)->load(std::memory_order_acquire) != kMagic ||
      s->h->total_size != static_cast<std::uint64_t>(st.st_size))
    return make_error(ErrorCode::kUnavailable, "shm segment " + name + " is being created");
  return s;
}

Segment::~Segment() {
  if (owner_ && h) {
    h->retired.store(1);
    futex_bump_and_wake(h->doorbell);
    unlink_if_same();
  }
  if (base_) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void Segment::unlink_if_same() {
  int fd = ::shm_open(name_.c_str(), O_RDONLY | O_CLOEXEC, 0600);
  if (fd < 0) return;
  struct stat a {
  }, b{};
  ::fstat(fd, &a);
  ::fstat(fd_, &b);
  ::close(fd);
  if (a.st_ino == b.st_ino && a.st_dev == b.st_dev) ::shm_unlink(name_.c_str());
}

Status Segment::map(std::uint64_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return make_error(ErrorCode::kIo, "mmap " + name_ + ": " + std::strerror(errno));
  base_ = static_cast<std::byte*>(p);
  size_ = size;
  return ok();
}

void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) {
#if defined(__x86_64__)
  std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  std::size_t k = 0;
  for (; k + 64 <= n; k += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 48), d);
  }
  std::memcpy(dst + k, src + k, n - k);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace arlo::weight_sync::shm
