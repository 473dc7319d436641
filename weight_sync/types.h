#pragma once
// Framework-independent description of weights: what a trainer publishes and a worker receives.
//
// A TensorView is a borrowed byte range plus the device it lives on. Only cpu views are moved by the
// CPU transports in this module; a cuda:N view is accepted by the API so that a GPU transport
// (cuda_ipc, nccl) can be added behind the same Publisher/Subscriber without changing callers.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/safetensors.h"
#include "common/vocabulary.h"

namespace arlo::weight_sync {

using DType = safetensors::DType;
using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Convenience: now + d.
inline Deadline deadline_in(std::chrono::milliseconds d) { return Clock::now() + d; }

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // CUDA ordinal; 0 for cpu

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {Kind::kCuda, index}; }
  bool is_cpu() const { return kind == Kind::kCpu; }
  std::string str() const;  // "cpu" | "cuda:N"
  static Result<Device> parse(std::string_view text);
  friend bool operator==(const Device&, const Device&) = default;
};

// One tensor as named by Hugging Face ("model.layers.0.self_attn.q_proj.weight").
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;

  std::uint64_t numel() const;   // product of shape; 1 for a scalar (empty shape)
  std::uint64_t nbytes() const;  // numel * dtype size
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

// Borrowed bytes of one tensor. `bytes.size() == spec.nbytes()`; valid for as long as the source
// says (for a WeightSource: until the publish() call that asked for it returns).
struct TensorView {
  const TensorSpec* spec = nullptr;
  std::span<const std::byte> bytes;
  Device device;
};

// Trainer side: the weights of one version. Re-iterable: a publisher may ask for the same tensor
// more than once (resume after a receiver reconnects, full resync), and the bytes must not change
// while publish() runs. Thread-safety: view() may be called from the publisher's encoder thread.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Tensors in a fixed order (the order defines the bucket layout).
  virtual const std::vector<TensorSpec>& specs() const = 0;
  // Bytes of tensor `index` (into specs()).
  virtual Result<TensorView> view(std::size_t index) const = 0;

  // Visits every tensor in order; stops at the first error.
  Status for_each(const std::function<Status(const TensorView&)>& visit) const;
};

// Worker side: owns the destination buffers (the live parameters, or anything the worker wants).
// The subscriber asks buffer_for() for every manifest tensor before any data moves, so a sink that
// does not know a tensor, or whose buffer has another size, refuses the version up front.
// Thread-safety: called from the thread that runs Subscriber::receive only.
class WeightSink {
 public:
  virtual ~WeightSink() = default;
  // Destination for `spec`: exactly spec.nbytes() bytes, stable until commit()/discard().
  // Return an error (kNotFound / kMismatch) for a tensor this sink does not hold.
  virtual Result<std::span<std::byte>> buffer_for(const TensorSpec& spec) = 0;
  // Every byte of `version` is in place and verified.
  virtual Status commit(Version version) = 0;
  // In-place mode only: a transfer failed after some destination bytes were overwritten; the
  // buffers hold a mix of versions and must not be served until the next successful receive.
  virtual void discard(Version /*version*/, const Error& /*why*/) {}
  // Where buffer_for() memory lives. CPU transports require cpu.
  virtual Device device() const { return Device::cpu(); }
};

// Plain owned weights in host memory: a WeightSource and a WeightSink at once. Used by tests, the
// benchmark, and any caller that keeps weights as flat byte arrays. Not thread-safe for writes.
class HostWeights final : public WeightSource, public WeightSink {
 public:
  explicit HostWeights(std::vector<TensorSpec> specs);  // zero-filled
  HostWeights(HostWeights&&) noexcept;
  HostWeights& operator=(HostWeights&&) noexcept;
  ~HostWeights() override;

  const std::vector<TensorSpec>& specs() const override { return specs_; }
  Result<TensorView> view(std::size_t index) const override;
  Result<std::span<std::byte>> buffer_for(const TensorSpec& spec) override;
  Status commit(Version version) override;
  void discard(Version version, const Error& why) override;

  std::span<std::byte> bytes(std::size_t index);
  std::span<const std::byte> bytes(std::size_t index) const;
  Result<std::size_t> index_of(std::string_view name) const;
  std::uint64_t total_bytes() const { return total_; }
  // Last committed version (nullopt before the first commit or after a discard).
  std::optional<Version> committed() const { return committed_; }

 private:
  std::vector<TensorSpec> specs_;
  std::vector<std::uint64_t> offsets_;
  std::byte* data_ = nullptr;  // one anonymous mapping, so untouched pages cost no RSS
  std::uint64_t total_ = 0;
  std::uint64_t mapped_ = 0;
  std::optional<Version> committed_;
};

// xxh3-64 over every tensor's bytes in spec order (names and shapes included), so two sides can
// compare what they hold. Reads every byte once.
Result<std::uint64_t> weights_checksum(const WeightSource& source);

}  // namespace arlo::weight_sync
