#include "apps/arlo-trainer/trainer.h"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <mutex>

#include "common/file.h"
#include "common/log.h"
#include "reference/adamw.h"
#include "reference/loss.h"
#include "reference/model_impl.h"
#include "reference/model_weights.h"
#include "trainer_bridge/bridge.h"
#include "weight_sync/staging.h"

namespace arlo::trainer {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// [rows, seq_len] tensor (int64 or float) copied from a span.
template <typename T>
at::Tensor to_tensor(std::span<const T> data, std::int64_t rows, std::int64_t cols, at::ScalarType as) {
  at::ScalarType src;
  if constexpr (std::is_same_v<T, std::int32_t>) src = at::kInt;
  else if constexpr (std::is_same_v<T, std::uint8_t>) src = at::kByte;
  else src = at::kFloat;
  return at::from_blob(const_cast<T*>(data.data()), {rows, cols}, src).to(as).clone();
}

struct Checkpoint {
  std::filesystem::path dir;
  std::int64_t step = 0;
};

std::optional<Checkpoint> latest_checkpoint(const std::filesystem::path& root) {
  std::ifstream in(root / "latest");
  std::int64_t step = -1;
  if (!(in >> step) || step < 0) return std::nullopt;
  return Checkpoint{root / fmt::format("step_{}", step), step};
}

Status save_checkpoint(const std::filesystem::path& root, std::int64_t step, const reference::Model& model,
                       const reference::AdamW& opt) {
  auto dir = root / fmt::format("step_{}", step);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::kIo, fmt::format("creating {}: {}", dir.string(), ec.message()));
  ARLO_TRY(model.save(dir / "model.safetensors", {{"arlo.version", std::to_string(step)}}));
  ARLO_TRY(opt.save(dir / "optimizer.safetensors"));
  ARLO_TRY(write_file_atomically(dir / "state.json", json{{"step", step}, {"optimizer_steps", opt.steps()}}.dump()));
  ARLO_TRY(write_file_atomically(root / "latest", std::to_string(step)));
  // Keep the two newest checkpoints.
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    auto name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0) continue;
    std::int64_t s = -1;
    try { s = std::stoll(name.substr(5)); } catch (...) { continue; }
    if (s >= 0 && s < step - static_cast<std::int64_t>(1) && s != step) {
      std::error_code rm;
      std::filesystem::remove_all(entry.path(), rm);
    }
  }
  return ok();
}

}  // namespace

