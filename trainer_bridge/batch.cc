#include "trainer_bridge/batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

namespace arlo::bridge {
namespace {

using safetensors::DType;

constexpr std::int64_t kMaxSeqLen = 1 << 24;

// Tensor order in a batch file; ce_weights last and optional.
struct Column {
  const char* name;
  DType dtype;
};
constexpr Column kColumns[] = {
    {"input_ids", DType::I32},  {"position_ids", DType::I32},       {"loss_mask", DType::U8},
    {"advantages", DType::F32}, {"inference_logprobs", DType::F32}, {"token_versions", DType::I32},
    {"seq_lens", DType::I32},   {"sample_ids", DType::I32},         {"ce_weights", DType::F32},
};

template <typename T>
std::span<const std::byte> as_bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

Result<std::int64_t> parse_int(std::string_view text, std::string_view what) {
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return make_error(ErrorCode::kParse, fmt::format("batch metadata '{}': expected an integer, got '{}'", what, text));
  }
  return value;
}

struct Placed {
  std::size_t index;       // into the input samples
  std::size_t length;      // tokens after truncation
  std::size_t completion;  // completion tokens kept
  std::size_t loss;        // of those, the ones in the loss (Sample::loss_mask)
};

// One sample as the packer reads it: views into the caller's sample (a bridge::Sample or an
// arlo::Sample), so no token is copied before it lands in the batch.
struct Row {
  std::span<const std::int32_t> prompt, completion;
  std::span<const float> logprobs;         // one per completion token (an arlo::Sample's may be short: 0)
  std::span<const std::int32_t> versions;  // one per completion token
  float advantage = 0.0f;
  std::span<const float> ce_weights;        // empty, or one per completion token
  bool ce_all = false;                      // cross-entropy weight 1 on every completion token
  std::span<const std::uint8_t> loss_mask;  // empty: every completion token is in the loss
  bool out_of_loss = false;                 // the whole sample is out of the loss

  std::size_t size() const { return prompt.size() + completion.size(); }
  bool has_ce() const { return ce_all || !ce_weights.empty(); }
  bool in_loss(std::size_t k) const { return !out_of_loss && (loss_mask.empty() || loss_mask[k] != 0); }
  float logprob(std::size_t k) const { return k < logprobs.size() ? logprobs[k] : 0.0f; }
  float ce(std::size_t k) const { return ce_all ? 1.0f : ce_weights.empty() ? 0.0f : ce_weights[k]; }
};

}  // namespace

std::map<std::string, std::string> RankBatch::metadata() const {
  std::map<std::string, std::string> m;
  m["arlo.schema_version"] = std::to_string(kSchemaVersion);
  m["step"] = std::to_string(step);
  m["rank"] = std::to_string(rank);
  m["num_ranks"] = std::to_string(num_ranks);
  m["seq_len"] = std::to_string(seq_len);
  m["samples"] = std::to_string(samples);
  m["tokens"] = std::to_string(tokens);
  m["loss_tokens"] = std::to_string(loss_tokens);
  m["step_samples"] = std::to_string(step_samples);
  m["step_tokens"] = std::to_string(step_tokens);
  m["step_loss_tokens"] = std::to_string(step_loss_tokens);
  m["truncated"] = std::to_string(truncated);
  m["rejected"] = std::to_string(rejected);
  m["policy_version_min"] = std::to_string(policy_version_min);
  m["policy_version_max"] = std::to_string(policy_version_max);
  m["policy_version_mean"] = fmt::format("{:.6g}", policy_version_mean);
  return m;
}

