// Packer invariants under randomized inputs, encode/decode round trips, and hostile batch files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "tests/temp_dir.h"
#include "trainer_bridge/batch.h"

namespace arlo::bridge {
namespace {

namespace fs = std::filesystem;

Sample random_sample(std::mt19937& rng, int max_prompt, int max_completion, bool ce) {
  Sample s;
  const int p = std::uniform_int_distribution<int>(1, max_prompt)(rng);
  const int c = std::uniform_int_distribution<int>(0, max_completion)(rng);
  for (int i = 0; i < p; ++i) s.prompt_tokens.push_back(std::uniform_int_distribution<int>(1, 30000)(rng));
  for (int i = 0; i < c; ++i) {
    s.completion_tokens.push_back(std::uniform_int_distribution<int>(1, 30000)(rng));
    s.completion_logprobs.push_back(-std::uniform_real_distribution<float>(0.0f, 5.0f)(rng));
    s.token_versions.push_back(std::uniform_int_distribution<int>(0, 9)(rng));
    if (ce) s.ce_weights.push_back(std::uniform_real_distribution<float>(0.0f, 1.0f)(rng));
  }
  s.advantage = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
  return s;
}

// Checks every invariant of a packed step against its input.
void check_invariants(const std::vector<Sample>& samples, const StepBatch& step, const PackOptions& opt) {
  const std::size_t L = static_cast<std::size_t>(opt.seq_len);
  // Where each sample's tokens ended up: sample index -> tokens seen, in order.
  std::map<int, std::vector<std::int32_t>> seen_tokens;
  std::map<int, int> seen_segments;
  std::vector<std::int64_t> rank_tokens;
  std::int64_t expected_rejected = 0, expected_truncated = 0;
  for (const Sample& s : samples) {
    if (s.size() > L) {
      if (opt.overlong == Overlong::kReject || s.prompt_tokens.size() >= L) {
        ++expected_rejected;
      } else {
        ++expected_truncated;
      }
    }
  }
  EXPECT_EQ(step.report.rejected, expected_rejected);
  EXPECT_EQ(step.report.truncated, expected_truncated);
  ASSERT_EQ(step.ranks.size(), static_cast<std::size_t>(opt.num_ranks));
  std::size_t longest = 0;
  for (const RankBatch& b : step.ranks) {
    ASSERT_EQ(b.seq_len, opt.seq_len);
    ASSERT_GE(b.rows, 1);
    if (opt.equal_rows) {
      EXPECT_EQ(b.rows, step.ranks[0].rows);
    }
    std::int64_t tokens = 0;
    for (int row = 0; row < b.rows; ++row) {
      std::size_t t = static_cast<std::size_t>(row) * L;
      std::size_t used = 0;
      for (int seg = 0; seg < b.max_segments; ++seg) {
        const int len = b.seq_lens[static_cast<std::size_t>(row) * b.max_segments + seg];
        if (len == 0) {
          // Zero-filled tail: no later segment may be non-zero.
          for (int k = seg; k < b.max_segments; ++k)
            EXPECT_EQ(b.seq_lens[static_cast<std::size_t>(row) * b.max_segments + k], 0);
          break;
        }
        const int id = b.sample_ids[t];
        ASSERT_GE(id, 0);
        ASSERT_LT(id, static_cast<int>(samples.size()));
        const Sample& s = samples[static_cast<std::size_t>(id)];
        EXPECT_EQ(seen_segments[id]++, 0) << "sample " << id << " packed twice";
        longest = std::max<std::size_t>(longest, static_cast<std::size_t>(len));
        for (int k = 0; k < len; ++k, ++t) {
          EXPECT_EQ(b.sample_ids[t], id);
          EXPECT_EQ(b.position_ids[t], k) << "positions restart per sample";
          seen_tokens[id].push_back(b.input_ids[t]);
          const bool is_prompt = static_cast<std::size_t>(k) < s.prompt_tokens.size();
          EXPECT_EQ(b.loss_mask[t], is_prompt ? 0 : 1);
          if (is_prompt) {
            EXPECT_EQ(b.token_versions[t], -1);
            EXPECT_EQ(b.advantages[t], 0.0f);
          } else {
            const std::size_t c = static_cast<std::size_t>(k) - s.prompt_tokens.size();
            EXPECT_EQ(b.inference_logprobs[t], s.completion_logprobs[c]);
            EXPECT_EQ(b.token_versions[t], s.token_versions[c]);
            EXPECT_EQ(b.advantages[t], s.advantage);
            if (!b.ce_weights.empty()) {
              EXPECT_EQ(b.ce_weights[t], s.ce_weights.empty() ? 0.0f : s.ce_weights[c]);
            }
          }
        }
        used += static_cast<std::size_t>(len);
        tokens += len;
      }
      ASSERT_LE(used, L);
      for (; t < static_cast<std::size_t>(row + 1) * L; ++t) {
        EXPECT_EQ(b.loss_mask[t], 0) << "padding is masked";
        EXPECT_EQ(b.sample_ids[t], -1);
        EXPECT_EQ(b.input_ids[t], opt.pad_token_id);
      }
    }
    EXPECT_EQ(tokens, b.tokens);
    rank_tokens.push_back(tokens);
  }
  // Every token of every accepted sample exactly once, in order; rejected ones nowhere.
  std::int64_t accepted = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    const bool rejected = s.size() > L && (opt.overlong == Overlong::kReject || s.prompt_tokens.size() >= L);
    if (rejected) {
      EXPECT_EQ(seen_tokens.count(static_cast<int>(i)), 0u);
      continue;
    }
    ++accepted;
    std::vector<std::int32_t> want = s.prompt_tokens;
    want.insert(want.end(), s.completion_tokens.begin(), s.completion_tokens.end());
    if (want.size() > L) want.resize(L);
    EXPECT_EQ(seen_tokens[static_cast<int>(i)], want) << "sample " << i;
  }
  EXPECT_EQ(step.report.samples, accepted);
  // Ranks balanced within one sample's size.
  const auto [lo, hi] = std::minmax_element(rank_tokens.begin(), rank_tokens.end());
  EXPECT_LE(static_cast<std::size_t>(*hi - *lo), longest);
}

TEST(Packer, RandomizedInvariants) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    PackOptions opt;
    opt.seq_len = std::uniform_int_distribution<int>(8, 200)(rng);
    opt.num_ranks = std::uniform_int_distribution<int>(1, 5)(rng);
    opt.overlong = trial % 2 ? Overlong::kTruncate : Overlong::kReject;
    opt.pad_token_id = trial % 3;
    opt.equal_rows = trial % 4 != 0;
    const bool ce = trial % 5 == 0;
    const int n = std::uniform_int_distribution<int>(0, 60)(rng);
    std::vector<Sample> samples;
    for (int i = 0; i < n; ++i)
      samples.push_back(random_sample(rng, opt.seq_len / 2 + 2, opt.seq_len, ce && i % 2 == 0));
    auto step = pack(trial + 1, samples, opt);
    ASSERT_TRUE(step) << step.error().what();
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_invariants(samples, *step, opt);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(Packer, FirstFitDecreasingFillsRowsTightly) {
  // Lengths 6,5,4,3,2 into rows of 10: FFD gives [6,4] [5,3,2].
  std::vector<Sample> samples;
  for (int len : {3, 6, 2, 5, 4}) {
    Sample s;
    s.prompt_tokens.assign(1, 7);
    s.completion_tokens.assign(static_cast<std::size_t>(len - 1), 9);
    s.completion_logprobs.assign(static_cast<std::size_t>(len - 1), -0.5f);
    s.token_versions.assign(static_cast<std::size_t>(len - 1), 2);
    samples.push_back(s);
  }
  auto step = pack(1, samples, {.seq_len = 10, .num_ranks = 1});
  ASSERT_TRUE(step);
  const RankBatch& b = step->ranks[0];
  ASSERT_EQ(b.rows, 2);
  ASSERT_EQ(b.max_segments, 3);
  EXPECT_EQ(std::vector<std::int32_t>(b.seq_lens.begin(), b.seq_lens.end()),
            (std::vector<std::int32_t>{6, 4, 0, 5, 3, 2}));
  EXPECT_DOUBLE_EQ(step->report.fill, 20.0 / 20.0);
  EXPECT_EQ(b.policy_version_min, 2);
  EXPECT_EQ(b.policy_version_max, 2);
}

TEST(Packer, OverlongRejectedOrTruncatedAndCounted) {
  Sample s;
  s.prompt_tokens.assign(4, 1);
  s.completion_tokens.assign(10, 2);
  s.completion_logprobs.assign(10, -1.0f);
  s.token_versions.assign(10, 0);
  Sample prompt_too_long = s;
  prompt_too_long.prompt_tokens.assign(8, 1);
  std::vector<Sample> samples{s, prompt_too_long};
  auto truncated = pack(1, samples, {.seq_len = 8, .overlong = Overlong::kTruncate});
  ASSERT_TRUE(truncated);
  EXPECT_EQ(truncated->report.truncated, 1);
  EXPECT_EQ(truncated->report.rejected, 1);
  EXPECT_EQ(truncated->report.loss_tokens, 4);
  auto rejected = pack(1, samples, {.seq_len = 8, .overlong = Overlong::kReject});
  ASSERT_TRUE(rejected);
  EXPECT_EQ(rejected->report.rejected, 2);
  EXPECT_EQ(rejected->report.samples, 0);
  EXPECT_EQ(rejected->ranks[0].rows, 1);  // an all-padding row: every rank always has work
}

// A sample's loss_mask keeps its tokens out of the loss (orchestrator.overlong: mask): in the batch
// with their ids and versions, 0 in loss_mask, advantages, inference_logprobs and ce_weights, and
// not counted in loss_tokens.
TEST(Packer, LossMaskKeepsASampleInTheBatchOutOfTheLoss) {
  Sample in_loss;
  in_loss.prompt_tokens = {1, 2};
  in_loss.completion_tokens = {3, 4};
  in_loss.completion_logprobs = {-0.5f, -0.5f};
  in_loss.token_versions = {7, 7};
  in_loss.advantage = 1.5f;
  in_loss.ce_weights = {1.0f, 1.0f};
  Sample masked = in_loss;
  masked.completion_tokens = {5, 6};
  masked.loss_mask = {0, 0};
  std::vector<Sample> samples{in_loss, masked};
  auto step = pack(1, samples, {.seq_len = 8});
  ASSERT_TRUE(step) << step.error().what();
  const RankBatch& b = step->ranks[0];
  EXPECT_EQ(step->report.samples, 2);
  EXPECT_EQ(step->report.tokens, 8);
  EXPECT_EQ(step->report.loss_tokens, 2);
  EXPECT_EQ(b.step_loss_tokens, 2);
  EXPECT_EQ(b.loss_tokens, 2);
  for (std::size_t t = 0; t < b.input_ids.size(); ++t) {
    const bool completion = b.input_ids[t] >= 3;
    const bool is_masked = b.sample_ids[t] == 1;
    EXPECT_EQ(b.loss_mask[t], completion && !is_masked ? 1 : 0) << t;
    EXPECT_EQ(b.advantages[t], completion && !is_masked ? 1.5f : 0.0f) << t;
    EXPECT_EQ(b.inference_logprobs[t], completion && !is_masked ? -0.5f : 0.0f) << t;
    EXPECT_EQ(b.ce_weights[t], completion && !is_masked ? 1.0f : 0.0f) << t;
    EXPECT_EQ(b.token_versions[t], completion ? 7 : -1) << t;
  }
  samples[1].loss_mask = {0};
  auto bad = pack(1, samples, {.seq_len = 8});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("loss_mask"), std::string::npos) << bad.error().what();
}

