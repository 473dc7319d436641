#include "rollout/reward_plugin_loader.h"

#include <dlfcn.h>

#include <cstring>

#include <fmt/format.h>

#include "arlo/reward_plugin.h"

namespace arlo::rollout {
namespace {

// Closes the library when the last user is gone.
struct Library {
  void* handle = nullptr;
  ~Library() {
    if (handle) dlclose(handle);
  }
};

// Destroys the plugin instance (before its library is closed: it holds the library).
struct Instance {
  std::shared_ptr<Library> library;
  const arlo_reward_plugin* table = nullptr;
  void* instance = nullptr;
  ~Instance() {
    if (table && instance) table->destroy(instance);
  }
};

class PluginModule : public RewardModule {
 public:
  PluginModule(std::string name, std::shared_ptr<Instance> instance)
      : name_(std::move(name)), instance_(std::move(instance)) {}
  const std::string& name() const override { return name_; }

  Result<Score> score(const Task& task, const Rollout& r) override {
    // Keep the instance alive for the duration of this call even if the module is destroyed
    // meanwhile (an abandoned, hung call outlives its scorer).
    std::shared_ptr<Instance> inst = instance_;
    const std::string prompt = task.prompt_text();
    const std::string info = task.info.dump();
    const std::string finish(to_string(r.finish_reason));
    arlo_reward_input in{};
    in.struct_size = sizeof(arlo_reward_input);
    in.task_id = task.id.c_str();
    in.prompt = prompt.c_str();
    in.answer = task.answer.c_str();
    in.info_json = info.c_str();
    in.completion = r.text.c_str();
    in.completion_tokens = r.completion_tokens.data();
    in.num_completion_tokens = r.completion_tokens.size();
    in.finish_reason = finish.c_str();
    in.sample_index = r.sample_index;
    arlo_reward_output out{};
    int rc = 0;
    try {
      rc = inst->table->score(inst->instance, &in, &out);
    } catch (const std::exception& e) {
      return make_error(ErrorCode::kInternal, fmt::format("plugin '{}' threw: {}", name_, e.what()));
    } catch (...) {
      return make_error(ErrorCode::kInternal, fmt::format("plugin '{}' threw a non-standard exception", name_));
    }
    out.error[ARLO_REWARD_ERROR_SIZE - 1] = '\0';
    if (rc != 0)
      return make_error(ErrorCode::kInternal, fmt::format("plugin '{}' failed (code {}): {}", name_, rc,
                                                          out.error[0] ? out.error : "no message"));
    Score s;
    s.reward = out.reward;
    const uint32_t n = std::min<uint32_t>(out.num_metrics, ARLO_REWARD_MAX_METRICS);
    for (uint32_t i = 0; i < n; ++i) {
      out.metrics[i].name[ARLO_REWARD_METRIC_NAME_SIZE - 1] = '\0';
      s.metrics[out.metrics[i].name] = out.metrics[i].value;
    }
    return s;
  }

 private:
  std::string name_;
  std::shared_ptr<Instance> instance_;
};

}  // namespace

Result<PluginIsolation> parse_plugin_isolation(std::string_view name) {
  if (name == "none") return PluginIsolation::kNone;
  if (name == "process") return PluginIsolation::kProcess;
  return make_error(ErrorCode::kInvalidArgument, fmt::format("reward plugin isolate '{}': use none or process", name));
}

Result<std::unique_ptr<RewardModule>> load_reward_plugin(const std::string& path, const std::string& config,
                                                         std::optional<std::string> name, PluginOptions options) {
  if (options.isolate == PluginIsolation::kProcess)
    return load_isolated_reward_plugin(path, config, std::move(name), std::move(options.host));
  auto lib = std::make_shared<Library>();
  lib->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle) {
    const char* err = dlerror();
    return make_error(ErrorCode::kNotFound, fmt::format("reward plugin {}: cannot load: {} (check the path and that it "
                                                        "was built for this platform)",
                                                        path, err ? err : "unknown error"));
  }
  dlerror();
  void* sym = dlsym(lib->handle, ARLO_REWARD_PLUGIN_ENTRY_SYMBOL);
  if (!sym)
    return make_error(ErrorCode::kNotFound,
                      fmt::format("reward plugin {}: no entry point '{}' (export it with extern \"C\"; see "
                                  "docs/reward-modules.md)",
                                  path, ARLO_REWARD_PLUGIN_ENTRY_SYMBOL));
  auto entry = reinterpret_cast<arlo_reward_plugin_entry_fn>(sym);
  const arlo_reward_plugin* table = nullptr;
  try {
    table = entry(ARLO_REWARD_PLUGIN_ABI_VERSION);
  } catch (...) {
    return make_error(ErrorCode::kInternal, fmt::format("reward plugin {}: entry point threw", path));
  }
  if (!table)
    return make_error(ErrorCode::kMismatch,
                      fmt::format("reward plugin {}: does not support reward plugin ABI version {} (the version of "
                                  "this arlo); rebuild it against this arlo's include/arlo/reward_plugin.h",
                                  path, ARLO_REWARD_PLUGIN_ABI_VERSION));
  if (table->abi_version != ARLO_REWARD_PLUGIN_ABI_VERSION)
    return make_error(ErrorCode::kMismatch,
                      fmt::format("reward plugin {}: built for reward plugin ABI version {}, but this arlo speaks "
                                  "version {}; rebuild it against this arlo's include/arlo/reward_plugin.h",
                                  path, table->abi_version, ARLO_REWARD_PLUGIN_ABI_VERSION));
  if (table->struct_size < sizeof(arlo_reward_plugin) || !table->create || !table->destroy || !table->score)
    return make_error(
        ErrorCode::kMismatch,
        fmt::format("reward plugin {}: incomplete function table (create, destroy and score are required)", path));
  char error[ARLO_REWARD_ERROR_SIZE] = {0};
  void* instance = nullptr;
  try {
    instance = table->create(config.c_str(), error, sizeof(error));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("reward plugin {}: create() threw: {}", path, e.what()));
  } catch (...) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("reward plugin {}: create() threw", path));
  }
  error[sizeof(error) - 1] = '\0';
  if (!instance)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("reward plugin {}: create() rejected the config: {}",
                                                               path, error[0] ? error : "no message"));
  auto inst = std::make_shared<Instance>();
  inst->library = lib;
  inst->table = table;
  inst->instance = instance;
  std::string module_name = name ? *name : (table->name && table->name[0] ? table->name : "plugin");
  return std::unique_ptr<RewardModule>(std::make_unique<PluginModule>(std::move(module_name), std::move(inst)));
}

}  // namespace arlo::rollout