namespace {

// The samples that go into the step, as Placed items, largest first (ties in input order, so the
// result is deterministic). A sample longer than seq_len is truncated (its completion cut) or,
// with Overlong::kReject or a prompt that fills seq_len alone, rejected; both are counted in
// `report`.
std::vector<Placed> place_samples(std::span<const Row> samples, std::size_t seq_len, Overlong overlong,
                                  PackReport& report) {
  std::vector<Placed> items;
  items.reserve(samples.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const Row& s = samples[i];
    std::size_t keep = s.completion.size();
    if (s.size() > seq_len) {
      if (overlong == Overlong::kReject || s.prompt.size() >= seq_len) {
        ++report.rejected;
        continue;
      }
      keep = seq_len - s.prompt.size();
      ++report.truncated;
    }
    std::size_t loss = 0;
    for (std::size_t k = 0; k < keep; ++k) loss += s.in_loss(k) ? 1 : 0;
    items.push_back({i, s.prompt.size() + keep, keep, loss});
  }
  std::stable_sort(items.begin(), items.end(), [](const Placed& a, const Placed& b) { return a.length > b.length; });
  return items;
}

// The rows of each rank: rows[r][row] holds the items packed into that row, in order.
using RankRows = std::vector<std::vector<std::vector<Placed>>>;

// Ranks: each sample onto the least-loaded rank (lowest index on ties). Loads then differ by at
// most the longest sample: when a sample lands on the minimum it cannot overshoot the old maximum
// by more than its own length. Rows per rank: first-fit decreasing (`items` are in decreasing order).
RankRows assign_rows(const std::vector<Placed>& items, int num_ranks, std::size_t seq_len) {
  std::vector<std::vector<Placed>> per_rank(num_ranks);
  std::vector<std::size_t> load(num_ranks, 0);
  for (const Placed& p : items) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    per_rank[r].push_back(p);
    load[r] += p.length;
  }
  RankRows rows(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    std::vector<std::size_t> room;
    for (const Placed& p : per_rank[r]) {
      std::size_t row = 0;
      while (row < room.size() && room[row] < p.length) ++row;
      if (row == room.size()) {
        room.push_back(seq_len);
        rows[r].emplace_back();
      }
      room[row] -= p.length;
      rows[r][row].push_back(p);
    }
  }
  return rows;
}

// Fills the tensors of rank batch `b` (its rows, seq_len and max_segments already set) from the
// rows packed for it: prompt tokens out of the loss, completion tokens in it (unless the sample's
// loss_mask keeps them out) with their advantage, logprob and ce_weight, each with its version; padding pad_token_id,
// position 0, sample id -1. Counts its samples and tokens and its policy-version range.
void fill_rank(RankBatch& b, const std::vector<std::vector<Placed>>& rows, std::span<const Row> samples,
               std::int32_t pad_token_id, bool any_ce) {
  const std::size_t seq_len = static_cast<std::size_t>(b.seq_len);
  const std::size_t max_segments = static_cast<std::size_t>(b.max_segments);
  const std::size_t n = static_cast<std::size_t>(b.rows) * seq_len;
  b.input_ids.assign(n, pad_token_id);
  b.position_ids.assign(n, 0);
  b.token_versions.assign(n, -1);
  b.sample_ids.assign(n, -1);
  b.loss_mask.assign(n, 0);
  b.advantages.assign(n, 0.0f);
  b.inference_logprobs.assign(n, 0.0f);
  if (any_ce) b.ce_weights.assign(n, 0.0f);
  b.seq_lens.assign(static_cast<std::size_t>(b.rows) * max_segments, 0);

  double version_sum = 0.0;
  std::size_t completion_tokens = 0;
  std::int64_t vmin = std::numeric_limits<std::int64_t>::max(), vmax = std::numeric_limits<std::int64_t>::min();
  for (std::size_t row = 0; row < rows.size(); ++row) {
    std::size_t t = row * seq_len;
    for (std::size_t seg = 0; seg < rows[row].size(); ++seg) {
      const Placed& p = rows[row][seg];
      const Row& s = samples[p.index];
      b.seq_lens[row * max_segments + seg] = static_cast<std::int32_t>(p.length);
      std::int32_t pos = 0;
      for (std::int32_t tok : s.prompt) {
        b.input_ids[t] = tok;
        b.position_ids[t] = pos++;
        b.sample_ids[t] = static_cast<std::int32_t>(p.index);
        ++t;
      }
      for (std::size_t k = 0; k < p.completion; ++k) {
        b.input_ids[t] = s.completion[k];
        b.position_ids[t] = pos++;
        b.sample_ids[t] = static_cast<std::int32_t>(p.index);
        b.token_versions[t] = s.versions[k];
        if (s.in_loss(k)) {
          b.loss_mask[t] = 1;
          b.advantages[t] = s.advantage;
          b.inference_logprobs[t] = s.logprob(k);
          if (s.has_ce()) b.ce_weights[t] = s.ce(k);
        }
        version_sum += s.versions[k];
        vmin = std::min<std::int64_t>(vmin, s.versions[k]);
        vmax = std::max<std::int64_t>(vmax, s.versions[k]);
        ++t;
      }
      ++b.samples;
      b.tokens += static_cast<std::int64_t>(p.length);
      b.loss_tokens += static_cast<std::int64_t>(p.loss);
      completion_tokens += p.completion;
    }
  }
  if (completion_tokens > 0) {
    b.policy_version_min = vmin;
    b.policy_version_max = vmax;
    b.policy_version_mean = version_sum / static_cast<double>(completion_tokens);
  }
}

