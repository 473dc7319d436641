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
  if constexpr (std::is_same_v<T, std::int32_t>)
    src = at::kInt;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    src = at::kByte;
  else
    src = at::kFloat;
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
  ARLO_TRY(write_file_atomically(dir / "state.json",
                                 json{{"step", step}, {"optimizer_steps", opt.steps()}, {"lineage", lineage}}.dump()));
  ARLO_TRY(write_file_atomically(root / "latest", std::to_string(step)));
  drop_kept_batches(root, step);
  // Keep the two newest checkpoints.
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    auto name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0) continue;
    std::int64_t s = -1;
    try {
      s = std::stoll(name.substr(5));
    } catch (...) {
      continue;
    }
    if (s >= 0 && s < step - static_cast<std::int64_t>(1) && s != step) {
      std::error_code rm;
      std::filesystem::remove_all(entry.path(), rm);
    }
  }
  return ok();
}

// The steps a checkpoint was trained on (lineage[i]: digest of the batch of step i+1), from its
// state.json; none when it has no readable lineage.
std::vector<std::string> checkpoint_lineage(const std::filesystem::path& dir) {
  std::ifstream state(dir / "state.json");
  const auto j = json::parse(state, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("lineage") && j["lineage"].is_array())
    return j["lineage"].get<std::vector<std::string>>();
  return {};
}

// The loss the trainer's options ask for; an unknown is_correction is refused, naming the flag.
Result<reference::LossOptions> loss_options(const TrainerOptions& o) {
  auto is_correction = reference::parse_is_correction(o.is_correction);
  if (!is_correction)
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("trainer: unknown is_correction '{}' (--is-correction): use none, token_tis, seq_tis or "
                    "token_mis",
                    o.is_correction));
  reference::LossOptions lo;
  lo.is_correction = *is_correction;
  lo.is_low = o.is_low;
  lo.is_high = o.is_high;
  lo.ce_coef = o.ce_coef;
  lo.temperature = o.temperature;
  return lo;
}

// One trainer run between its start and its end: the model and optimizer with the steps trained
// into them, the metrics log, and (once connected) the bridge client and the weight publisher.
// Used in this order: resume, open_metrics_log, replay_kept_batches, connect, train_until_stopped,
// finish. Lives on the heap because the publisher's announcements call back into it.
class Trainer {
 public:
  // The model and optimizer of the newest checkpoint under the checkpoint dir, or a seeded
  // initialisation (step 0) when there is none.
  static Result<std::unique_ptr<Trainer>> resume(const TrainerOptions& o, reference::LossOptions loss);

  // Opens <run_dir>/trainer_metrics.jsonl for appending, making the run directory if it does not
  // exist yet (a trainer on its own host, given a fresh directory) so the log is never silently
  // lost, and dropping a last line a crash left partial.
  Status open_metrics_log();

  // Trains the steps acknowledged after the checkpoint from the trainer's own copies, in order, so
  // the weights hold every acknowledged step exactly once (docs/checkpoints.md). A gap is refused.
  Status replay_kept_batches();

  // Connects to the bridge (asking for the steps after the current one), starts the publisher and
  // stages the current version (v0, the seeded initialisation every worker builds itself, is
  // announced, not sent).
  Status connect();

  // Trains the batches the bridge delivers until max_steps, idle_exit, `stop`, or the bridge is
  // closed. A version that could not be published or announced stops it with that error.
  Status train_until_stopped(const std::atomic<bool>& stop);

  // A final checkpoint (so a resume loads the last step trained instead of replaying kept
  // batches), the last version flushed (a failure is only logged), the publisher stopped and the
  // bridge closed. Returns the last step trained.
  Result<std::int64_t> finish();

 private:
  Trainer(const TrainerOptions& o, reference::LossOptions loss)
      : o_(o),
        loss_(loss),
        ckpt_root_(o.checkpoint_dir.empty() ? o.run_dir / "checkpoints" / "trainer" : o.checkpoint_dir),
        metrics_path_(o.run_dir / "trainer_metrics.jsonl") {}

