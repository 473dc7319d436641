/* arlo reward plugin ABI, version 1.
 *
 * A reward plugin is a shared library that exports ONE C function:
 *
 *     const arlo_reward_plugin* arlo_reward_plugin_entry(uint32_t host_abi_version);
 *
 * arlo dlopen()s the library, calls the entry point with the ABI version it was built with, and
 * checks the returned table's abi_version. A plugin may return NULL when it cannot serve the host's
 * version; arlo then reports a clear error naming both versions.
 *
 * Lifetime and threading contract:
 *   - create() is called once per configured module with the module's config string (often JSON);
 *     it returns an opaque instance, or NULL and writes a message into `error`.
 *   - score() may be called CONCURRENTLY from several arlo threads on the same instance: make it
 *     thread-safe (or guard it yourself). It must not keep pointers into `input` after it returns.
 *   - A score() call that overruns its timeout is abandoned: arlo stops waiting and applies its
 *     failure policy, but cannot stop the thread. The instance and the library stay loaded while
 *     any call is still running, so a late return is harmless.
 *   - destroy() is called once, after every score() call on the instance has returned.
 *   - Return non-finite rewards (NaN, inf) and arlo treats the sample as failed.
 *   - Do not let C++ exceptions escape if you can avoid it; arlo catches them, but only C++ ones.
 *
 * All strings are NUL-terminated UTF-8. This header is C89-compatible and has no dependencies.
 */
#ifndef ARLO_REWARD_PLUGIN_H
#define ARLO_REWARD_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ARLO_REWARD_PLUGIN_ABI_VERSION 1u
#define ARLO_REWARD_PLUGIN_ENTRY_SYMBOL "arlo_reward_plugin_entry"
#define ARLO_REWARD_MAX_METRICS 16
#define ARLO_REWARD_METRIC_NAME_SIZE 64
#define ARLO_REWARD_ERROR_SIZE 512

/* One finished sample and the task it answers. Pointers are valid only during the call. */
typedef struct arlo_reward_input {
  uint32_t struct_size; /* sizeof(arlo_reward_input) as the host knows it */
  const char* task_id;
  const char* prompt;               /* the prompt text (chat messages rendered "role: content") */
  const char* answer;               /* reference answer, "" when none */
  const char* info_json;            /* the task's free-form info, as a JSON object */
  const char* completion;           /* the generated text */
  const int32_t* completion_tokens; /* generated token ids */
  size_t num_completion_tokens;
  const char* finish_reason; /* "stop" | "length" | "abort" | "error" | "unknown" */
  int32_t sample_index;      /* index within its prompt group */
} arlo_reward_input;

typedef struct arlo_reward_metric {
  char name[ARLO_REWARD_METRIC_NAME_SIZE];
  double value;
} arlo_reward_metric;

/* Zero-initialised by the host before each call. */
typedef struct arlo_reward_output {
  double reward;
  uint32_t num_metrics; /* <= ARLO_REWARD_MAX_METRICS */
  arlo_reward_metric metrics[ARLO_REWARD_MAX_METRICS];
  char error[ARLO_REWARD_ERROR_SIZE]; /* message when score() returns nonzero */
} arlo_reward_output;

typedef struct arlo_reward_plugin {
  uint32_t abi_version; /* must be ARLO_REWARD_PLUGIN_ABI_VERSION from the header you built with */
  uint32_t struct_size; /* sizeof(arlo_reward_plugin) */
  const char* name;     /* short name used in metrics: "<name>/<metric>" */
  void* (*create)(const char* config, char* error, size_t error_size);
  void (*destroy)(void* instance);
  /* 0 on success; nonzero on failure with a message in out->error. */
  int (*score)(void* instance, const arlo_reward_input* input, arlo_reward_output* out);
} arlo_reward_plugin;

typedef const arlo_reward_plugin* (*arlo_reward_plugin_entry_fn)(uint32_t host_abi_version);

#ifdef __cplusplus
}
#endif

#endif /* ARLO_REWARD_PLUGIN_H */
