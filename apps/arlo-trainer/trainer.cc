#include "apps/arlo-trainer/trainer.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>

#include "common/crash_point.h"
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

// FNV-1a of a batch file's bytes: which batch a step was trained on (trainer_metrics.jsonl
// "batch", the checkpoint's "lineage").
std::string batch_digest(std::span<const std::byte> bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto b : bytes) h = (h ^ static_cast<std::uint8_t>(b)) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

// The trainer's copies of the batches it acknowledged after its newest checkpoint:
// <checkpoint_dir>/batches/step_<s>.safetensors. A step is acknowledged only once it is in a
// checkpoint or here, so a restart replays these instead of needing them from the bridge again.
std::filesystem::path kept_batch(const std::filesystem::path& root, std::int64_t step) {
  return root / "batches" / fmt::format("step_{}.safetensors", step);
}

std::vector<std::pair<std::int64_t, std::filesystem::path>> kept_batches(const std::filesystem::path& root) {
  std::vector<std::pair<std::int64_t, std::filesystem::path>> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root / "batches", ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (!name.starts_with("step_") || !name.ends_with(".safetensors")) continue;
    try {
      out.emplace_back(std::stoll(name.substr(5)), it->path());
    } catch (...) {
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void drop_kept_batches(const std::filesystem::path& root, std::int64_t up_to) {
  for (const auto& [s, path] : kept_batches(root)) {
    if (s > up_to) break;
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
}

Status sync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(ErrorCode::kIo, fmt::format("syncing {}: {}", path.string(), std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return make_error(ErrorCode::kIo, fmt::format("syncing {}: {}", path.string(), std::strerror(err)));
  return ok();
}

Status save_checkpoint(const std::filesystem::path& root, std::int64_t step, const reference::Model& model,
                       const reference::AdamW& opt, const std::vector<std::string>& lineage) {
  auto dir = root / fmt::format("step_{}", step);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::kIo, fmt::format("creating {}: {}", dir.string(), ec.message()));
  ARLO_TRY(model.save(dir / "model.safetensors", {{"arlo.version", std::to_string(step)}}));
  ARLO_TRY(opt.save(dir / "optimizer.safetensors"));
  // Durable before `latest` names them (the writers rename into place but do not sync).
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) ARLO_TRY(sync_path(dir / name));
  ARLO_TRY(write_file_atomically(
      dir / "state.json", json{{"step", step}, {"optimizer_steps", opt.steps()}, {"lineage", lineage}}.dump()));
  ARLO_TRY(write_file_atomically(root / "latest", std::to_string(step)));
  drop_kept_batches(root, step);
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
  std::vector<std::string> lineage;  // lineage[i]: digest of the batch step i+1 was trained on
  std::shared_ptr<reference::Model> model;
  auto ckpt = latest_checkpoint(ckpt_root);
  if (ckpt) {
    ARLO_ASSIGN_OR_RETURN(model, reference::Model::load(ckpt->dir / "model.safetensors", o.model));
    step = ckpt->step;
    std::ifstream state(ckpt->dir / "state.json");
    const auto j = json::parse(state, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("lineage") && j["lineage"].is_array())
      lineage = j["lineage"].get<std::vector<std::string>>();
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
  std::int64_t saved_step = ckpt ? ckpt->step : 0;  // the newest checkpoint on disk

  // The run directory may not exist yet (a trainer on its own host, given a fresh directory): made
  // here, so the metrics log is never silently lost.
  std::error_code dir_ec;
  std::filesystem::create_directories(o.run_dir, dir_ec);
  const auto metrics_path = o.run_dir / "trainer_metrics.jsonl";
  ARLO_TRY(with_context(drop_partial_last_line(metrics_path), "trainer"));
  std::ofstream metrics_log(metrics_path, std::ios::app);
  if (!metrics_log)
    return make_error(ErrorCode::kIo, fmt::format("trainer: cannot open {} for appending: {} (--run-dir)", metrics_path.string(),
                                                  dir_ec ? dir_ec.message() : std::strerror(errno)));
  // One whole line per record; a write that fails (a full disk) stops the trainer naming the file.
  auto log_metrics = [&](const nlohmann::json& m) -> Status {
    metrics_log << m.dump() << "\n";
    metrics_log.flush();
    if (!metrics_log)
      return make_error(ErrorCode::kIo, fmt::format("trainer: writing {}: {}", metrics_path.string(), std::strerror(errno)));
    return {};
  };
  reference::LossOptions lo;
  lo.correction = *correction;
  lo.tis_high = o.tis_high;
  lo.mis_low = o.mis_low;
  lo.mis_high = o.mis_high;
  lo.ce_coef = o.ce_coef;
  lo.temperature = o.temperature;

  // One optimizer step on batch `b` (the step after `step`); its figures for trainer_metrics.jsonl.
  auto train = [&](const bridge::BatchView& b) -> Result<json> {
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
    lineage.push_back(batch_digest(b.raw()));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return json{{"step", step},
                {"batch", lineage.back()},
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
  };
  auto checkpoint = [&]() -> Status {
    ARLO_TRY(with_context(save_checkpoint(ckpt_root, step, *model, opt, lineage),
                          fmt::format("trainer: checkpoint of step {} (the previous one, step {}, is kept)", step, saved_step)));
    saved_step = step;
    return ok();
  };

  // Steps acknowledged after the checkpoint: replayed from the trainer's own copies, in order, so
  // the weights hold every acknowledged step exactly once (docs/checkpoints.md).
  for (const auto& [s, path] : kept_batches(ckpt_root)) {
    if (s <= step) continue;
    if (s != step + 1)
      return make_error(ErrorCode::kMismatch, fmt::format("trainer: replaying kept batches: {} follows step {} (a "
                                                          "step is missing; the checkpoint under {} cannot be continued)",
                                                          path.string(), step, ckpt_root.string()));
    ARLO_ASSIGN_OR_RETURN(auto view, bridge::BatchView::open(path));
    ARLO_ASSIGN_OR_RETURN(auto m, train(view));
    m["replayed"] = true;
    ARLO_TRY(log_metrics(m));
    ARLO_INFO("replayed step {} from {}", step, path.string());
  }

  bridge::ClientOptions co;
  co.transport = o.bridge_transport;
  co.run_dir = o.run_dir;
  co.host = o.bridge_host;
  co.host_source = "--bridge-host";
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
  std::optional<Error> unannounced;  // the first announcement that failed (under metrics_mu)
  auto announce = [&](const weight_sync::Announcement& a) {
    json info = {{"weight_sync", weight_sync::to_json(a)}};
    {
      std::lock_guard lk(metrics_mu);
      auto it = step_metrics.find(static_cast<std::int64_t>(a.version));
      if (it != step_metrics.end()) info["metrics"] = it->second;
      step_metrics.erase(step_metrics.begin(), step_metrics.upper_bound(static_cast<std::int64_t>(a.version)));
    }
    if (auto st = client->published(static_cast<std::int64_t>(a.version), info); !st) {
      std::lock_guard lk(metrics_mu);
      if (!unannounced) unannounced = std::move(st).error().with_context(fmt::format("announcing v{}", a.version));
    }
  };
  ARLO_ASSIGN_OR_RETURN(auto publisher, weight_sync::StagingPublisher::create(wso, announce));
  ARLO_INFO("weights: {} publisher at {}", wso.transport, publisher->endpoint().dump());
  // A version the workers can never get (not written, e.g. the disk is full, or not announced)
  // stops the trainer with that error: the orchestrator waits for it, so going on would wait for
  // batches that never come (docs/checkpoints.md: the first write that fails stops the run).
  auto published_ok = [&]() -> Status {
    {
      std::lock_guard lk(metrics_mu);
      if (unannounced) return std::unexpected(Error(*unannounced).with_context("trainer"));
    }
    return with_context(publisher->failure(), "trainer");
  };
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
  ARLO_TRY(stage(step, /*workers_hold_it=*/step == 0));

  auto idle_since = Clock::now();
  while (!stop.load() && (o.max_steps == 0 || step < o.max_steps)) {
    ARLO_TRY(published_ok());
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
    if (b.step() != step + 1)
      return make_error(ErrorCode::kMismatch,
                        fmt::format("trainer: the bridge delivered step {} after step {}: a step would be skipped", b.step(), step));
    ARLO_ASSIGN_OR_RETURN(auto m, train(b));
    // Acknowledged only once a restart would not need the batch again: in a checkpoint, or kept.
    if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0) {
      crash_point("trainer.before_checkpoint", step);
      ARLO_TRY(checkpoint());
      crash_point("trainer.after_checkpoint", step);
    } else {
      ARLO_TRY(with_context(write_file_atomically(kept_batch(ckpt_root, step), std::string_view(reinterpret_cast<const char*>(b.raw().data()), b.raw().size())),
                            fmt::format("trainer: keeping the batch of step {} until the next checkpoint", step)));
    }
    ARLO_TRY(client->ack(step));
    {
      std::lock_guard lk(metrics_mu);
      step_metrics[step] = m;
    }
    ARLO_ASSIGN_OR_RETURN(m["stage_seconds"], stage(step, false));  // in trainer_metrics.jsonl
    ARLO_TRY(log_metrics(m));
    ARLO_INFO("step {} loss {:.4f} (pg {:.4f} ce {:.4f}) grad_norm {:.3f} mismatch_kl {:.2e} clipped {:.3f} "
              "entropy {:.3f} lr {:.2e} {:.3f}s",
              step, m["loss"].get<double>(), m["pg_loss"].get<double>(), m["ce_loss"].get<double>(),
              m["grad_norm"].get<double>(), m["mismatch_kl"].get<double>(), m["clipped_fraction"].get<double>(),
              m["entropy"].get<double>(), m["lr"].get<double>(), m["step_seconds"].get<double>());
  }
  // A final checkpoint (stop, SIGTERM, max_steps), so that a resume loads the last step trained
  // instead of replaying the kept batches.
  if (o.checkpoint_every > 0 && step > saved_step) ARLO_TRY(checkpoint());
  if (auto st = publisher->flush(weight_sync::deadline_in(o.weight_sync.timeout)); !st)
    ARLO_WARN("the last version was not published: {}", st.error().what());
  publisher.reset();
  client->close();
  return step;
}

}  // namespace arlo::trainer
