#include "testing/fault_injection.h"

#include <csignal>
#include <mutex>
#include <optional>

namespace arlo::weight_sync::faults {
namespace {

class CorruptBucket final : public BucketTap {
 public:
  explicit CorruptBucket(std::size_t bucket) : bucket_(bucket) {}

  void sealed(Version version, std::size_t bucket, std::span<std::byte> bytes, std::uint64_t* checksum) override {
    if (bucket != bucket_ || (bytes.empty() && checksum == nullptr)) return;
    std::lock_guard lock(mu_);  // tcp shows each link's copy from that link's thread
    if (corrupted_ == version) return;
    corrupted_ = version;
    if (!bytes.empty()) {
      bytes[bytes.size() / 2] ^= std::byte{0x5A};
    } else {
      *checksum ^= 0x5A;
    }
  }

 private:
  const std::size_t bucket_;
  std::mutex mu_;
  std::optional<Version> corrupted_;  // the last version whose bucket was flipped
};

class StopBeforeBucket final : public BucketTap {
 public:
  explicit StopBeforeBucket(std::size_t bucket) : bucket_(bucket) {}
  void before(Version /*version*/, std::size_t bucket) override {
    if (bucket == bucket_) ::raise(SIGSTOP);
  }

 private:
  const std::size_t bucket_;
};

}  // namespace

std::shared_ptr<BucketTap> corrupt_bucket(std::size_t bucket) { return std::make_shared<CorruptBucket>(bucket); }

std::shared_ptr<BucketTap> stop_before_bucket(std::size_t bucket) { return std::make_shared<StopBeforeBucket>(bucket); }

}  // namespace arlo::weight_sync::faults