Result<std::int64_t> run_trainer(const TrainerOptions& o, const std::atomic<bool>& stop) {
  ARLO_TRY(o.model.validate());
  auto correction = reference::parse_correction(o.correction);
  if (!correction)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("trainer: unknown correction '{}': use none, token_tis, seq_tis or token_mis", o.correction));
  reference::set_torch_threads(o.threads);
  const auto ckpt_root = o.checkpoint_dir.empty() ? o.run_dir / "checkpoints" / "trainer" : o.checkpoint_dir;

  // Model and optimizer: from the latest checkpoint, or a seeded initialisation.
  std::int64_t step = 0;
  std::shared_ptr<reference::Model> model;
  auto ckpt = latest_checkpoint(ckpt_root);
  if (ckpt) {
    ARLO_ASSIGN_OR_RETURN(model, reference::Model::load(ckpt->dir / "model.safetensors", o.model));
    step = ckpt->step;
  } else {
    ARLO_ASSIGN_OR_RETURN(model, reference::Model::init(o.model, o.seed));
  }
  model->impl().set_requires_grad(true);
  reference::AdamW opt(*model, {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps,
                                .weight_decay = o.weight_decay, .max_grad_norm = o.max_grad_norm});
  if (ckpt) {
    ARLO_TRY(opt.load(ckpt->dir / "optimizer.safetensors"));
    ARLO_INFO("resumed from {} at step {}", ckpt->dir.string(), step);
  }

  bridge::ClientOptions co;
  co.transport = o.bridge_transport;
  co.run_dir = o.run_dir;
  co.host = o.bridge_host;
  co.port = o.bridge_port;
  co.rank = o.rank;
  co.start_after_step = step;
  ARLO_ASSIGN_OR_RETURN(auto client, bridge::connect(co));

  weight_sync::Options wso = o.weight_sync;
  wso.peer_name = "arlo-trainer";
  // The trainer's figures of step s ride with the announcement of version s (the orchestrator's
  // step records and the live page read them there).
  std::mutex metrics_mu;
  std::map<std::int64_t, json> step_metrics;
  auto announce = [&](const weight_sync::Announcement& a) {
    json info = {{"weight_sync", weight_sync::to_json(a)}};
    {
      std::lock_guard lk(metrics_mu);
      auto it = step_metrics.find(static_cast<std::int64_t>(a.version));
      if (it != step_metrics.end()) info["metrics"] = it->second;
      step_metrics.erase(step_metrics.begin(), step_metrics.upper_bound(static_cast<std::int64_t>(a.version)));
    }
    if (auto st = client->published(static_cast<std::int64_t>(a.version), info); !st)
      ARLO_WARN("announcing v{}: {}", a.version, st.error().what());
  };
  ARLO_ASSIGN_OR_RETURN(auto publisher, weight_sync::StagingPublisher::create(wso, announce));
  ARLO_INFO("weights: {} publisher at {}", wso.transport, publisher->endpoint().dump());
  // Returns how long staging held this thread.
  auto stage = [&](std::int64_t version, bool workers_hold_it) -> Result<double> {
    reference::ModelWeights source(*model);
    auto staged = workers_hold_it ? publisher->stage_held(static_cast<weight_sync::Version>(version), source)
                                  : publisher->stage(static_cast<weight_sync::Version>(version), source);
    if (!staged) return std::unexpected(std::move(staged).error().with_context(fmt::format("staging v{}", version)));
    ARLO_DEBUG("staged v{}: {} bytes copied in {:.3f}s", version, staged->bytes, staged->copy_seconds);
    return staged->copy_seconds;
  };
  // v0 is the seeded initialisation every worker builds from the same seed: announced, not sent.
  ARLO_TRY(stage(step, /*workers_hold_it=*/!ckpt));

  std::ofstream metrics_log(o.run_dir / "trainer_metrics.jsonl", std::ios::app);
  reference::LossOptions lo;
  lo.correction = *correction;
  lo.tis_high = o.tis_high;
  lo.mis_low = o.mis_low;
  lo.mis_high = o.mis_high;
  lo.ce_coef = o.ce_coef;
  lo.temperature = o.temperature;

  auto idle_since = Clock::now();
  while (!stop.load() && (o.max_steps == 0 || step < o.max_steps)) {
    auto got = client->next_batch(o.batch_timeout);
    if (!got) {
      if (got.error().code() == ErrorCode::kTimeout) {
        if (o.idle_exit.count() > 0 && Clock::now() - idle_since > o.idle_exit) {
          ARLO_INFO("no batch for {} ms: stopping", o.idle_exit.count());
          break;
        }
        continue;
      }
      if (got.error().code() == ErrorCode::kCancelled) break;
      return std::unexpected(std::move(got).error().with_context(fmt::format("trainer: waiting for step {}", step + 1)));
    }
    idle_since = Clock::now();
    const bridge::BatchView& b = *got;
    if (b.step() <= step) {  // trained before a restart
      ARLO_TRY(client->ack(b.step()));
      continue;
    }
    const auto t0 = Clock::now();
    const std::int64_t rows = b.rows(), cols = b.seq_len();
    reference::LossOutput out;
    double grad_norm = 0;
    const double base_lr = b.has_ce_weights() && o.sft_lr > 0 ? o.sft_lr : o.lr;
    const double lr = o.warmup_steps > 0 ? base_lr * std::min(1.0, static_cast<double>(step + 1) / o.warmup_steps) : base_lr;
    try {
      auto ids = to_tensor(b.input_ids(), rows, cols, at::kLong);
      auto pos = to_tensor(b.position_ids(), rows, cols, at::kLong);
      reference::LossInputs in;
      in.logits = model->impl().forward(ids, pos);
      in.input_ids = ids;
      in.position_ids = pos;
      in.loss_mask = to_tensor(b.loss_mask(), rows, cols, at::kFloat);
      in.advantages = to_tensor(b.advantages(), rows, cols, at::kFloat);
      in.inference_logprobs = to_tensor(b.inference_logprobs(), rows, cols, at::kFloat);
      if (b.has_ce_weights()) in.ce_weights = to_tensor(b.ce_weights(), rows, cols, at::kFloat);
      ARLO_ASSIGN_OR_RETURN(out, reference::compute_loss(in, lo));
      out.loss.backward();
    } catch (const std::exception& e) {
      return make_error(ErrorCode::kInternal, fmt::format("trainer step {}: libtorch: {}", b.step(), e.what()));
    }
    ARLO_ASSIGN_OR_RETURN(grad_norm, opt.step(lr));
    step = b.step();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0) ARLO_TRY(save_checkpoint(ckpt_root, step, *model, opt));
    ARLO_TRY(client->ack(step));
    json m = {{"step", step},
              {"loss", out.loss.item<double>()},
              {"pg_loss", out.pg_loss},
              {"ce_loss", out.ce_loss},
              {"grad_norm", grad_norm},
              {"mismatch_kl", out.mismatch_kl},
              {"clipped_fraction", out.clipped_fraction},
              {"clipped_low_fraction", out.clipped_low_fraction},
              {"clipped_high_fraction", out.clipped_high_fraction},
              {"entropy", out.entropy},
              {"lr", lr},
              {"step_seconds", seconds},
              {"loss_tokens", out.pg_tokens},
              {"ce_tokens", out.ce_tokens}};
    {
      std::lock_guard lk(metrics_mu);
      step_metrics[step] = m;
    }
    ARLO_ASSIGN_OR_RETURN(m["stage_seconds"], stage(step, false));  // in trainer_metrics.jsonl
    metrics_log << m.dump() << "\n";
    metrics_log.flush();
    ARLO_INFO("step {} loss {:.4f} (pg {:.4f} ce {:.4f}) grad_norm {:.3f} mismatch_kl {:.2e} clipped {:.3f} "
              "entropy {:.3f} lr {:.2e} {:.3f}s",
              step, m["loss"].get<double>(), out.pg_loss, out.ce_loss, grad_norm, out.mismatch_kl,
              out.clipped_fraction, out.entropy, lr, seconds);
  }
  // A final checkpoint, so that a run extended with --resume continues from the last step trained.
  if (o.checkpoint_every > 0 && step > 0 && step % o.checkpoint_every != 0)
    ARLO_TRY(save_checkpoint(ckpt_root, step, *model, opt));
  if (auto st = publisher->flush(weight_sync::deadline_in(o.weight_sync.timeout)); !st)
    ARLO_WARN("the last version was not published: {}", st.error().what());
  publisher.reset();
  client->close();
  return step;
}

}  // namespace arlo::trainer
