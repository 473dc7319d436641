/* Example arlo reward plugin in plain C: rewards completions that contain a keyword.
 *
 * Config: the module's `config` mapping as JSON, {"keyword": "<text>", "bonus": <number>}, or the
 * string form "keyword=<text>;bonus=<number>". `bonus` is added when the completion also stopped on
 * its own (finish_reason "stop"). An empty or missing keyword means "use the task's answer".
 * Metrics: "found" (0/1) and "chars" (completion length).
 *
 * The JSON reading below handles only this flat shape, to keep the example dependency-free; a real
 * plugin should use a JSON library.
 *
 * Thread-safety: the instance is read-only after create(), so score() is safe to call concurrently.
 */
#include <arlo/reward_plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define EXPORT __attribute__((visibility("default")))
#else
#define EXPORT
#endif

typedef struct keyword_reward {
  char keyword[256];
  double bonus;
} keyword_reward;

/* Copies the string value of "key" in a flat JSON object into out (no escapes); 0 when absent. */
static int json_string(const char* json, const char* key, char* out, size_t out_size) {
  char pattern[64];
  const char* p;
  const char* end;
  snprintf(pattern, sizeof(pattern), "\"%s\"", key);
  p = strstr(json, pattern);
  if (!p) return 0;
  p = strchr(p + strlen(pattern), ':');
  if (!p) return 0;
  p = strchr(p, '"');
  if (!p) return 0;
  end = strchr(++p, '"');
  if (!end || (size_t)(end - p) >= out_size) return -1;
  memcpy(out, p, (size_t)(end - p));
  out[end - p] = '\0';
  return 1;
}

static double json_number(const char* json, const char* key) {
  char pattern[64];
  const char* p;
  snprintf(pattern, sizeof(pattern), "\"%s\"", key);
  p = strstr(json, pattern);
  if (!p) return 0.0;
  p = strchr(p + strlen(pattern), ':');
  return p ? strtod(p + 1, NULL) : 0.0;
}

static void* kw_create(const char* config, char* error, size_t error_size) {
  keyword_reward* self = (keyword_reward*)calloc(1, sizeof(keyword_reward));
  if (!self) {
    snprintf(error, error_size, "out of memory");
    return NULL;
  }
  if (!config) config = "";
  if (config[0] == '{') {
    if (json_string(config, "keyword", self->keyword, sizeof(self->keyword)) < 0) {
      snprintf(error, error_size, "keyword too long (at most %zu bytes)", sizeof(self->keyword) - 1);
      free(self);
      return NULL;
    }
    self->bonus = json_number(config, "bonus");
  } else if (strncmp(config, "keyword=", 8) == 0) {
    const char* kw = config + 8;
    const char* end = strchr(kw, ';');
    size_t len = end ? (size_t)(end - kw) : strlen(kw);
    if (len >= sizeof(self->keyword)) {
      snprintf(error, error_size, "keyword too long (at most %zu bytes)", sizeof(self->keyword) - 1);
      free(self);
      return NULL;
    }
    memcpy(self->keyword, kw, len);
    self->keyword[len] = '\0';
    if (end && strncmp(end, ";bonus=", 7) == 0) self->bonus = strtod(end + 7, NULL);
  } else if (config[0] != '\0') {
    snprintf(error, error_size, "config must be {\"keyword\": ..., \"bonus\": ...} or 'keyword=...;bonus=...' (got '%s')",
             config);
    free(self);
    return NULL;
  }
  return self;
}

static void kw_destroy(void* instance) { free(instance); }

static int kw_score(void* instance, const arlo_reward_input* in, arlo_reward_output* out) {
  const keyword_reward* self = (const keyword_reward*)instance;
  const char* keyword = self->keyword[0] ? self->keyword : in->answer;
  int found;
  if (!keyword || !keyword[0]) {
    snprintf(out->error, sizeof(out->error), "task %s has no answer to use as the keyword", in->task_id);
    return 1;
  }
  found = strstr(in->completion, keyword) != NULL;
  out->reward = found ? 1.0 : 0.0;
  if (found && strcmp(in->finish_reason, "stop") == 0) out->reward += self->bonus;
  out->num_metrics = 2;
  snprintf(out->metrics[0].name, sizeof(out->metrics[0].name), "found");
  out->metrics[0].value = found;
  snprintf(out->metrics[1].name, sizeof(out->metrics[1].name), "chars");
  out->metrics[1].value = (double)strlen(in->completion);
  return 0;
}

static const arlo_reward_plugin kPlugin = {
    ARLO_REWARD_PLUGIN_ABI_VERSION, sizeof(arlo_reward_plugin), "keyword", kw_create, kw_destroy, kw_score,
};

EXPORT const arlo_reward_plugin* arlo_reward_plugin_entry(uint32_t host_abi_version) {
  /* Serve only the ABI this plugin was compiled against; arlo reports the mismatch clearly. */
  return host_abi_version == ARLO_REWARD_PLUGIN_ABI_VERSION ? &kPlugin : NULL;
}
