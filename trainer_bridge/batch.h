#pragma once
// The trainer batch (docs/bring-your-own-trainer.md, "The batch"): schema, packer, encoder and a validating reader.
//
// Usage, orchestrator side:
//   auto step = arlo::bridge::pack(s, samples, {.seq_len = 512, .num_ranks = 2});  // Result<StepBatch>
//   server.send(std::move(*step));                                                   // see bridge.h
// Usage, trainer side (any C++ trainer; arlo-trainer):
//   ARLO_ASSIGN_OR_RETURN(auto batch, client->next_batch(std::chrono::seconds(30)));  // BatchView
//   auto ids = batch.input_ids();           // span<const int32_t>, rows*seq_len, row-major
//   auto mask = batch.loss_mask();          // span<const uint8_t>
//   ... train ...; client->ack(batch.step());
//   // or read a file directly: auto b = arlo::bridge::BatchView::open("rank_0.safetensors");
//
// One file per (step, rank): a safetensors file whose tensors are all [rows, seq_len] except
// seq_lens ([rows, max_segments]):
//   input_ids          i32  token ids; padding = PackOptions::pad_token_id
//   position_ids       i32  0,1,2,... restarting at every packed sample; padding 0
//   loss_mask          u8   1 on completion tokens of a sample (the tokens the policy generated),
//                           0 on prompt tokens, padding and completion tokens the sample keeps out
//                           of the loss (Sample::loss_mask; orchestrator.overlong: mask)
//   advantages         f32  the sample's advantage on its completion tokens, 0 elsewhere
//   inference_logprobs f32  logprob the inference engine gave the token AT THIS POSITION
//                           (i.e. log p(input_ids[t] | input_ids[<t])), 0 where loss_mask is 0.
//                           A trainer computes its own logprob of input_ids[t] from the logits at t-1.
//   token_versions     i32  policy version that generated the token, -1 on prompt and padding
//   seq_lens           i32  [rows, max_segments]: lengths of the samples packed in each row, in
//                           order, zero-filled; sum per row <= seq_len, the rest of the row is padding
//   sample_ids         i32  index of the sample (in the step's input order) a token belongs to,
//                           -1 on padding (for sequence-level corrections and per-sample metrics)
//   ce_weights         f32  optional: per-token cross-entropy weight for supervised tokens (present
//                           when any sample in the step carries ce_weights; 0 elsewhere)
// Metadata (safetensors "__metadata__", all values strings):
//   arlo.schema_version ("1"), step, rank, num_ranks, seq_len,
//   samples, tokens, loss_tokens                 (this rank: samples, non-padding tokens, mask=1)
//   step_samples, step_tokens, step_loss_tokens  (whole step over all ranks: normalise a loss
//                                                 over ranks with step_loss_tokens)
//   policy_version_min, policy_version_mean, policy_version_max  (over this rank's completion
//                                                 tokens; -1 when there are none)
//   truncated, rejected                          (samples of the step cut or dropped by the packer)
//
// Thread-safety: values; a BatchView is immutable and may be read from several threads.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/safetensors.h"
#include "common/sample.h"

namespace arlo::bridge {

inline constexpr int kSchemaVersion = 1;

// One finished rollout ready to train on, every per-token column spelt out (for trainers, tools and
// tests that build rows by hand: fractional ce_weights, per-token versions). The orchestrator packs
// its arlo::Sample (common/sample.h) directly with the overload of pack() below; this type is not on
// its path. Loss applies to completion tokens only.
struct Sample {
  std::vector<std::int32_t> prompt_tokens;
  std::vector<std::int32_t> completion_tokens;
  std::vector<float> completion_logprobs;    // one per completion token
  std::vector<std::int32_t> token_versions;  // one per completion token
  float advantage = 0.0f;
  std::vector<float> ce_weights;  // empty, or one per completion token
  // Empty (every completion token is in the loss), or one per completion token: 0 keeps the token
  // out of the loss (loss_mask, advantages, inference_logprobs and ce_weights 0 there; it still
  // counts in tokens and carries its version). All 0: in the batch, out of the loss.
  std::vector<std::uint8_t> loss_mask;

  std::size_t size() const { return prompt_tokens.size() + completion_tokens.size(); }
};

enum class Overlong {
  kReject,    // drop a sample longer than seq_len (counted in `rejected`)
  kTruncate,  // cut its completion to fit (counted in `truncated`); a prompt that alone leaves no
              // room for one completion token is rejected
};

struct PackOptions {
  int seq_len = 2048;
  int num_ranks = 1;
  Overlong overlong = Overlong::kTruncate;
  std::int32_t pad_token_id = 0;
  // Give every rank the same number of rows (adding all-padding rows) so data-parallel ranks run
  // the same number of micro-steps and never wait on each other in a collective.
  bool equal_rows = true;
};

// What one trainer rank gets for one step, in memory (the orchestrator side builds these).
struct RankBatch {
  std::int64_t step = 0;
  int rank = 0;
  int num_ranks = 1;
  int rows = 0;
  int seq_len = 0;
  int max_segments = 0;  // second dimension of seq_lens (at least 1)