Result<StepBatch> pack_rows(std::int64_t step, std::span<const Row> samples, const PackOptions& options) {
  if (options.seq_len < 2 || options.seq_len > kMaxSeqLen) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("pack: seq_len must be in [2, {}], got {}", kMaxSeqLen, options.seq_len));
  }
  if (options.num_ranks < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("pack: num_ranks must be >= 1, got {}", options.num_ranks));
  }
  const std::size_t seq_len = static_cast<std::size_t>(options.seq_len);
  const int num_ranks = options.num_ranks;

  StepBatch out;
  out.step = step;
  const auto items = place_samples(samples, seq_len, options.overlong, out.report);
  const bool any_ce =
      std::any_of(items.begin(), items.end(), [&](const Placed& p) { return samples[p.index].has_ce(); });
  const RankRows rows = assign_rows(items, num_ranks, seq_len);
  std::size_t max_rows = 1;
  for (const auto& rr : rows) max_rows = std::max(max_rows, rr.size());

  std::int64_t step_tokens = 0, step_loss = 0, step_samples = 0;
  for (const Placed& p : items) {
    step_tokens += static_cast<std::int64_t>(p.length);
    step_loss += static_cast<std::int64_t>(p.loss);
    ++step_samples;
  }

  out.ranks.resize(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    RankBatch& b = out.ranks[r];
    b.step = step;
    b.rank = r;
    b.num_ranks = num_ranks;
    b.seq_len = options.seq_len;
    b.rows = static_cast<int>(options.equal_rows ? max_rows : std::max<std::size_t>(1, rows[r].size()));
    std::size_t max_segments = 1;
    for (const auto& row : rows[r]) max_segments = std::max(max_segments, row.size());
    b.max_segments = static_cast<int>(max_segments);
    fill_rank(b, rows[r], samples, options.pad_token_id, any_ce);
    b.step_samples = step_samples;
    b.step_tokens = step_tokens;
    b.step_loss_tokens = step_loss;
    b.truncated = out.report.truncated;
    b.rejected = out.report.rejected;
    out.report.rows += b.rows;
  }
  out.report.samples = step_samples;
  out.report.tokens = step_tokens;
  out.report.loss_tokens = step_loss;
  out.report.fill = out.report.rows > 0 ? static_cast<double>(step_tokens) /
                                              (static_cast<double>(out.report.rows) * static_cast<double>(seq_len))
                                        : 0.0;
  return out;
}

}  // namespace

Result<StepBatch> pack(std::int64_t step, std::span<const Sample> samples, const PackOptions& options) {
  std::vector<Row> rows;
  rows.reserve(samples.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    const std::size_t c = s.completion_tokens.size();
    if (s.completion_logprobs.size() != c || s.token_versions.size() != c ||
        (!s.ce_weights.empty() && s.ce_weights.size() != c) || (!s.loss_mask.empty() && s.loss_mask.size() != c)) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("pack: sample {} has {} completion tokens but {} logprobs, {} token versions, "
                                    "{} ce_weights, {} loss_mask (each must match, ce_weights and loss_mask may be "
                                    "empty)",
                                    i, c, s.completion_logprobs.size(), s.token_versions.size(), s.ce_weights.size(),
                                    s.loss_mask.size()));
    }
    rows.push_back({.prompt = s.prompt_tokens,
                    .completion = s.completion_tokens,
                    .logprobs = s.completion_logprobs,
                    .versions = s.token_versions,
                    .advantage = s.advantage,
                    .ce_weights = s.ce_weights,
                    .ce_all = false,
                    .loss_mask = s.loss_mask,
                    .out_of_loss = false});
  }
  return pack_rows(step, rows, options);
}

