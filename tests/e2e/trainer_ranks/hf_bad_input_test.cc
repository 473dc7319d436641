// Bad input to the reference trainer (trainer.launch: hf, examples/hf_trainer/train.py) through
// `arlo run configs/quickstart.yaml --set trainer.launch=hf --set trainer.model=DIR` (issue 25):
//   - a model directory that is not a causal LM's (config.json of a ViT): check-config cannot tell,
//     the trainer can;
//   - a tokenizer whose vocabulary the model cannot embed (the tiny Qwen3 of python/arlo_tiny_model.py
//     with 5 tokens added to its tokenizer).
// Each: the trainer ends with exit code 2 and one line "trainer: error: <what and where>", arlo run
// does not restart it (exit 2 is final) and ends non-zero at once with an error of its own that
// quotes that line. Token ids outside the vocabulary are refused the same way, by the first batch,
// before any step is trained or acknowledged (also tests/python/hf_trainer_test.py BadInputTest).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "testing/process.h"

namespace {

namespace fs = std::filesystem;
using arlo::e2e::tail;

std::string project_python() {
  const char* env = std::getenv("ARLO_PYTHON");
  return env && *env ? env : ARLO_PROJECT_PYTHON;
}

bool python_has_transformers(const fs::path& log) {
  return arlo::e2e::run_to_end({project_python(), "-c", "import torch, transformers"}, log).exited_with(0);
}

// `arlo run` of the quickstart with the hf trainer on `model`, to its end.
arlo::e2e::Ended run_hf(const fs::path& dir, const fs::path& model) {
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  const std::string config = std::string(src ? src : ".") + "/configs/quickstart.yaml";
  return arlo::e2e::run_to_end(
      arlo::e2e::arlo_run_argv(ARLO_BINARY, config,
                               {"run.dir=" + (dir / "run").string(), "status.port=0", "log.progress=false",
                                "eval.interval=0", "trainer.launch=hf", "trainer.model=" + model.string()}),
      dir / "arlo.log");
}

// Ended non-zero, the trainer not restarted, and arlo's own error (not only the trainer's line) quotes `what`.
void expect_refused(const arlo::e2e::Ended& r, const std::string& what) {
  EXPECT_FALSE(r.exited_with(0)) << tail(r.output);
  EXPECT_NE(r.output.find("exited with code 2 (a usage error: not restarted)"), std::string::npos) << tail(r.output);
  EXPECT_EQ(r.output.find("restarting it"), std::string::npos) << "restarted after exit 2:\n" << tail(r.output);
  // The quoted last lines of arlo's error are indented: "  [trainer] trainer: error: ...".
  EXPECT_NE(r.output.find("  [trainer] trainer: error: " + what), std::string::npos) << tail(r.output);
}

class HfBadInputE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = arlo::e2e::fresh_temp_dir("arlo_hf_bad_input_e2e");
    if (!python_has_transformers(dir / "probe.log"))
      GTEST_SKIP() << project_python() << " cannot import torch and transformers (scripts/bootstrap --python)";
    ::setenv("OMP_NUM_THREADS", "1", 1);
    ::setenv("HF_HUB_OFFLINE", "1", 1);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir);
  }
  fs::path dir;
};

TEST_F(HfBadInputE2E, AModelDirectoryThatIsNotACausalLMStopsTheRunNamingIt) {
  const auto model = dir / "vit";
  fs::create_directories(model);
  std::ofstream(model / "config.json") << R"({"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 1})";
  expect_refused(run_hf(dir, model), "model directory " + model.string() + ": config.json has model_type 'vit'");
}

TEST_F(HfBadInputE2E, ATokenizerTheModelCannotEmbedStopsTheRunNamingBoth) {
  const auto model = dir / "tiny";
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  const std::string script =
      "import sys; sys.path.insert(0, sys.argv[1] + '/python'); import arlo_tiny_model\n"
      "from transformers import AutoTokenizer\n"
      "arlo_tiny_model.write(sys.argv[2], seed=1, layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, "
      "intermediate=64)\n"
      "tok = AutoTokenizer.from_pretrained(sys.argv[2]); tok.add_tokens([f'<extra_{i}>' for i in range(5)])\n"
      "tok.save_pretrained(sys.argv[2])\n";
  const auto made =
      arlo::e2e::run_to_end({project_python(), "-c", script, src ? src : ".", model.string()}, dir / "make.log");
  ASSERT_TRUE(made.exited_with(0)) << made.output;
  expect_refused(run_hf(dir, model), "tokenizer of " + model.string());
}

// A model that embeds 13 tokens (a word-level tokenizer of the digits, '+', '=' and <unk>; random
// weights) under the built-in arlo-worker, whose 104-token vocabulary reaches past it: the first batch
// holds token ids the model has no row for. The trainer refuses it naming the sample, position and
// id; no step is trained or acknowledged, so the orchestrator's journal still holds the batch.
TEST_F(HfBadInputE2E, TokenIdsOutsideTheVocabularyStopTheRunNamingSampleAndPosition) {
  const auto model = dir / "narrow";
  const std::string script =
      "import sys, torch\n"
      "from tokenizers import Tokenizer, models, pre_tokenizers\n"
      "from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM\n"
      "torch.manual_seed(0)\n"
      "vocab = {t: i for i, t in enumerate(['<unk>'] + [str(d) for d in range(10)] + ['+', '='])}\n"
      "tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token='<unk>'))\n"
      "tok.pre_tokenizer = pre_tokenizers.Whitespace()\n"
      "PreTrainedTokenizerFast(tokenizer_object=tok, unk_token='<unk>').save_pretrained(sys.argv[1])\n"
      "Qwen3ForCausalLM(Qwen3Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, "
      "num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16)).save_pretrained(sys.argv[1])\n";
  const auto made = arlo::e2e::run_to_end({project_python(), "-c", script, model.string()}, dir / "make.log");
  ASSERT_TRUE(made.exited_with(0)) << made.output;
  const auto r = run_hf(dir, model);
  expect_refused(r, "batch: sample ");
  EXPECT_NE(r.output.find("outside the model's vocabulary [0, 13)"), std::string::npos) << tail(r.output);
}

}  // namespace
