// code_exec: runs the model's program against the task's tests, each sample in its own sandbox
// (rollout/sandbox.h). The program is the last ```python block of the completion (else the last
// untagged ``` block, else the whole completion). The tests come from the task's info:
//   "asserts": ["assert f(1) == 2", ...]   Python lines run after the program, in one process; each
//                                           counts when it raises nothing
//   "cases": [{"input": "1 2\n", "output": "3\n"}, ...]   one run each with that stdin; passes when
//                                           it exits 0 and its stdout matches (trailing spaces and
//                                           trailing empty lines aside)
// The reward is the fraction of tests passed. A task with neither is an error (the failure policy).
#include <unistd.h>

#include <random>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "rollout/reward.h"
#include "rollout/sandbox.h"

namespace arlo::rollout {

namespace {

// Runs the program, then each assert; reports "<nonce> pass|fail <i>" lines on fd 3. The nonce comes
// on stdin and is not in any file, so a program cannot print a result line it was not given.
// SystemExit(0) from the program (sys.exit() at its end) still runs the tests.
constexpr const char* kHarness = R"PY(import sys
def _arlo_harness(tests):
    nonce = sys.stdin.readline().strip()
    report = open(3, "w", buffering=1)
    with open("solution.py", "rb") as f:
        source = f.read()
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    def attempt(code, name):
        try:
            exec(compile(code, name, "exec"), scope)
            return True
        except SystemExit as e:
            return e.code in (None, 0)
        except BaseException:
            return False
    if not attempt(source, "solution.py"):
        report.write(nonce + " error\n")
        return
    for i, test in enumerate(tests):
        report.write("%s %s %d\n" % (nonce, "pass" if attempt(test, "test_%d" % i) else "fail", i))
    report.flush()
_arlo_harness()
)PY";

struct Case {
  std::string input, output;
};
struct Tests {
  std::vector<std::string> asserts;
  std::vector<Case> cases;
  std::size_t size() const { return asserts.size() + cases.size(); }
};

Result<Tests> tests_of(const Task& task) {
  const auto bad = [&](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("code_exec: task '{}': {}", task.id, what));
  };
  Tests t;
  const Json& info = task.info;
  if (info.contains("asserts")) {
    if (!info["asserts"].is_array()) return bad("info.asserts is not a list of strings");
    for (const auto& a : info["asserts"]) {
      if (!a.is_string()) return bad("info.asserts holds a non-string: " + a.dump());
      t.asserts.push_back(a.get<std::string>());
    }
  }
  if (info.contains("cases")) {
    if (!info["cases"].is_array()) return bad("info.cases is not a list of {input, output}");
    for (const auto& c : info["cases"]) {
      if (!c.is_object() || !c.contains("input") || !c.contains("output") || !c["input"].is_string() ||
          !c["output"].is_string())
        return bad("info.cases holds an item that is not {input: string, output: string}: " + c.dump());
      t.cases.push_back({c["input"].get<std::string>(), c["output"].get<std::string>()});
    }
  }
  if (t.size() == 0) return bad("no tests (info.asserts or info.cases)");
  return t;
}

// The last fenced block tagged python (py, python3), else the last untagged one, else the text.
std::string extract_program(const std::string& text) {
  std::optional<std::string> tagged, untagged;
  for (std::size_t at = text.find("```"); at != std::string::npos;) {
    const std::size_t eol = text.find('\n', at + 3);
    if (eol == std::string::npos) break;
    const std::size_t end = text.find("```", eol + 1);
    if (end == std::string::npos) break;
    const std::string tag = trim(std::string_view(text).substr(at + 3, eol - at - 3));
    std::string body = text.substr(eol + 1, end - eol - 1);
    if (tag == "python" || tag == "py" || tag == "python3")
      tagged = std::move(body);
    else if (tag.empty())
      untagged = std::move(body);
    at = text.find("```", end + 3);
  }
  return tagged ? *tagged : untagged ? *untagged : text;
}