TEST(Packer, MalformedSampleIsAnError) {
  Sample s;
  s.prompt_tokens = {1};
  s.completion_tokens = {2, 3};
  s.completion_logprobs = {-1.0f};
  s.token_versions = {0, 0};
  std::vector<Sample> samples{s};
  auto r = pack(1, samples, {.seq_len = 8});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(pack(1, std::span<const Sample>{}, {.seq_len = 1}));
  EXPECT_FALSE(pack(1, std::span<const Sample>{}, {.seq_len = 8, .num_ranks = 0}));
}

// The orchestrator's samples (arlo::Sample) pack, in place, to the very bytes of the bridge::Sample
// rows they spell out: token versions from the version spans, ce_weights 1 on a supervised sample's
// completion, loss mask 0 on every token of a masked one (fate kMasked) and where its own loss_mask
// (a multi-turn trajectory's environment tokens) is 0; a short logprob list counts as 0.
TEST(Packer, OrchestratorSamplesPackToTheBytesOfTheRowsTheySpellOut) {
  std::mt19937 rng(11);
  std::vector<arlo::Sample> samples;
  std::vector<Sample> rows;
  for (int i = 0; i < 24; ++i) {
    Sample row = random_sample(rng, 12, 20, false);
    const std::size_t c = row.completion_tokens.size();
    arlo::Sample s;
    s.prompt_tokens = row.prompt_tokens;
    s.completion_tokens = row.completion_tokens;
    s.logprobs = row.completion_logprobs;
    s.version_spans = spans_of(row.token_versions);
    s.advantage = row.advantage;
    if (i % 4 == 1) {
      s.supervised = true;
      row.ce_weights.assign(c, 1.0f);
    } else if (i % 4 == 2) {
      s.fate = SampleFate::kMasked;
      row.loss_mask.assign(c, 0);
    } else if (i % 4 == 3) {
      for (std::size_t k = 0; k < c; ++k) s.loss_mask.push_back(k % 3 == 0 ? 0 : 1);
      row.loss_mask = s.loss_mask;
    } else if (c > 0) {
      s.logprobs.pop_back();
      row.completion_logprobs.back() = 0.0f;
    }
    ASSERT_EQ(s.token_versions(), row.token_versions);
    samples.push_back(std::move(s));
    rows.push_back(std::move(row));
  }
  for (const PackOptions opt : {PackOptions{.seq_len = 64, .num_ranks = 1}, PackOptions{.seq_len = 24, .num_ranks = 2},
                                PackOptions{.seq_len = 24, .overlong = Overlong::kReject}}) {
    auto ours = pack(5, std::span<const arlo::Sample>(samples), opt);
    auto theirs = pack(5, std::span<const Sample>(rows), opt);
    ASSERT_TRUE(ours) << ours.error().what();
    ASSERT_TRUE(theirs) << theirs.error().what();
    ASSERT_EQ(ours->ranks.size(), theirs->ranks.size());
    EXPECT_EQ(ours->report.loss_tokens, theirs->report.loss_tokens);
    for (std::size_t r = 0; r < ours->ranks.size(); ++r) {
      auto a = encode(ours->ranks[r]);
      auto b = encode(theirs->ranks[r]);
      ASSERT_TRUE(a && b);
      EXPECT_EQ(*a, *b) << "rank " << r << " seq_len " << opt.seq_len;
    }
  }
  // A loss mask that does not match the completion, or more logprobs than tokens, is refused.
  arlo::Sample bad;
  bad.completion_tokens = {1, 2};
  bad.loss_mask = {1};
  EXPECT_FALSE(pack(1, std::span<const arlo::Sample>(&bad, 1), {.seq_len = 8}));
  bad.loss_mask.clear();
  bad.logprobs = {0.0f, 0.0f, 0.0f};
  EXPECT_FALSE(pack(1, std::span<const arlo::Sample>(&bad, 1), {.seq_len = 8}));
}