  // One optimizer step on batch `b` (the step after step_); its figures for trainer_metrics.jsonl.
  Result<json> train(const bridge::BatchView& b);
  // A batch the bridge delivered: acknowledged again when trained before a restart, else trained,
  // made durable (checkpoint or kept copy), acknowledged, staged as the next version and logged.
  Status take_batch(const bridge::BatchView& b);
  // A batch is acknowledged only once a restart would not need it again: in a checkpoint, or kept.
  Status make_durable(const bridge::BatchView& b);
  Status checkpoint();
  // One whole line per record; a write that fails (a full disk) stops the trainer naming the file.
  Status log_metrics(const json& m);
  // The publisher's announcement of a version, with the figures of its step: the orchestrator's
  // step records and the live page read them there. Runs on the publisher's thread; a failure makes
  // the version unpublished (the publisher's failure()).
  Status announce(const weight_sync::Announcement& a);
  // A version the workers can never get (not written, e.g. the disk is full, or not announced)
  // stops the trainer with that error: the orchestrator waits for it, so going on would wait for
  // batches that never come (docs/checkpoints.md: the first write that fails stops the run).
  Status published_ok();
  // Stages the model as `version`; returns how long staging held this thread.
  Result<double> stage(std::int64_t version, bool workers_hold_it);

  const TrainerOptions& o_;
  const reference::LossOptions loss_;
  const std::filesystem::path ckpt_root_;
  const std::filesystem::path metrics_path_;

  std::int64_t step_ = 0;
  std::vector<std::string> lineage_;  // lineage_[i]: digest of the batch step i+1 was trained on
  std::shared_ptr<reference::Model> model_;
  std::optional<reference::AdamW> opt_;
  std::int64_t saved_step_ = 0;  // the newest checkpoint on disk
  std::ofstream metrics_log_;

  // Declared in this order so the publisher, whose announcements use the others, goes first.
  std::unique_ptr<bridge::BridgeClient> client_;
  std::mutex metrics_mu_;
  std::map<std::int64_t, json> step_metrics_;  // figures of the steps not yet announced
  std::unique_ptr<weight_sync::StagingPublisher> publisher_;
};

Result<std::unique_ptr<Trainer>> Trainer::resume(const TrainerOptions& o, reference::LossOptions loss) {
  std::unique_ptr<Trainer> t(new Trainer(o, loss));
  const auto ckpt = latest_checkpoint(t->ckpt_root_);
  if (ckpt) {
    ARLO_ASSIGN_OR_RETURN(t->model_, reference::Model::load(ckpt->dir / "model.safetensors", o.model));
    t->step_ = ckpt->step;
    t->lineage_ = checkpoint_lineage(ckpt->dir);
  } else {
    ARLO_ASSIGN_OR_RETURN(t->model_, reference::Model::init(o.model, o.seed));
  }
  t->model_->impl().set_requires_grad(true);
  t->opt_.emplace(*t->model_, reference::AdamWOptions{.lr = o.lr,
                                                      .beta1 = o.beta1,
                                                      .beta2 = o.beta2,
                                                      .eps = o.eps,
                                                      .weight_decay = o.weight_decay,
                                                      .max_grad_norm = o.max_grad_norm});
  if (ckpt) {
    ARLO_TRY(t->opt_->load(ckpt->dir / "optimizer.safetensors"));
    ARLO_INFO("resumed from {} at step {}", ckpt->dir.string(), t->step_);
    t->saved_step_ = ckpt->step;
  }
  return t;
}

Status Trainer::open_metrics_log() {
  std::error_code dir_ec;
  std::filesystem::create_directories(o_.run_dir, dir_ec);
  ARLO_TRY(with_context(drop_partial_last_line(metrics_path_), "trainer"));
  metrics_log_.open(metrics_path_, std::ios::app);
  if (!metrics_log_)
    return make_error(ErrorCode::kIo,
                      fmt::format("trainer: cannot open {} for appending: {} (--run-dir)", metrics_path_.string(),
                                  dir_ec ? dir_ec.message() : std::strerror(errno)));
  return ok();
}

Status Trainer::log_metrics(const json& m) {
  metrics_log_ << m.dump() << "\n";
  metrics_log_.flush();
  if (!metrics_log_)
    return make_error(ErrorCode::kIo,
                      fmt::format("trainer: writing {}: {}", metrics_path_.string(), std::strerror(errno)));
  return {};
}

