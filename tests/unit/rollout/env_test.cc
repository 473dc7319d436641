#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "rollout/environment.h"

namespace arlo::rollout {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "arlo_env_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path write(const std::string& name, const std::string& text) const {
    fs::path p = path_ / name;
    std::ofstream(p) << text;
    return p;
  }

 private:
  fs::path path_;
};

TEST(Jsonl, LoadsPromptAndMessagesWithAnswersAndInfo) {
  TempDir dir;
  auto p =
      dir.write("d.jsonl",
                "{\"prompt\": \"1+1=\", \"answer\": \"2\", \"info\": {\"level\": 1}}\n"
                "\n"
                "{\"id\": \"chat-1\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"answer\": 7}\n");
  auto src = load_jsonl(p.string(), "toy");
  ASSERT_TRUE(src) << src.error().what();
  ASSERT_EQ((*src)->size(), 2u);
  const Task& a = (*src)->at(0);
  EXPECT_EQ(a.id, "toy-1");
  EXPECT_EQ(a.prompt, "1+1=");
  EXPECT_EQ(a.answer, "2");
  EXPECT_EQ(a.info["level"], 1);
  EXPECT_EQ(a.env, "toy");
  const Task& b = (*src)->at(1);
  EXPECT_EQ(b.id, "chat-1");
  ASSERT_TRUE(b.is_chat());
  EXPECT_EQ(b.messages[0].content, "hi");
  EXPECT_EQ(b.answer, "7");
  EXPECT_EQ(b.prompt_text(), "user: hi");
  auto first = load_jsonl(p.string(), "toy", 1);
  ASSERT_TRUE(first);
  EXPECT_EQ((*first)->size(), 1u);
}

TEST(Jsonl, BadLinesCiteFileAndLineNumber) {
  TempDir dir;
  auto bad_json = dir.write("a.jsonl", "{\"prompt\": \"x\"}\n{not json}\n");
  auto r = load_jsonl(bad_json.string(), "a");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("a.jsonl:2"), std::string::npos) << r.error().what();
  EXPECT_EQ(r.error().code(), ErrorCode::kParse);

  auto no_prompt = dir.write("b.jsonl", "{\"prompt\": \"x\"}\n{\"prompt\": \"y\"}\n{\"answer\": \"3\"}\n");
  r = load_jsonl(no_prompt.string(), "b");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("b.jsonl:3"), std::string::npos) << r.error().what();
  EXPECT_NE(r.error().what().find("prompt"), std::string::npos);

  auto bad_messages = dir.write("c.jsonl", "{\"messages\": [{\"role\": \"user\"}]}\n");
  r = load_jsonl(bad_messages.string(), "c");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("c.jsonl:1"), std::string::npos) << r.error().what();

  auto dup = dir.write("d.jsonl", "{\"id\": \"x\", \"prompt\": \"a\"}\n{\"id\": \"x\", \"prompt\": \"b\"}\n");
  r = load_jsonl(dup.string(), "d");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("duplicate id"), std::string::npos);

  r = load_jsonl((fs::temp_directory_path() / "arlo-no-such-file.jsonl").string(), "e");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
}

TEST(Arithmetic, SeededTwoDigitSumsWithExactAnswers) {
  auto a = make_arithmetic({.seed = 7, .size = 200});
  auto b = make_arithmetic({.seed = 7, .size = 200});
  auto c = make_arithmetic({.seed = 8, .size = 200});
  ASSERT_TRUE(a && b && c);
  bool differs = false;
  for (std::size_t i = 0; i < 200; ++i) {
    const Task& t = (*a)->at(i);
    EXPECT_EQ(t.prompt, (*b)->at(i).prompt);
    differs = differs || t.prompt != (*c)->at(i).prompt;
    // "23+45=" -> "68"
    const std::string& p = *t.prompt;
    ASSERT_EQ(p.back(), '=');
    const auto plus = p.find('+');
    ASSERT_NE(plus, std::string::npos);
    const int x = std::stoi(p.substr(0, plus)), y = std::stoi(p.substr(plus + 1));
    EXPECT_EQ(t.answer, std::to_string(x + y));
    EXPECT_GE(x + y, 20);
    EXPECT_LE(x + y, 98);
    for (char ch : p) EXPECT_TRUE(ch >= 0x20 && ch <= 0x7e);
  }
  EXPECT_TRUE(differs);
  EXPECT_FALSE(make_arithmetic({.size = 0}));
  EXPECT_FALSE(make_arithmetic({.min_value = 50, .max_value = 10}));
  // env.max_operand below 10: terms start at 0.
  auto small = make_arithmetic({.seed = 1, .size = 50, .max_value = 5});
  ASSERT_TRUE(small);
  for (std::size_t i = 0; i < 50; ++i) EXPECT_LE(std::stoi((*small)->at(i).answer), 10);
}

TEST(ReverseText, AnswersAreReversedPrompts) {
  auto src = make_reverse_text({.seed = 3, .size = 50, .min_length = 2, .max_length = 6});
  ASSERT_TRUE(src);
  for (std::size_t i = 0; i < 50; ++i) {
    const Task& t = (*src)->at(i);
    const std::string s = t.info["text"];
    EXPECT_EQ(*t.prompt, "reverse " + s + ":");
    EXPECT_EQ(t.answer, std::string(s.rbegin(), s.rend()));
    EXPECT_GE(s.size(), 2u);
    EXPECT_LE(s.size(), 6u);
  }
}