StepBatch sample_step(std::int64_t step, int ranks, bool ce) {
  std::mt19937 rng(static_cast<unsigned>(step));
  std::vector<Sample> samples;
  for (int i = 0; i < 20; ++i) samples.push_back(random_sample(rng, 10, 30, ce));
  auto packed = pack(step, samples, {.seq_len = 64, .num_ranks = ranks});
  EXPECT_TRUE(packed);
  return std::move(*packed);
}

void expect_same(const RankBatch& a, const RankBatch& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.input_ids, b.input_ids);
  EXPECT_EQ(a.position_ids, b.position_ids);
  EXPECT_EQ(a.loss_mask, b.loss_mask);
  EXPECT_EQ(a.advantages, b.advantages);
  EXPECT_EQ(a.inference_logprobs, b.inference_logprobs);
  EXPECT_EQ(a.token_versions, b.token_versions);
  EXPECT_EQ(a.seq_lens, b.seq_lens);
  EXPECT_EQ(a.sample_ids, b.sample_ids);
  EXPECT_EQ(a.ce_weights, b.ce_weights);
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.step_loss_tokens, b.step_loss_tokens);
  EXPECT_EQ(a.policy_version_min, b.policy_version_min);
  EXPECT_EQ(a.policy_version_max, b.policy_version_max);
  EXPECT_NEAR(a.policy_version_mean, b.policy_version_mean, 1e-4);
}

