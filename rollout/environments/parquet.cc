// parquet and hf_dataset: datasets read with Apache Arrow's own reader (pyarrow), never a reader of
// our own. There is no Arrow C++ library in Debian here, so arlo runs python/arlo/dataset_reader.py
// under the project's Python ($ARLO_PYTHON, else the .venv `scripts/bootstrap --python` makes): it
// maps the columns (env.prompt_column, answer_column, info_column, id_column), checks every value and
// writes one task per line to a temporary file, which this side reads like a JSONL dataset. Its
// errors name the file, the row and the column; they come back as this kind's error.
//
// The tasks are read once, when the run starts; shuffling, epochs and the resume cursor are the
// TaskStream's, as for jsonl.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "rollout/environment.h"

extern char** environ;

namespace arlo::rollout {

namespace {

// The interpreter that runs the reader: $ARLO_PYTHON, else the one CMake found (ARLO_PYTHON).
std::string dataset_python() {
  if (const char* env = std::getenv("ARLO_PYTHON"); env && *env) return env;
  return ARLO_DATASET_PYTHON;
}

// A temporary file that removes itself.
struct TempFile {
  std::string path;
  TempFile() {
    std::string pattern = (std::filesystem::temp_directory_path() / "arlo-dataset-XXXXXX").string();
    const int fd = ::mkstemp(pattern.data());
    if (fd >= 0) {
      ::close(fd);
      path = pattern;
    }
  }
  ~TempFile() {
    if (!path.empty()) ::unlink(path.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

// Runs argv with stdout and stderr into `log`; the exit status (-1: it could not start, errno in
// `spawn_errno`), or 128 + the signal that killed it.
int run_reader(std::vector<std::string> argv, const std::string& log, int& spawn_errno) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  spawn_errno =
      ::access(args[0], X_OK) != 0 ? errno : ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_errno != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

// The reader's lines as tasks of environment `name`: ids from the id column, else "<name>-<row>".
Result<std::shared_ptr<const TaskSet>> tasks_from_lines(const std::string& lines_path, const std::string& dataset,
                                                        const std::string& name, const Json& options) {
  std::ifstream in(lines_path);
  std::vector<Task> tasks;
  std::set<std::string> ids;
  std::string line;
  while (std::getline(in, line)) {
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    const auto row = j.is_object() && j.contains("row") ? j["row"].dump() : "?";
    auto task = j.is_discarded() ? Result<Task>(make_error(ErrorCode::kParse, "not JSON")) : task_from_json(j);
    if (!task)
      return make_error(ErrorCode::kParse, fmt::format("{}: row {}: the reader's line is not a task: {}", dataset, row,
                                                       task.error().message()));
    if (task->id.empty()) task->id = fmt::format("{}-{}", name, row);
    if (!ids.insert(task->id).second)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{}: row {}, column '{}': duplicate id '{}'", dataset, row,
                                    options["id_column"].get<std::string>(), task->id));
    task->env = name;
    tasks.push_back(std::move(*task));
  }
  if (tasks.empty()) return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: dataset has no tasks", dataset));
  return std::shared_ptr<const TaskSet>(std::make_shared<VectorTaskSet>(name, std::move(tasks)));
}

// Reads the dataset at spec.path in `format` (parquet, hf) through the reader.
Result<std::shared_ptr<const TaskSet>> read_dataset(const std::string& kind, const std::string& format,
                                                    const EnvironmentSpec& spec) {
  const std::string who = fmt::format("{} dataset {}", kind, spec.path);
  TempFile lines, log;
  if (lines.path.empty() || log.path.empty())
    return make_error(ErrorCode::kIo, fmt::format("{}: cannot make a temporary file: {}", who, std::strerror(errno)));
  const Json& o = spec.options;
  std::vector<std::string> argv = {dataset_python(),  ARLO_DATASET_READER,
                                   "--format",        format,
                                   "--path",          spec.path,
                                   "--output",        lines.path,
                                   "--prompt-column", o["prompt_column"].get<std::string>(),
                                   "--answer-column", o["answer_column"].get<std::string>(),
                                   "--info-column",   o["info_column"].get<std::string>(),
                                   "--id-column",     o["id_column"].get<std::string>(),
                                   "--max-rows",      std::to_string(spec.size)};
  if (o.contains("split")) argv.insert(argv.end(), {"--split", o["split"].get<std::string>()});
  int spawn_errno = 0;
  const int status = run_reader(argv, log.path, spawn_errno);
  if (status == -1)
    return make_error(ErrorCode::kNotFound,
                      fmt::format("{}: cannot start the dataset reader under {}: {} (run scripts/bootstrap --python, "
                                  "or set ARLO_PYTHON)",
                                  who, argv[0], std::strerror(spawn_errno)));
  if (status != 0) {
    const std::string what = read_all(log.path);
    const ErrorCode code = status == 3 ? ErrorCode::kNotFound : status == 2 ? ErrorCode::kParse : ErrorCode::kInternal;
    return make_error(code, status == 2 || status == 3 || status == 4
                                ? what
                                : fmt::format("{}: the dataset reader failed (exit status {}): {}", who, status, what));
  }
  return tasks_from_lines(lines.path, spec.path, kind, o);
}

std::vector<OptionSpec> column_options(bool with_split) {
  std::vector<OptionSpec> options = {
      string_option("prompt_column", "prompt",
                    "the column of the prompt: a string (completion-style) or a list of {role, content} messages "
                    "(chat).")
          .user_key(),
      string_option("answer_column", "answer", "the column of the reference answer, a string or a number (\"\": none).")
          .user_key(),
      string_option("info_column", "",
                    "the column handed to reward modules as the task's info: a struct, a map or a JSON object "
                    "string (\"\": none).")
          .user_key(),
      string_option("id_column", "", "the column of task ids, strings or integers (\"\": <kind>-<row>).").user_key(),
  };
  if (with_split)
    options.push_back(
        string_option("split", "train", "the split to read from a DatasetDict saved to disk.").user_key());
  return options;
}

// Set field by field: multi-turn kinds add fields this single-turn kind leaves at their defaults.
EnvironmentKind dataset_kind(std::string name, std::string doc, std::string format, bool with_split) {
  EnvironmentKind k;
  k.name = name;
  k.doc = std::move(doc);
  k.options = column_options(with_split);
  k.needs_path = true;
  k.make = [name, format](const EnvironmentSpec& s) { return read_dataset(name, format, s); };
  return k;
}

}  // namespace

EnvironmentKind parquet_environment() {
  return dataset_kind("parquet", "a Parquet file, or a directory of them", "parquet", false);
}

EnvironmentKind hf_dataset_environment() {
  return dataset_kind("hf_dataset", "a Hugging Face dataset saved with save_to_disk", "hf", true);
}

}  // namespace arlo::rollout