Result<StepBatch> pack(std::int64_t step, std::span<const arlo::Sample> samples, const PackOptions& options) {
  std::vector<std::vector<std::int32_t>> versions;  // the only per-token list the packer derives
  versions.reserve(samples.size());
  std::vector<Row> rows;
  rows.reserve(samples.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const arlo::Sample& s = samples[i];
    const std::size_t c = s.completion_tokens.size();
    if (s.logprobs.size() > c || (!s.loss_mask.empty() && s.loss_mask.size() != c)) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("pack: sample {} has {} completion tokens but {} logprobs and {} loss_mask "
                                    "(at most one logprob per token; loss_mask empty or one per token)",
                                    i, c, s.logprobs.size(), s.loss_mask.size()));
    }
    versions.push_back(s.token_versions());
    rows.push_back({.prompt = s.prompt_tokens,
                    .completion = s.completion_tokens,
                    .logprobs = s.logprobs,
                    .versions = versions.back(),
                    .advantage = static_cast<float>(s.advantage),
                    .ce_weights = {},
                    .ce_all = s.supervised,
                    .loss_mask = s.loss_mask,
                    .out_of_loss = !s.in_loss()});
  }
  return pack_rows(step, rows, options);
}

namespace {

// The tensors of a RankBatch in file order, with their shapes.
Result<std::vector<safetensors::TensorData>> tensor_data(const RankBatch& b) {
  const std::size_t n = static_cast<std::size_t>(b.rows) * static_cast<std::size_t>(b.seq_len);
  const std::vector<std::int64_t> grid{b.rows, b.seq_len};
  const std::vector<std::int64_t> segs{b.rows, b.max_segments};
  auto check = [&](std::size_t got, std::size_t want, const char* name) -> Status {
    if (got != want) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("batch step {} rank {}: tensor {} has {} elements, expected {}", b.step, b.rank,
                                    name, got, want));
    }
    return ok();
  };
  if (b.rows < 1 || b.seq_len < 1 || b.max_segments < 1) {
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("batch step {} rank {}: rows, seq_len and max_segments must be >= 1", b.step, b.rank));
  }
  ARLO_TRY(check(b.input_ids.size(), n, "input_ids"));
  ARLO_TRY(check(b.position_ids.size(), n, "position_ids"));
  ARLO_TRY(check(b.loss_mask.size(), n, "loss_mask"));
  ARLO_TRY(check(b.advantages.size(), n, "advantages"));
  ARLO_TRY(check(b.inference_logprobs.size(), n, "inference_logprobs"));
  ARLO_TRY(check(b.token_versions.size(), n, "token_versions"));
  ARLO_TRY(check(b.seq_lens.size(), static_cast<std::size_t>(b.rows) * static_cast<std::size_t>(b.max_segments),
                 "seq_lens"));
  ARLO_TRY(check(b.sample_ids.size(), n, "sample_ids"));
  if (!b.ce_weights.empty()) ARLO_TRY(check(b.ce_weights.size(), n, "ce_weights"));

  std::vector<safetensors::TensorData> t;
  t.push_back({{"input_ids", DType::I32, grid}, as_bytes_of(b.input_ids)});
  t.push_back({{"position_ids", DType::I32, grid}, as_bytes_of(b.position_ids)});
  t.push_back({{"loss_mask", DType::U8, grid}, as_bytes_of(b.loss_mask)});
  t.push_back({{"advantages", DType::F32, grid}, as_bytes_of(b.advantages)});
  t.push_back({{"inference_logprobs", DType::F32, grid}, as_bytes_of(b.inference_logprobs)});
  t.push_back({{"token_versions", DType::I32, grid}, as_bytes_of(b.token_versions)});
  t.push_back({{"seq_lens", DType::I32, segs}, as_bytes_of(b.seq_lens)});
  t.push_back({{"sample_ids", DType::I32, grid}, as_bytes_of(b.sample_ids)});
  if (!b.ce_weights.empty()) t.push_back({{"ce_weights", DType::F32, grid}, as_bytes_of(b.ce_weights)});
  return t;
}

}  // namespace