class BatchFiles : public ::testing::Test {
 protected:
  test_files::TempDir dir_{"arlo_batch_test"};
};

TEST_F(BatchFiles, RoundTripThroughFileAndBytes) {
  for (bool ce : {false, true}) {
    StepBatch step = sample_step(3, 2, ce);
    for (const RankBatch& rb : step.ranks) {
      const fs::path p = dir_ / ("rank_" + std::to_string(rb.rank) + ".safetensors");
      ASSERT_TRUE(write_file(p, rb));
      auto view = BatchView::open(p);
      ASSERT_TRUE(view) << view.error().what();
      EXPECT_EQ(view->has_ce_weights(), ce);
      expect_same(rb, view->to_rank_batch());
      auto image = encode(rb);
      ASSERT_TRUE(image);
      // The encoded image is byte-identical to the file written.
      std::ifstream in(p, std::ios::binary);
      std::string file_bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_EQ(file_bytes, *image);
      auto from_bytes = BatchView::from_bytes(*image);
      ASSERT_TRUE(from_bytes) << from_bytes.error().what();
      expect_same(rb, from_bytes->to_rank_batch());
      EXPECT_EQ(view->raw().size(), image->size());
    }
  }
}

// Hostile inputs: every one is refused with an error, none crashes.
TEST_F(BatchFiles, HostileBatchesAreRefused) {
  StepBatch step = sample_step(5, 1, false);
  auto image = encode(step.ranks[0]);
  ASSERT_TRUE(image);
  auto refused = [&](std::string bytes, const char* what) {
    SCOPED_TRACE(what);
    auto v = BatchView::from_bytes(bytes);
    EXPECT_FALSE(v);
    const fs::path p = dir_ / "hostile.safetensors";
    std::ofstream(p, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    auto f = BatchView::open(p);
    EXPECT_FALSE(f);
    if (!f) {
      EXPECT_FALSE(f.error().what().empty());
    }
  };
  refused("", "empty");
  refused(image->substr(0, 5), "shorter than the length prefix");
  refused(image->substr(0, image->size() / 2), "truncated data");
  refused(image->substr(0, image->size() - 1), "one byte short");
  {
    std::string lying = *image;
    lying[0] = static_cast<char>(0xff);
    lying[7] = static_cast<char>(0x7f);
    refused(lying, "header length beyond the file");
  }
  {
    std::string tail = *image + "extra";
    refused(tail, "trailing bytes the header does not cover");
  }
  auto with_header = [&](const std::function<void(std::string&)>& edit) {
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>((*image)[i])) << (8 * i);
    std::string header = image->substr(8, n);
    const std::string data = image->substr(8 + n);
    edit(header);
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return out + header + data;
  };
  auto replace = [](std::string& s, const std::string& from, const std::string& to) {
    const auto pos = s.find(from);
    ASSERT_NE(pos, std::string::npos) << from;
    s.replace(pos, from.size(), to);
  };
  refused(with_header(
              [&](std::string& h) { replace(h, "\"arlo.schema_version\":\"1\"", "\"arlo.schema_version\":\"9\""); }),
          "future schema");
  refused(with_header(
              [&](std::string& h) { replace(h, "\"arlo.schema_version\":\"1\"", "\"arlo.schema_vers1on\":\"1\""); }),
          "no schema");
  refused(with_header([&](std::string& h) { replace(h, "\"step\":\"5\"", "\"step\":\"five\""); }), "step not a number");
  refused(with_header([&](std::string& h) { replace(h, "\"rank\":\"0\"", "\"rank\":\"3\""); }), "rank out of range");
  refused(with_header([&](std::string& h) { replace(h, "\"seq_len\":\"64\"", "\"seq_len\":\"32\""); }), "seq_len lies");
  refused(with_header([&](std::string& h) { replace(h, "\"input_ids\"", "\"input_idz\""); }), "missing tensor");
  refused(with_header([&](std::string& h) { replace(h, "{", "{\"x\":"); }), "broken JSON");
  // Content lies: a segment longer than its row, unmasked padding.
  {
    RankBatch bad = step.ranks[0];
    bad.seq_lens[0] = bad.seq_len + 1;
    refused(*encode(bad), "segment overruns the row");
  }
  {
    RankBatch bad = step.ranks[0];
    bad.loss_mask.back() = 1;
    bad.sample_ids.back() = -1;
    // Make sure the last token is padding (rows are never completely full with these sizes).
    refused(*encode(bad), "padding not masked");
  }
  {
    RankBatch bad = step.ranks[0];
    bad.position_ids[0] = 5;
    refused(*encode(bad), "positions disagree with seq_lens");
  }
}