  std::vector<std::int32_t> input_ids, position_ids, token_versions, sample_ids;  // rows*seq_len
  std::vector<std::uint8_t> loss_mask;                                            // rows*seq_len
  std::vector<float> advantages, inference_logprobs;                              // rows*seq_len
  std::vector<float> ce_weights;                                                  // empty or rows*seq_len
  std::vector<std::int32_t> seq_lens;                                             // rows*max_segments

  // Metadata (see the file comment).
  std::int64_t samples = 0, tokens = 0, loss_tokens = 0;
  std::int64_t step_samples = 0, step_tokens = 0, step_loss_tokens = 0;
  std::int64_t truncated = 0, rejected = 0;
  std::int64_t policy_version_min = -1, policy_version_max = -1;
  double policy_version_mean = -1.0;

  std::map<std::string, std::string> metadata() const;
};

struct PackReport {
  std::int64_t samples = 0;  // accepted (possibly truncated)
  std::int64_t tokens = 0;   // non-padding tokens packed
  std::int64_t loss_tokens = 0;
  std::int64_t truncated = 0;
  std::int64_t rejected = 0;
  std::int64_t rows = 0;  // over all ranks, padding rows included
  double fill = 0.0;      // tokens / (rows * seq_len)
};

struct StepBatch {
  std::int64_t step = 0;
  std::vector<RankBatch> ranks;  // ranks[r].rank == r
  PackReport report;
};

// Packs `samples` for step `step`: splits them over num_ranks balanced by token count (largest
// first onto the least-loaded rank, so ranks differ by at most one sample's length), then fills
// each rank's rows first-fit decreasing. Deterministic for a given input. Fails on malformed
// samples (per-token vectors of the wrong length), seq_len < 2 or num_ranks < 1.
Result<StepBatch> pack(std::int64_t step, std::span<const Sample> samples, const PackOptions& options);
// The same from the orchestrator's samples, read in place: token_versions from each sample's version
// spans, ce_weights 1 on the completion of a supervised one, loss_mask 0 on every token of a masked
// one (fate kMasked) and where its own loss_mask is 0; missing logprobs count as 0. The batch is the
// one pack() makes from the bridge::Sample rows those columns spell out.
Result<StepBatch> pack(std::int64_t step, std::span<const arlo::Sample> samples, const PackOptions& options);

// Encodes one rank's batch as a complete safetensors file image (header + data).
Result<std::string> encode(const RankBatch& batch);
// Writes one rank's batch to `path` (temporary name, then rename).
Status write_file(const std::filesystem::path& path, const RankBatch& batch, bool fsync = false);

// A typed view of one tensor of a batch.
struct TensorRef {
  std::string_view name;
  safetensors::DType dtype = safetensors::DType::F32;
  std::span<const std::int64_t> shape;
  std::span<const std::byte> bytes;
};

// A received batch: owns its bytes (a memory map of the file or a received buffer) and checks the
// schema on construction, so every accessor below is safe to use on what it returns. Copies are
// cheap and share the bytes, which live until the last copy is gone. Hostile input
// (truncated file, lying header, wrong dtypes or shapes, out-of-range values) yields kParse or
// kMismatch, never a crash.
class BatchView {
 public:
  static Result<BatchView> open(const std::filesystem::path& path);
  static Result<BatchView> from_bytes(std::string bytes);

  BatchView(const BatchView&) = default;
  BatchView& operator=(const BatchView&) = default;
  BatchView(BatchView&&) noexcept;
  BatchView& operator=(BatchView&&) noexcept;
  ~BatchView();

  std::int64_t step() const;
  int rank() const;
  int num_ranks() const;
  int rows() const;
  int seq_len() const;
  int max_segments() const;
  bool has_ce_weights() const;
  const std::map<std::string, std::string>& metadata() const;
  // Integer metadata by key (kNotFound / kParse).
  Result<std::int64_t> meta_int(std::string_view key) const;

  std::span<const std::int32_t> input_ids() const;
  std::span<const std::int32_t> position_ids() const;
  std::span<const std::uint8_t> loss_mask() const;
  std::span<const float> advantages() const;
  std::span<const float> inference_logprobs() const;
  std::span<const std::int32_t> token_versions() const;
  std::span<const std::int32_t> seq_lens() const;
  std::span<const std::int32_t> sample_ids() const;
  std::span<const float> ce_weights() const;  // empty when absent

  // All tensors, in file order (for the C ABI and generic consumers).
  std::vector<TensorRef> tensors() const;
  // The whole encoded file image (for forwarding).
  std::span<const std::byte> raw() const;

  // Copies into an owned RankBatch.
  RankBatch to_rank_batch() const;

 private:
  BatchView();
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace arlo::bridge
