#pragma once
// A Model seen by weight_sync: a WeightSource (trainer side: publish the live parameters) and a
// WeightSink (worker side: receive straight into a model's parameter buffers). Torch-free.
//
// The sink accepts exactly the model's own tensors (name, F32, shape); anything else is refused
// before a byte moves, so a worker never applies weights of another shape.
// Thread-safety: as Model (the caller serialises); the model must outlive this adapter.
#include <optional>
#include <string>

#include "reference/model.h"
#include "weight_sync/types.h"

namespace arlo::reference {

class ModelWeights final : public weight_sync::WeightSource, public weight_sync::WeightSink {
 public:
  explicit ModelWeights(Model& model);

  const std::vector<weight_sync::TensorSpec>& specs() const override { return specs_; }
  Result<weight_sync::TensorView> view(std::size_t index) const override;
  Result<std::span<std::byte>> buffer_for(const weight_sync::TensorSpec& spec) override;
  Status commit(Version version) override;
  void discard(Version version, const Error& why) override;

  std::optional<Version> committed() const { return committed_; }
  bool discarded() const { return discarded_; }

 private:
  Model& model_;
  std::vector<weight_sync::TensorSpec> specs_;
  std::optional<Version> committed_;
  bool discarded_ = false;
};

// weight_sync::weights_checksum of the model, as 16 hex digits: what GET /weights reports and what
// the trainer writes next to each version, so both ends can compare.
Result<std::string> weights_checksum_hex(Model& model);

}  // namespace arlo::reference