Result<std::string> encode(const RankBatch& batch) {
  ARLO_ASSIGN_OR_RETURN(auto tensors, tensor_data(batch));
  safetensors::Header header;
  header.metadata = batch.metadata();
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    safetensors::TensorInfo info;
    info.name = t.decl.name;
    info.dtype = t.decl.dtype;
    info.shape = t.decl.shape;
    info.offset = offset;
    info.nbytes = t.bytes.size();
    offset += info.nbytes;
    header.tensors.push_back(std::move(info));
  }
  const std::string json = safetensors::serialize_header(header);
  std::string out;
  out.resize(8 + json.size() + offset);
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, json.data(), json.size());
  char* data = out.data() + 8 + json.size();
  for (const auto& t : tensors) {
    if (!t.bytes.empty()) std::memcpy(data, t.bytes.data(), t.bytes.size());
    data += t.bytes.size();
  }
  return out;
}

Status write_file(const std::filesystem::path& path, const RankBatch& batch, bool fsync) {
  ARLO_ASSIGN_OR_RETURN(auto tensors, tensor_data(batch));
  return with_context(safetensors::write_file(path, tensors, batch.metadata(), fsync),
                      fmt::format("writing batch step {} rank {} to {}", batch.step, batch.rank, path.string()));
}

// ---------------------------------------------------------------------------------------------
// BatchView

struct BatchView::Impl {
  // Exactly one of these holds the bytes.
  std::optional<safetensors::File> file;
  std::string buffer;                        // from_bytes: the whole image
  std::unique_ptr<std::uint64_t[]> aligned;  // copy of the data section when it was misaligned

  safetensors::Header header_copy;  // from_bytes only (File keeps its own)
  const safetensors::Header* header = nullptr;
  const std::byte* data = nullptr;  // start of the data section
  std::span<const std::byte> raw;

  std::int64_t step = 0;
  int rank = 0, num_ranks = 1, rows = 0, seq_len = 0, max_segments = 0;
  const safetensors::TensorInfo* col[std::size(kColumns)] = {};

  template <typename T>
  std::span<const T> typed(std::size_t c) const {
    const auto* info = col[c];
    if (info == nullptr) return {};
    return {reinterpret_cast<const T*>(data + info->offset), static_cast<std::size_t>(info->nbytes / sizeof(T))};
  }

  // Checks the file against the schema (batch.h) and fills the fields above; every accessor relies
  // on it. In this order: the metadata, the columns and their shapes, the alignment, the content.
  Status validate();
  // Schema version, step, rank, num_ranks, seq_len.
  Status read_metadata();
  // Every column (ce_weights optional) with its dtype and a 2-d shape; rows from input_ids, every
  // other [rows, seq_len] except seq_lens [rows, max_segments <= seq_len].
  Status find_columns();
  // Typed spans need each tensor aligned to its element size. The reference writer aligns the data
  // section to 8; a file from elsewhere may not, so it is copied once in that case.
  void align_data();
  // Segments fit their rows, positions restart per segment, masks are 0/1, sample ids are -1
  // exactly on padding.
  Status check_content();
};

Status BatchView::Impl::validate() {
  ARLO_TRY(read_metadata());
  ARLO_TRY(find_columns());
  align_data();
  return check_content();
}

