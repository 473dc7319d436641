#include "reference/adamw.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "common/safetensors.h"
#include "reference/model_impl.h"

namespace arlo::reference {

AdamW::AdamW(Model& model, AdamWOptions options) : model_(model), options_(options) {
  for (const auto& p : model_.impl().parameters()) {
    m_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    v_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
  }
}

Result<double> AdamW::step(std::optional<double> lr_override) {
  try {
    at::NoGradGuard no_grad;
    const auto& params = model_.impl().parameters();
    double sq = 0.0;
    for (const auto& p : params)
      if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
    const double norm = std::sqrt(sq);
    if (!std::isfinite(norm))
      return make_error(ErrorCode::kInvalidArgument, "optimizer step: gradient norm is not finite; step skipped");
    double clip = 1.0;
    if (options_.max_grad_norm > 0 && norm > options_.max_grad_norm) clip = options_.max_grad_norm / (norm + 1e-6);
    ++t_;
    const double lr = lr_override.value_or(options_.lr);
    const double b1 = options_.beta1, b2 = options_.beta2;
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t_));
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t_));
    for (std::size_t i = 0; i < params.size(); ++i) {
      at::Tensor p = params[i];
      if (!p.grad().defined()) continue;
      auto g = p.grad() * clip;
      if (options_.weight_decay > 0 && p.dim() >= 2) p.mul_(1.0 - lr * options_.weight_decay);
      m_[i].mul_(b1).add_(g, 1.0 - b1);
      v_[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
      auto denom = (v_[i] / bc2).sqrt_().add_(options_.eps);
      p.addcdiv_(m_[i], denom, -lr / bc1);
      p.mutable_grad().zero_();
    }
    return norm;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInternal, fmt::format("optimizer step: libtorch: {}", e.what()));
  }
}

Status AdamW::save(const std::filesystem::path& file) const {
  std::vector<safetensors::TensorData> data;
  const auto& infos = model_.params();
  for (std::size_t i = 0; i < infos.size(); ++i)
    data.push_back({{"exp_avg." + infos[i].name, safetensors::DType::F32, infos[i].shape},
                    {static_cast<const std::byte*>(m_[i].data_ptr()), infos[i].nbytes}});
  for (std::size_t i = 0; i < infos.size(); ++i)
    data.push_back({{"exp_avg_sq." + infos[i].name, safetensors::DType::F32, infos[i].shape},
                    {static_cast<const std::byte*>(v_[i].data_ptr()), infos[i].nbytes}});
  return with_context(safetensors::write_file(file, data, {{"step", std::to_string(t_)}}),
                      "saving optimizer state " + file.string());
}

Status AdamW::load(const std::filesystem::path& file) {
  ARLO_ASSIGN_OR_RETURN(auto st, safetensors::File::open(file));
  const auto& infos = model_.params();
  auto read = [&](const std::string& name, at::Tensor& dst, std::size_t nbytes) -> Status {
    const auto* t = st.header().find(name);
    if (t == nullptr || t->dtype != safetensors::DType::F32 || t->nbytes != nbytes)
      return make_error(ErrorCode::kMismatch,
                        fmt::format("optimizer state {}: tensor {} missing or of another shape", file.string(), name));
    std::memcpy(dst.data_ptr(), st.data(*t).data(), nbytes);
    return ok();
  };
  for (std::size_t i = 0; i < infos.size(); ++i) {
    ARLO_TRY(read("exp_avg." + infos[i].name, m_[i], infos[i].nbytes));
    ARLO_TRY(read("exp_avg_sq." + infos[i].name, v_[i], infos[i].nbytes));
  }
  auto it = st.header().metadata.find("step");
  if (it == st.header().metadata.end())
    return make_error(ErrorCode::kMismatch, "optimizer state " + file.string() + ": no step in metadata");
  t_ = std::stoll(it->second);
  return ok();
}

}  // namespace arlo::reference