Result<json> Trainer::train(const bridge::BatchView& b) {
  const auto t0 = Clock::now();
  const std::int64_t rows = b.rows(), cols = b.seq_len();
  reference::LossOutput out;
  double grad_norm = 0;
  const double base_lr = b.has_ce_weights() && o_.sft_lr > 0 ? o_.sft_lr : o_.lr;
  const double lr =
      o_.warmup_steps > 0 ? base_lr * std::min(1.0, static_cast<double>(step_ + 1) / o_.warmup_steps) : base_lr;
  try {
    auto ids = to_tensor(b.input_ids(), rows, cols, at::kLong);
    auto pos = to_tensor(b.position_ids(), rows, cols, at::kLong);
    reference::LossInputs in;
    in.logits = model_->impl().forward(ids, pos);
    in.input_ids = ids;
    in.position_ids = pos;
    in.loss_mask = to_tensor(b.loss_mask(), rows, cols, at::kFloat);
    in.advantages = to_tensor(b.advantages(), rows, cols, at::kFloat);
    in.inference_logprobs = to_tensor(b.inference_logprobs(), rows, cols, at::kFloat);
    if (b.has_ce_weights()) in.ce_weights = to_tensor(b.ce_weights(), rows, cols, at::kFloat);
    ARLO_ASSIGN_OR_RETURN(out, reference::compute_loss(in, loss_));
    out.loss.backward();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInternal, fmt::format("trainer step {}: libtorch: {}", b.step(), e.what()));
  }
  ARLO_ASSIGN_OR_RETURN(grad_norm, opt_->step(lr));
  step_ = b.step();
  lineage_.push_back(batch_digest(b.raw()));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return json{{"step", step_},
              {"batch", lineage_.back()},
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
}

Status Trainer::checkpoint() {
  ARLO_TRY(with_context(
      save_checkpoint(ckpt_root_, step_, *model_, *opt_, lineage_),
      fmt::format("trainer: checkpoint of step {} (the previous one, step {}, is kept)", step_, saved_step_)));
  saved_step_ = step_;
  return ok();
}

Status Trainer::replay_kept_batches() {
  for (const auto& [s, path] : kept_batches(ckpt_root_)) {
    if (s <= step_) continue;
    if (s != step_ + 1)
      return make_error(ErrorCode::kMismatch,
                        fmt::format("trainer: replaying kept batches: {} follows step {} (a "
                                    "step is missing; the checkpoint under {} cannot be continued)",
                                    path.string(), step_, ckpt_root_.string()));
    ARLO_ASSIGN_OR_RETURN(auto view, bridge::BatchView::open(path));
    ARLO_ASSIGN_OR_RETURN(auto m, train(view));
    m["replayed"] = true;
    ARLO_TRY(log_metrics(m));
    ARLO_INFO("replayed step {} from {}", step_, path.string());
  }
  return ok();
}

Status Trainer::announce(const weight_sync::Announcement& a) {
  json info = {{"weight_sync", weight_sync::to_json(a)}};
  {
    std::lock_guard lk(metrics_mu_);
    auto it = step_metrics_.find(a.version);
    if (it != step_metrics_.end()) info["metrics"] = it->second;
    step_metrics_.erase(step_metrics_.begin(), step_metrics_.upper_bound(a.version));
  }
  return client_->published(a.version, info);
}

Status Trainer::connect() {
  bridge::ClientOptions co;
  co.transport = o_.bridge_transport;
  co.run_dir = o_.run_dir;
  co.host = o_.bridge_host;
  co.host_source = "--bridge-host";
  co.port = o_.bridge_port;
  co.rank = o_.rank;
  co.start_after_step = step_;
  ARLO_ASSIGN_OR_RETURN(client_, bridge::connect(co));

  weight_sync::Options wso = o_.weight_sync;
  wso.peer_name = "arlo-trainer";
  ARLO_ASSIGN_OR_RETURN(publisher_, weight_sync::StagingPublisher::create(
                                        wso, [this](const weight_sync::Announcement& a) { return announce(a); }));
  ARLO_INFO("weights: {} publisher at {}", wso.transport, publisher_->endpoint().dump());
  ARLO_TRY(stage(step_, /*workers_hold_it=*/step_ == 0));
  return ok();
}

Status Trainer::published_ok() { return with_context(publisher_->failure(), "trainer"); }

Result<double> Trainer::stage(std::int64_t version, bool workers_hold_it) {
  reference::ModelWeights source(*model_);
  auto staged = workers_hold_it ? publisher_->stage_held(version, source) : publisher_->stage(version, source);
  if (!staged) return std::unexpected(std::move(staged).error().with_context(fmt::format("staging v{}", version)));
  ARLO_DEBUG("staged v{}: {} bytes copied in {:.3f}s", version, staged->bytes, staged->copy_seconds);
  return staged->copy_seconds;
}

