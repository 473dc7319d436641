// libFuzzer target for trainer batch files (trainer_bridge/batch.cc): arbitrary bytes as a batch
// safetensors image, as a trainer receives it over the socket bridge (BatchView::from_bytes) and
// reads it from a run directory (BatchView::open, on a memfd holding the same bytes).
//
// Properties checked:
//   - neither reader crashes, throws or hangs; an error always says why; the two agree;
//   - on an accepted batch every accessor is safe to read whole (ASan sees any byte outside the
//     image) and has the schema's size: rows * seq_len per token tensor, rows * max_segments for
//     seq_lens; the loss mask holds 0/1;
//   - an accepted batch copied out (to_rank_batch) encodes to an image that reads back equal.
#include <cstdint>
#include <cstring>
#include <string>

#include "tests/fuzz/check.h"
#include "trainer_bridge/batch.h"

namespace {

using arlo::bridge::BatchView;
using arlo::bridge::RankBatch;
using arlo::fuzz::check;

template <typename Span>
unsigned touch(Span s) {
  unsigned sink = 0;
  for (const auto& x : s) {
    unsigned char bytes[sizeof x];
    std::memcpy(bytes, &x, sizeof x);
    for (unsigned char b : bytes) sink += b;
  }
  return sink;
}

void check_view(const BatchView& v) {
  const std::size_t tokens = static_cast<std::size_t>(v.rows()) * static_cast<std::size_t>(v.seq_len());
  check(v.rows() >= 1 && v.seq_len() >= 1, "rows and seq_len are positive");
  check(v.rank() >= 0 && v.rank() < v.num_ranks(), "rank inside num_ranks");
  check(v.input_ids().size() == tokens, "input_ids size");
  check(v.position_ids().size() == tokens, "position_ids size");
  check(v.loss_mask().size() == tokens, "loss_mask size");
  check(v.advantages().size() == tokens, "advantages size");
  check(v.inference_logprobs().size() == tokens, "inference_logprobs size");
  check(v.token_versions().size() == tokens, "token_versions size");
  check(v.sample_ids().size() == tokens, "sample_ids size");
  check(v.ce_weights().empty() == !v.has_ce_weights(), "ce_weights presence");
  check(!v.has_ce_weights() || v.ce_weights().size() == tokens, "ce_weights size");
  check(v.max_segments() >= 1 &&
            v.seq_lens().size() == static_cast<std::size_t>(v.rows()) * static_cast<std::size_t>(v.max_segments()),
        "seq_lens size");
  for (const auto m : v.loss_mask()) check(m <= 1, "loss_mask is 0/1");
  unsigned sink = touch(v.input_ids()) + touch(v.position_ids()) + touch(v.loss_mask()) + touch(v.advantages()) +
                  touch(v.inference_logprobs()) + touch(v.token_versions()) + touch(v.seq_lens()) +
                  touch(v.sample_ids()) + touch(v.ce_weights());
  for (const auto& t : v.tensors()) sink += touch(t.bytes);
  (void)sink;
}

bool same_bits(const RankBatch& a, const RankBatch& b) {
  auto eq = [](const auto& x, const auto& y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof x[0]) == 0);
  };
  return a.step == b.step && a.rank == b.rank && a.num_ranks == b.num_ranks && a.rows == b.rows &&
         a.seq_len == b.seq_len && a.max_segments == b.max_segments && eq(a.input_ids, b.input_ids) &&
         eq(a.position_ids, b.position_ids) && eq(a.loss_mask, b.loss_mask) && eq(a.advantages, b.advantages) &&
         eq(a.inference_logprobs, b.inference_logprobs) && eq(a.token_versions, b.token_versions) &&
         eq(a.seq_lens, b.seq_lens) && eq(a.sample_ids, b.sample_ids) && eq(a.ce_weights, b.ce_weights);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto view = BatchView::from_bytes(bytes);
  if (view) {
    check_view(*view);
    const RankBatch copy = view->to_rank_batch();
    auto image = arlo::bridge::encode(copy);
    check(image.has_value(), "an accepted batch encodes");
    auto again = BatchView::from_bytes(*image);
    check(again.has_value(), "the encoded batch reads back");
    check(same_bits(again->to_rank_batch(), copy), "the encoded batch reads back equal");
  } else {
    check(!view.error().what().empty(), "errors carry a message");
  }

  auto opened = BatchView::open(arlo::fuzz::as_file(data, size));
  check(opened.has_value() == view.has_value(), "BatchView::open agrees with from_bytes");
  if (opened) {
    check_view(*opened);
    check(same_bits(opened->to_rank_batch(), view->to_rank_batch()), "both readers read the same batch");
  }
  return 0;
}