// Lines with trailing spaces cut, trailing empty lines dropped.
std::string normalized(const std::string& s) {
  std::istringstream in(s);
  std::string out, line;
  std::size_t kept = 0;
  while (std::getline(in, line)) {
    line.erase(line.find_last_not_of(" \t\r") + 1);
    out += line + "\n";
    if (!line.empty()) kept = out.size();
  }
  out.resize(kept);
  return out;
}

std::string fresh_nonce() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}{:016x}", rng(), rng());
}

class CodeExec : public NamedModule {
 public:
  CodeExec(std::string name, std::shared_ptr<const Sandbox> sandbox, std::vector<std::string> interpreter)
      : NamedModule(std::move(name)), sandbox_(std::move(sandbox)), interpreter_(std::move(interpreter)) {}

  Result<Score> score(const Task& task, const Rollout& r) override {
    ARLO_ASSIGN_OR_RETURN(const Tests tests, tests_of(task));
    const std::string program = extract_program(r.text);
    std::size_t passed = 0, killed = 0;
    if (!tests.asserts.empty()) {
      const std::string nonce = fresh_nonce();
      ARLO_ASSIGN_OR_RETURN(const SandboxResult res, sandbox_->run(assert_request(program, tests.asserts, nonce)));
      passed += count_passes(res.result, tests.asserts.size(), nonce);
      killed += res.timed_out || res.output_cut;
    }
    for (const auto& c : tests.cases) {
      SandboxRequest req{argv({"solution.py"}), {{"solution.py", program}}, c.input, false};
      ARLO_ASSIGN_OR_RETURN(const SandboxResult res, sandbox_->run(req));
      passed += res.exited_ok() && normalized(res.out) == normalized(c.output);
      killed += res.timed_out || res.output_cut;
    }
    const auto total = static_cast<double>(tests.size());
    return Score{static_cast<double>(passed) / total,
                 {{"passed", static_cast<double>(passed)}, {"tests", total}, {"killed", static_cast<double>(killed)}}};
  }

 private:
  std::vector<std::string> argv(std::vector<std::string> rest) const {
    std::vector<std::string> a = interpreter_;
    a.insert(a.end(), rest.begin(), rest.end());
    return a;
  }

  SandboxRequest assert_request(const std::string& program, const std::vector<std::string>& asserts,
                                const std::string& nonce) const {
    std::string harness = kHarness;
    // A JSON list of strings is a Python list literal (kept in UTF-8, not \u escapes).
    const std::string list = Json(asserts).dump(-1, ' ', false, Json::error_handler_t::replace);
    harness.replace(harness.rfind("()"), 2, "(" + list + ")");
    return {argv({"harness.py"}), {{"solution.py", program}, {"harness.py", harness}}, nonce + "\n", true};
  }

  static std::size_t count_passes(const std::string& report, std::size_t tests, const std::string& expected) {
    std::set<std::size_t> passed;
    std::istringstream in(report);
    for (std::string nonce, verdict; in >> nonce >> verdict;) {
      std::size_t i = 0;
      if (verdict == "error" || !(in >> i)) break;
      if (nonce == expected && verdict == "pass" && i < tests) passed.insert(i);
    }
    return passed.size();
  }

  std::shared_ptr<const Sandbox> sandbox_;
  std::vector<std::string> interpreter_;
};

// The interpreter's program exists inside (the same files as outside: the read-only paths).
Status check_found(const std::string& who, const std::string& program) {
  std::vector<std::string> where = {program};
  if (program.find('/') == std::string::npos)
    where = {"/usr/local/bin/" + program, "/usr/bin/" + program, "/bin/" + program};
  for (const auto& p : where)
    if (::access(p.c_str(), X_OK) == 0) return ok();
  return make_error(ErrorCode::kNotFound, fmt::format("{}: interpreter '{}' is not an executable in {}", who, program,
                                                      fmt::join(where, ", ")));
}

std::string check_interpreter(const Json& v) {
  if (!v.is_array() || v.empty())
    return "must be a non-empty list of strings (an argv: [python3] or [/usr/bin/python3, -I])";
  for (const auto& a : v)
    if (!a.is_string() || a.get<std::string>().empty()) return "must be a list of non-empty strings: " + v.dump();
  return "";
}