TEST_F(BatchFiles, RandomCorruptionNeverCrashes) {
  StepBatch step = sample_step(7, 1, true);
  auto image = encode(step.ranks[0]);
  ASSERT_TRUE(image);
  std::mt19937 rng(99);
  int refused = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = *image;
    const int flips = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int f = 0; f < flips; ++f) {
      // Bias towards the header, where the structure is.
      const std::size_t limit = (i % 2) ? bytes.size() : std::min<std::size_t>(bytes.size(), 1200);
      const std::size_t pos = std::uniform_int_distribution<std::size_t>(0, limit - 1)(rng);
      bytes[pos] = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
    }
    if (i % 7 == 0) bytes.resize(std::uniform_int_distribution<std::size_t>(0, bytes.size())(rng));
    auto v = BatchView::from_bytes(bytes);
    if (!v) {
      ++refused;
      continue;
    }
    // Accepted: every accessor is in bounds and self-consistent.
    const std::size_t n = static_cast<std::size_t>(v->rows()) * static_cast<std::size_t>(v->seq_len());
    EXPECT_EQ(v->input_ids().size(), n);
    EXPECT_EQ(v->loss_mask().size(), n);
    EXPECT_EQ(v->seq_lens().size(), static_cast<std::size_t>(v->rows()) * static_cast<std::size_t>(v->max_segments()));
  }
  EXPECT_GT(refused, 100);
}

}  // namespace
}  // namespace arlo::bridge