Status BatchView::Impl::read_metadata() {
  const auto& meta = header->metadata;
  auto get = [&](const char* key) -> Result<std::int64_t> {
    auto it = meta.find(key);
    if (it == meta.end()) return make_error(ErrorCode::kParse, fmt::format("batch metadata lacks '{}'", key));
    return parse_int(it->second, key);
  };
  auto sv = meta.find("arlo.schema_version");
  if (sv == meta.end()) {
    return make_error(ErrorCode::kMismatch, "not an arlo batch: metadata lacks 'arlo.schema_version'");
  }
  if (sv->second != std::to_string(kSchemaVersion)) {
    return make_error(ErrorCode::kMismatch, fmt::format("batch schema version {} is not the supported {}: upgrade the "
                                                        "side that is older",
                                                        sv->second, kSchemaVersion));
  }
  ARLO_ASSIGN_OR_RETURN(step, get("step"));
  ARLO_ASSIGN_OR_RETURN(auto r, get("rank"));
  ARLO_ASSIGN_OR_RETURN(auto nr, get("num_ranks"));
  ARLO_ASSIGN_OR_RETURN(auto sl, get("seq_len"));
  if (nr < 1 || nr > 1 << 20 || r < 0 || r >= nr) {
    return make_error(ErrorCode::kParse, fmt::format("batch metadata: rank {} of num_ranks {} is out of range", r, nr));
  }
  if (sl < 1 || sl > kMaxSeqLen)
    return make_error(ErrorCode::kParse, fmt::format("batch metadata: seq_len {} is out of range", sl));
  rank = static_cast<int>(r);
  num_ranks = static_cast<int>(nr);
  seq_len = static_cast<int>(sl);
  return ok();
}

Status BatchView::Impl::find_columns() {
  for (std::size_t c = 0; c < std::size(kColumns); ++c) {
    const auto* info = header->find(kColumns[c].name);
    const bool optional = std::string_view(kColumns[c].name) == "ce_weights";
    if (info == nullptr) {
      if (optional) continue;
      return make_error(ErrorCode::kParse, fmt::format("batch lacks tensor '{}'", kColumns[c].name));
    }
    if (info->dtype != kColumns[c].dtype) {
      return make_error(ErrorCode::kParse,
                        fmt::format("batch tensor '{}' has dtype {}, expected {}", kColumns[c].name,
                                    safetensors::dtype_name(info->dtype), safetensors::dtype_name(kColumns[c].dtype)));
    }
    if (info->shape.size() != 2) {
      return make_error(ErrorCode::kParse,
                        fmt::format("batch tensor '{}' has rank {}, expected 2", kColumns[c].name, info->shape.size()));
    }
    col[c] = info;
  }
  const auto& ids_shape = col[0]->shape;
  if (ids_shape[1] != seq_len || ids_shape[0] < 1 || ids_shape[0] > (std::int64_t{1} << 24)) {
    return make_error(ErrorCode::kParse,
                      fmt::format("batch tensor 'input_ids' has shape [{}, {}], expected [rows >= 1, seq_len {}]",
                                  ids_shape[0], ids_shape[1], seq_len));
  }
  rows = static_cast<int>(ids_shape[0]);
  for (std::size_t c = 0; c < std::size(kColumns); ++c) {
    if (col[c] == nullptr) continue;
    const bool segs = std::string_view(kColumns[c].name) == "seq_lens";
    const auto& s = col[c]->shape;
    if (s[0] != rows || (segs ? (s[1] < 1 || s[1] > seq_len) : s[1] != seq_len)) {
      return make_error(ErrorCode::kParse,
                        fmt::format("batch tensor '{}' has shape [{}, {}], which does not match {} rows of {}",
                                    kColumns[c].name, s[0], s[1], rows, segs ? "segments" : "seq_len"));
    }
    if (segs) max_segments = static_cast<int>(s[1]);
  }
  return ok();
}

void BatchView::Impl::align_data() {
  bool misaligned = false;
  for (const auto* info : col) {
    if (info != nullptr &&
        reinterpret_cast<std::uintptr_t>(data + info->offset) % safetensors::dtype_size(info->dtype) != 0) {
      misaligned = true;
    }
  }
  if (misaligned) {
    std::uint64_t size = 0;
    for (const auto& t : header->tensors) size = std::max(size, t.offset + t.nbytes);
    aligned.reset(new std::uint64_t[(size + 7) / 8]);
    std::memcpy(aligned.get(), data, size);
    data = reinterpret_cast<const std::byte*>(aligned.get());
  }
}

