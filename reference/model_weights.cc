#include "reference/model_weights.h"

#include <fmt/format.h>

namespace arlo::reference {

ModelWeights::ModelWeights(Model& model) : model_(model) {
  for (const auto& p : model_.params()) specs_.push_back({p.name, weight_sync::DType::F32, p.shape});
}

Result<weight_sync::TensorView> ModelWeights::view(std::size_t index) const {
  if (index >= specs_.size())
    return make_error(ErrorCode::kNotFound, fmt::format("model weights: no tensor #{}", index));
  return weight_sync::TensorView{&specs_[index], model_.bytes(specs_[index].name), weight_sync::Device::cpu()};
}

Result<std::span<std::byte>> ModelWeights::buffer_for(const weight_sync::TensorSpec& spec) {
  for (const auto& own : specs_) {
    if (own.name != spec.name) continue;
    if (!(own == spec))
      return make_error(ErrorCode::kMismatch,
                        fmt::format("model weights: {} is {} [{}] here, the sender has {} [{}]", spec.name,
                                    safetensors::dtype_name(own.dtype), fmt::join(own.shape, ", "),
                                    safetensors::dtype_name(spec.dtype), fmt::join(spec.shape, ", ")));
    return model_.mutable_bytes(spec.name);
  }
  return make_error(ErrorCode::kNotFound, fmt::format("model weights: this model has no tensor {}", spec.name));
}

Status ModelWeights::commit(Version version) {
  committed_ = version;
  discarded_ = false;
  return ok();
}

void ModelWeights::discard(Version, const Error&) {
  committed_.reset();
  discarded_ = true;
}

Result<std::string> weights_checksum_hex(Model& model) {
  ModelWeights w(model);
  ARLO_ASSIGN_OR_RETURN(auto h, weight_sync::weights_checksum(w));
  return fmt::format("{:016x}", h);
}

}  // namespace arlo::reference