TEST(Split, EvalAndTrainAreDisjointAndCoverTheSource) {
  auto src = make_arithmetic({.seed = 1, .size = 100});
  ASSERT_TRUE(src);
  auto split = split_eval(*src, 10, 42);
  ASSERT_TRUE(split);
  EXPECT_EQ(split->eval->size(), 10u);
  EXPECT_EQ(split->train->size(), 90u);
  std::set<std::string> ids;
  for (std::size_t i = 0; i < split->eval->size(); ++i) ids.insert(split->eval->at(i).id);
  for (std::size_t i = 0; i < split->train->size(); ++i) EXPECT_TRUE(ids.insert(split->train->at(i).id).second);
  EXPECT_EQ(ids.size(), 100u);
  EXPECT_FALSE(split_eval(*src, 100, 1));
}

TEST(TaskStream, ShufflesEachEpochAndStopsAfterEpochs) {
  auto src = make_reverse_text({.seed = 0, .size = 5});
  ASSERT_TRUE(src);
  TaskStream s(*src, {.seed = 9, .shuffle = true, .epochs = 2});
  std::vector<std::string> first, second;
  for (int i = 0; i < 5; ++i) first.push_back(s.next()->id);
  EXPECT_EQ(s.epoch(), 1u);
  for (int i = 0; i < 5; ++i) second.push_back(s.next()->id);
  EXPECT_TRUE(s.exhausted());
  auto end = s.next();
  ASSERT_FALSE(end);
  EXPECT_EQ(end.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(std::set<std::string>(first.begin(), first.end()).size(), 5u);  // each task once per epoch
  EXPECT_EQ(std::set<std::string>(second.begin(), second.end()).size(), 5u);

  TaskStream ordered(*src, {.seed = 9, .shuffle = false, .epochs = 1});
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(ordered.next()->id, (*src)->at(i).id);
}

TEST(TaskStream, RestoredCursorContinuesExactly) {
  auto src = make_arithmetic({.seed = 5, .size = 7});
  ASSERT_TRUE(src);
  TaskStream a(*src, {.seed = 11, .shuffle = true, .epochs = std::nullopt});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(a.next());  // into the second epoch
  const Json saved = Json::parse(a.cursor().dump());   // through text, as a checkpoint would
  std::vector<std::string> expected;
  for (int i = 0; i < 12; ++i) expected.push_back(a.next()->id);

  TaskStream b(*src, {.seed = 11, .shuffle = true, .epochs = std::nullopt});
  ASSERT_TRUE(b.restore(saved));
  EXPECT_EQ(b.served(), 10u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(b.next()->id, expected[i]) << i;

  TaskStream other_seed(*src, {.seed = 12, .shuffle = true, .epochs = std::nullopt});
  auto st = other_seed.restore(saved);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kMismatch);
  EXPECT_FALSE(b.restore(Json{{"source", "arithmetic"}}));
}

TEST(Environments, RegistryBuildsEachKindFromItsCheckedOptions) {
  std::vector<std::string> names;
  for (const auto& k : environment_kinds()) names.push_back(k.name);
  EXPECT_EQ(names, (std::vector<std::string>{"arithmetic", "reverse_text", "jsonl", "parquet", "hf_dataset",
                                             "arithmetic_retry", "calculator", "http", "verifiers"}));

  // A kind's source is the one its own function makes, options defaulted from its declaration.
  EnvironmentSpec spec;
  spec.seed = 5;
  spec.size = 20;
  spec.options = {{"max_operand", 30}};
  auto via_registry = make_task_source("arithmetic", spec);
  ASSERT_TRUE(via_registry) << via_registry.error().what();
  ArithmeticOptions direct;
  direct.seed = 5;
  direct.size = 20;
  direct.max_value = 30;
  direct.num_terms = 2;  // the declared default
  auto expected = make_arithmetic(direct);
  ASSERT_TRUE(expected);
  ASSERT_EQ((*via_registry)->size(), 20u);
  for (std::size_t i = 0; i < 20; ++i) {
    EXPECT_EQ((*via_registry)->at(i).prompt, (*expected)->at(i).prompt);
    EXPECT_EQ((*via_registry)->at(i).answer, (*expected)->at(i).answer);
  }

  spec.options = {{"max_len", 2}, {"min_len", 1}};
  auto reversed = make_task_source("reverse_text", spec);
  ASSERT_TRUE(reversed) << reversed.error().what();
  EXPECT_LE((*reversed)->at(0).answer.size(), 2u);

  spec.options = {{"max_operand", "big"}};
  auto bad = make_task_source("arithmetic", spec);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message(), "environment 'arithmetic': option 'max_operand' has the wrong type (\"big\")");
  spec.options = {{"min_len", 3}};
  bad = make_task_source("arithmetic", spec);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message(),
            "environment 'arithmetic': unknown option 'min_len' (known: max_operand, num_terms)");
  bad = make_task_source("mnist", spec);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message(),
            "unknown environment kind 'mnist': use arithmetic, reverse_text, jsonl, parquet, "
            "hf_dataset, arithmetic_retry, calculator, http or verifiers");

  const EnvironmentKind* rt = *find_environment_kind("reverse_text");
  ASSERT_TRUE(rt->check);
  EXPECT_EQ(rt->check({{"min_len", 5}, {"max_len", 4}}).first, "min_len");
  EXPECT_TRUE(rt->check({{"min_len", 4}, {"max_len", 4}}).first.empty());
}

}  // namespace
}  // namespace arlo::rollout