Status BatchView::Impl::check_content() {
  auto seq_lens = typed<std::int32_t>(6);
  auto positions = typed<std::int32_t>(1);
  auto mask = typed<std::uint8_t>(2);
  auto sample_ids = typed<std::int32_t>(7);
  const std::size_t L = static_cast<std::size_t>(seq_len);
  for (int row = 0; row < rows; ++row) {
    std::size_t t = static_cast<std::size_t>(row) * L;
    std::int64_t used = 0;
    for (int seg = 0; seg < max_segments; ++seg) {
      const std::int32_t len = seq_lens[static_cast<std::size_t>(row) * max_segments + seg];
      if (len < 0 || used + len > seq_len) {
        return make_error(
            ErrorCode::kParse,
            fmt::format("batch seq_lens row {}: segment {} of length {} overruns seq_len {}", row, seg, len, seq_len));
      }
      for (std::int32_t k = 0; k < len; ++k, ++t) {
        if (positions[t] != k || sample_ids[t] < 0) {
          return make_error(ErrorCode::kParse, fmt::format("batch row {} segment {} token {}: position_ids/sample_ids "
                                                           "disagree with seq_lens",
                                                           row, seg, k));
        }
      }
      used += len;
    }
    for (; t < static_cast<std::size_t>(row + 1) * L; ++t) {
      if (mask[t] != 0 || sample_ids[t] != -1) {
        return make_error(ErrorCode::kParse,
                          fmt::format("batch row {}: padding position {} is not masked", row, t % L));
      }
    }
  }
  for (std::uint8_t m : mask) {
    if (m > 1) return make_error(ErrorCode::kParse, fmt::format("batch loss_mask holds {}, expected 0 or 1", m));
  }
  return ok();
}

BatchView::BatchView() : impl_(std::make_shared<Impl>()) {}
BatchView::BatchView(BatchView&&) noexcept = default;
BatchView& BatchView::operator=(BatchView&&) noexcept = default;
BatchView::~BatchView() = default;

Result<BatchView> BatchView::open(const std::filesystem::path& path) {
  auto file = safetensors::File::open(path);
  if (!file)
    return std::unexpected(std::move(file.error()).with_context(fmt::format("reading batch {}", path.string())));
  BatchView view;
  auto& impl = *view.impl_;
  impl.file.emplace(std::move(*file));
  impl.header = &impl.file->header();
  // The data section starts where the first tensor's bytes begin minus its offset; derive it from
  // any tensor (an empty file has none and fails validation below).
  if (!impl.header->tensors.empty()) {
    const auto& first = impl.header->tensors.front();
    impl.data = impl.file->data(first).data() - first.offset;
    // The mapping starts 8 + header bytes before the data section, which runs to the end.
    std::uint64_t end = 0;
    for (const auto& t : impl.header->tensors) end = std::max(end, t.offset + t.nbytes);
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size >= end) impl.raw = {impl.data - (size - end), static_cast<std::size_t>(size)};
  }
  auto status = impl.validate();
  if (!status)
    return std::unexpected(std::move(status.error()).with_context(fmt::format("reading batch {}", path.string())));
  return view;
}

Result<BatchView> BatchView::from_bytes(std::string bytes) {
  BatchView view;
  auto& impl = *view.impl_;
  impl.buffer = std::move(bytes);
  const std::string& b = impl.buffer;
  if (b.size() < 8)
    return make_error(ErrorCode::kParse,
                      fmt::format("batch of {} bytes is shorter than the 8-byte header length", b.size()));
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
  safetensors::Limits limits;
  if (n > b.size() - 8 || n > limits.max_header_bytes) {
    return make_error(ErrorCode::kParse,
                      fmt::format("batch header length {} exceeds the {} bytes received", n, b.size() - 8));
  }
  auto header = safetensors::parse_header(std::string_view(b).substr(8, n), b.size() - 8 - n, limits);
  if (!header) return std::unexpected(std::move(header.error()).with_context("reading received batch"));
  impl.header_copy = std::move(*header);
  impl.header = &impl.header_copy;
  impl.data = reinterpret_cast<const std::byte*>(b.data() + 8 + n);
  impl.raw = std::as_bytes(std::span<const char>(b));
  auto status = impl.validate();
  if (!status) return std::unexpected(std::move(status.error()).with_context("reading received batch"));
  return view;
}