std::string check_paths(const Json& v) {
  if (!v.is_array()) return "must be a list of absolute paths";
  for (const auto& a : v)
    if (!a.is_string() || a.get<std::string>().empty() || a.get<std::string>()[0] != '/')
      return "must be a list of absolute paths: " + v.dump();
  return "";
}

std::vector<OptionSpec> code_exec_options() {
  OptionSpec interpreter = any_option("interpreter",
                                      "argv the program runs with, its file appended (a name is looked up in "
                                      "/usr/local/bin, /usr/bin, /bin inside the sandbox)")
                               .checked_by(check_interpreter);
  interpreter.default_value = Json::array({"python3"});
  OptionSpec paths = any_option("read_only_paths", "host paths the sandbox sees, read-only").checked_by(check_paths);
  paths.default_value = SandboxOptions{}.read_only_paths;
  return {
      std::move(interpreter),
      float_option("cpu_s", 5.0, "CPU seconds per process (RLIMIT_CPU)").range(0.01, 86400),
      float_option("timeout_s", 10.0, "wall-clock deadline of one run (the asserts, or one case)").range(0.01, 86400),
      int_option("memory_mb", 512, "address space per process, MiB (RLIMIT_AS)").range(16, 1 << 20),
      int_option("processes", 16, "processes the program may have at once (RLIMIT_NPROC)").range(1, 4096),
      int_option("file_size_mb", 16, "largest file it may write, MiB (RLIMIT_FSIZE)").range(1, 1 << 20),
      int_option("open_files", 64, "open file descriptors per process (RLIMIT_NOFILE)").range(4, 1 << 20),
      int_option("scratch_mb", 64, "size of its scratch directory /tmp (tmpfs), MiB").range(1, 1 << 20),
      int_option("max_output_bytes", 1 << 20, "per stream; a program that writes more is killed").range(1024, 1 << 30),
      std::move(paths)};
}

// Bounds and checks of the given options (resolve_options has checked their types).
Status check_options(const std::string& who, const Json& options) {
  for (const auto& o : code_exec_options()) {
    const Json& v = options[o.key];
    std::string what = o.check ? o.check(v) : "";
    if (what.empty() && v.is_number() && ((o.min && v.get<double>() < *o.min) || (o.max && v.get<double>() > *o.max)))
      what = fmt::format("must be in [{}, {}] (got {})", *o.min, *o.max, v.dump());
    if (!what.empty()) return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: {} {}", who, o.key, what));
  }
  return ok();
}

Result<std::unique_ptr<RewardModule>> make(const RewardSpec& s) {
  const std::string who = fmt::format("reward '{}' (code_exec)", s.name);
  const Json& j = s.options;
  ARLO_TRY(check_options(who, j));
  SandboxOptions o;
  o.limits.cpu_s = j["cpu_s"].get<double>();
  o.limits.timeout_s = j["timeout_s"].get<double>();
  o.limits.memory_mb = j["memory_mb"].get<std::int64_t>();
  o.limits.processes = j["processes"].get<std::int64_t>();
  o.limits.file_size_mb = j["file_size_mb"].get<std::int64_t>();
  o.limits.open_files = j["open_files"].get<std::int64_t>();
  o.limits.scratch_mb = j["scratch_mb"].get<std::int64_t>();
  o.limits.max_output_bytes = j["max_output_bytes"].get<std::int64_t>();
  o.read_only_paths = j["read_only_paths"].get<std::vector<std::string>>();
  const auto interpreter = j["interpreter"].get<std::vector<std::string>>();
  ARLO_TRY(check_found(who, interpreter[0]));
  auto sandbox = Sandbox::create(std::move(o));
  if (!sandbox) return std::unexpected(Error(sandbox.error()).with_context(who));
  return std::make_unique<CodeExec>(s.name, std::move(*sandbox), interpreter);
}

}  // namespace

RewardKind code_exec_reward() {
  return {"code_exec", "the fraction of the task's tests (info.asserts, info.cases) the program passes, sandboxed",
          code_exec_options(), true, make};
}

}  // namespace arlo::rollout