Status Trainer::train_until_stopped(const std::atomic<bool>& stop) {
  auto idle_since = Clock::now();
  while (!stop.load() && (o_.max_steps == 0 || step_ < o_.max_steps)) {
    ARLO_TRY(published_ok());
    auto got = client_->next_batch(o_.batch_timeout);
    if (!got) {
      if (got.error().code() == ErrorCode::kTimeout) {
        if (o_.idle_exit.count() > 0 && Clock::now() - idle_since > o_.idle_exit) {
          ARLO_INFO("no batch for {} ms: stopping", o_.idle_exit.count());
          break;
        }
        continue;
      }
      if (got.error().code() == ErrorCode::kCancelled) break;
      return std::unexpected(
          std::move(got).error().with_context(fmt::format("trainer: waiting for step {}", step_ + 1)));
    }
    idle_since = Clock::now();
    ARLO_TRY(take_batch(*got));
  }
  return ok();
}

Status Trainer::take_batch(const bridge::BatchView& b) {
  if (b.step() <= step_) return client_->ack(b.step());  // trained before a restart
  if (b.step() != step_ + 1)
    return make_error(
        ErrorCode::kMismatch,
        fmt::format("trainer: the bridge delivered step {} after step {}: a step would be skipped", b.step(), step_));
  ARLO_ASSIGN_OR_RETURN(auto m, train(b));
  ARLO_TRY(make_durable(b));
  ARLO_TRY(client_->ack(step_));
  {
    std::lock_guard lk(metrics_mu_);
    step_metrics_[step_] = m;
  }
  ARLO_ASSIGN_OR_RETURN(m["stage_seconds"], stage(step_, false));  // in trainer_metrics.jsonl
  ARLO_TRY(log_metrics(m));
  ARLO_INFO(
      "step {} loss {:.4f} (pg {:.4f} ce {:.4f}) grad_norm {:.3f} mismatch_kl {:.2e} clipped {:.3f} "
      "entropy {:.3f} lr {:.2e} {:.3f}s",
      step_, m["loss"].get<double>(), m["pg_loss"].get<double>(), m["ce_loss"].get<double>(),
      m["grad_norm"].get<double>(), m["mismatch_kl"].get<double>(), m["clipped_fraction"].get<double>(),
      m["entropy"].get<double>(), m["lr"].get<double>(), m["step_seconds"].get<double>());
  return ok();
}

Status Trainer::make_durable(const bridge::BatchView& b) {
  if (o_.checkpoint_every > 0 && step_ % o_.checkpoint_every == 0) {
    crash_point("trainer.before_checkpoint", step_);
    ARLO_TRY(checkpoint());
    crash_point("trainer.after_checkpoint", step_);
    return ok();
  }
  return with_context(
      write_file_atomically(kept_batch(ckpt_root_, step_),
                            std::string_view(reinterpret_cast<const char*>(b.raw().data()), b.raw().size())),
      fmt::format("trainer: keeping the batch of step {} until the next checkpoint", step_));
}

Result<std::int64_t> Trainer::finish() {
  if (o_.checkpoint_every > 0 && step_ > saved_step_) ARLO_TRY(checkpoint());
  if (auto st = publisher_->flush(weight_sync::deadline_in(o_.weight_sync.timeout)); !st)
    ARLO_WARN("the last version was not published: {}", st.error().what());
  publisher_.reset();
  client_->close();
  return step_;
}

}  // namespace

Result<std::int64_t> run_trainer(const TrainerOptions& o, const std::atomic<bool>& stop) {
  ARLO_TRY(o.model.validate());
  ARLO_ASSIGN_OR_RETURN(auto loss, loss_options(o));
  reference::set_torch_threads(o.threads);
  ARLO_ASSIGN_OR_RETURN(auto trainer, Trainer::resume(o, loss));
  ARLO_TRY(trainer->open_metrics_log());
  ARLO_TRY(trainer->replay_kept_batches());
  ARLO_TRY(trainer->connect());
  ARLO_TRY(trainer->train_until_stopped(stop));
  return trainer->finish();
}

}  // namespace arlo::trainer
