#pragma once
// The torch side of Model: parameters as tensors and the forward passes. Included only by
// reference/*.cc, the reference apps and their tests (it pulls in ATen).
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "reference/model.h"

namespace arlo::reference {

// Key/value cache for continuous batching: a fixed pool of `slots` sequences, each up to
// `context` tokens. Per layer, k and v are [slots, context, heads, head_dim].
struct KvCache {
  std::vector<at::Tensor> k;
  std::vector<at::Tensor> v;
  int slots = 0;
  int context = 0;
};

class ModelImpl {
 public:
  ModelImpl(const ModelConfig& config, std::vector<ParamInfo> infos, std::vector<at::Tensor> tensors);

  const ModelConfig& config() const { return config_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  // Parameters in the fixed order of model.h; contiguous float32 CPU tensors.
  const std::vector<at::Tensor>& parameters() const { return tensors_; }
  const at::Tensor& param(const std::string& name) const;
  int index_of(std::string_view name) const;  // -1 when unknown
  void set_requires_grad(bool on);

  // Full forward over packed rows. input_ids, position_ids: [B, T] int64. A new sequence starts
  // wherever position_ids is 0; tokens attend causally within their own sequence only.
  // Returns logits [B, T, vocab].
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& position_ids) const;

  KvCache make_cache(int slots) const;
  // Prompt pass for B sequences, right-padded to P: ids [B, P] int64, lens [B] (true lengths,
  // >= 1), slots [B]. Fills each slot's cache at positions [0, P) (positions >= len hold junk that
  // decoding overwrites before reading) and returns the logits after each prompt's last token [B, vocab].
  at::Tensor prefill(KvCache& cache, const at::Tensor& ids, const at::Tensor& lens, const at::Tensor& slots) const;
  // One decoding step: token ids [B] at positions pos [B] for sequences in slots [B]. Writes their
  // keys/values at pos and returns next-token logits [B, vocab].
  at::Tensor decode(KvCache& cache, const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& slots) const;

 private:
  ModelConfig config_;
  std::vector<ParamInfo> infos_;
  std::vector<at::Tensor> tensors_;
  std::map<std::string, int, std::less<>> index_;
};

}  // namespace arlo::reference