std::int64_t BatchView::step() const { return impl_->step; }
int BatchView::rank() const { return impl_->rank; }
int BatchView::num_ranks() const { return impl_->num_ranks; }
int BatchView::rows() const { return impl_->rows; }
int BatchView::seq_len() const { return impl_->seq_len; }
int BatchView::max_segments() const { return impl_->max_segments; }
bool BatchView::has_ce_weights() const { return impl_->col[8] != nullptr; }
const std::map<std::string, std::string>& BatchView::metadata() const { return impl_->header->metadata; }

Result<std::int64_t> BatchView::meta_int(std::string_view key) const {
  const auto& m = impl_->header->metadata;
  auto it = m.find(std::string(key));
  if (it == m.end()) return make_error(ErrorCode::kNotFound, fmt::format("batch metadata lacks '{}'", key));
  return parse_int(it->second, key);
}

std::span<const std::int32_t> BatchView::input_ids() const { return impl_->typed<std::int32_t>(0); }
std::span<const std::int32_t> BatchView::position_ids() const { return impl_->typed<std::int32_t>(1); }
std::span<const std::uint8_t> BatchView::loss_mask() const { return impl_->typed<std::uint8_t>(2); }
std::span<const float> BatchView::advantages() const { return impl_->typed<float>(3); }
std::span<const float> BatchView::inference_logprobs() const { return impl_->typed<float>(4); }
std::span<const std::int32_t> BatchView::token_versions() const { return impl_->typed<std::int32_t>(5); }
std::span<const std::int32_t> BatchView::seq_lens() const { return impl_->typed<std::int32_t>(6); }
std::span<const std::int32_t> BatchView::sample_ids() const { return impl_->typed<std::int32_t>(7); }
std::span<const float> BatchView::ce_weights() const { return impl_->typed<float>(8); }

std::vector<TensorRef> BatchView::tensors() const {
  std::vector<TensorRef> out;
  for (const auto& info : impl_->header->tensors) {
    out.push_back(
        {info.name, info.dtype, info.shape, {impl_->data + info.offset, static_cast<std::size_t>(info.nbytes)}});
  }
  return out;
}

std::span<const std::byte> BatchView::raw() const { return impl_->raw; }

RankBatch BatchView::to_rank_batch() const {
  RankBatch b;
  b.step = step();
  b.rank = rank();
  b.num_ranks = num_ranks();
  b.rows = rows();
  b.seq_len = seq_len();
  b.max_segments = max_segments();
  auto copy = [](auto span, auto& vec) { vec.assign(span.begin(), span.end()); };
  copy(input_ids(), b.input_ids);
  copy(position_ids(), b.position_ids);
  copy(loss_mask(), b.loss_mask);
  copy(advantages(), b.advantages);
  copy(inference_logprobs(), b.inference_logprobs);
  copy(token_versions(), b.token_versions);
  copy(seq_lens(), b.seq_lens);
  copy(sample_ids(), b.sample_ids);
  copy(ce_weights(), b.ce_weights);
  auto get = [&](const char* key, auto& field) {
    auto v = meta_int(key);
    if (v) field = static_cast<std::remove_reference_t<decltype(field)>>(*v);
  };
  get("samples", b.samples);
  get("tokens", b.tokens);
  get("loss_tokens", b.loss_tokens);
  get("step_samples", b.step_samples);
  get("step_tokens", b.step_tokens);
  get("step_loss_tokens", b.step_loss_tokens);
  get("truncated", b.truncated);
  get("rejected", b.rejected);
  get("policy_version_min", b.policy_version_min);
  get("policy_version_max", b.policy_version_max);
  auto it = metadata().find("policy_version_mean");
  if (it != metadata().end()) {
    const std::string& text = it->second;
    double mean = -1.0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), mean);
    b.policy_version_mean = (ec == std::errc() && ptr == text.data() + text.size()) ? mean : -1.0;
  }
  return b;
}

}  // namespace arlo::bridge
