#include "weight_sync/types.h"

#include <sys/mman.h>

#include <charconv>
#include <cstring>
#include <utility>

#include "weight_sync/xxh.h"

namespace arlo::weight_sync {

std::string Device::str() const { return kind == Kind::kCpu ? std::string("cpu") : "cuda:" + std::to_string(index); }

Result<Device> Device::parse(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text.starts_with("cuda")) {
    if (text == "cuda") return Device::cuda(0);
    if (text.size() > 5 && text[4] == ':') {
      int index = 0;
      auto [p, ec] = std::from_chars(text.data() + 5, text.data() + text.size(), index);
      if (ec == std::errc() && p == text.data() + text.size() && index >= 0) return Device::cuda(index);
    }
  }
  return make_error(ErrorCode::kInvalidArgument, "device '" + std::string(text) + "': expected cpu or cuda:N");
}

std::uint64_t TensorSpec::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d < 0 ? 0 : d);
  return n;
}

std::uint64_t TensorSpec::nbytes() const { return numel() * safetensors::dtype_size(dtype); }

Status WeightSource::for_each(const std::function<Status(const TensorView&)>& visit) const {
  for (std::size_t i = 0; i < specs().size(); ++i) {
    ARLO_ASSIGN_OR_RETURN(auto v, view(i));
    ARLO_TRY(visit(v));
  }
  return ok();
}

HostWeights::HostWeights(std::vector<TensorSpec> specs) : specs_(std::move(specs)) {
  offsets_.reserve(specs_.size());
  for (const auto& s : specs_) {
    offsets_.push_back(total_);
    total_ += (s.nbytes() + 63) / 64 * 64;  // 64-byte aligned tensors
  }
  mapped_ = total_ == 0 ? 4096 : total_;
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();  // out of memory at construction: nothing to recover
  data_ = static_cast<std::byte*>(p);
}

HostWeights::HostWeights(HostWeights&& o) noexcept
    : specs_(std::move(o.specs_)),
      offsets_(std::move(o.offsets_)),
      data_(std::exchange(o.data_, nullptr)),
      total_(std::exchange(o.total_, 0)),
      mapped_(std::exchange(o.mapped_, 0)),
      committed_(o.committed_) {}

HostWeights& HostWeights::operator=(HostWeights&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, mapped_);
    specs_ = std::move(o.specs_);
    offsets_ = std::move(o.offsets_);
    data_ = std::exchange(o.data_, nullptr);
    total_ = std::exchange(o.total_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    committed_ = o.committed_;
  }
  return *this;
}

HostWeights::~HostWeights() {
  if (data_) ::munmap(data_, mapped_);
}

std::span<std::byte> HostWeights::bytes(std::size_t index) { return {data_ + offsets_[index], specs_[index].nbytes()}; }
std::span<const std::byte> HostWeights::bytes(std::size_t index) const {
  return {data_ + offsets_[index], specs_[index].nbytes()};
}

Result<TensorView> HostWeights::view(std::size_t index) const {
  if (index >= specs_.size())
    return make_error(ErrorCode::kNotFound, "tensor index " + std::to_string(index) + " out of range");
  return TensorView{&specs_[index], bytes(index), Device::cpu()};
}

Result<std::size_t> HostWeights::index_of(std::string_view name) const {
  for (std::size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return i;
  return make_error(ErrorCode::kNotFound, "tensor '" + std::string(name) + "' is not held");
}

Result<std::span<std::byte>> HostWeights::buffer_for(const TensorSpec& spec) {
  ARLO_ASSIGN_OR_RETURN(auto i, index_of(spec.name));
  if (!(specs_[i] == spec))
    return make_error(ErrorCode::kMismatch, "tensor '" + spec.name + "': held with another dtype or shape");
  return bytes(i);
}

Status HostWeights::commit(Version version) {
  committed_ = version;
  return ok();
}

void HostWeights::discard(Version, const Error&) { committed_.reset(); }

Result<std::uint64_t> weights_checksum(const WeightSource& source) {
  XXH3_state_t* st = XXH3_createState();
  if (!st) return make_error(ErrorCode::kResourceExhausted, "xxh3 state allocation failed");
  XXH3_64bits_reset(st);
  Status s = source.for_each([&](const TensorView& v) -> Status {
    if (!v.device.is_cpu())
      return make_error(ErrorCode::kInvalidArgument, "weights_checksum: tensor '" + v.spec->name + "' is on " +
                                                         v.device.str() + "; only cpu is supported");
    XXH3_64bits_update(st, v.spec->name.data(), v.spec->name.size());
    for (auto d : v.spec->shape) XXH3_64bits_update(st, &d, sizeof d);
    XXH3_64bits_update(st, v.bytes.data(), v.bytes.size());
    return ok();
  });
  std::uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (!s) return std::unexpected(s.error());
  return h;
}

}  // namespace arlo::weight_sync
