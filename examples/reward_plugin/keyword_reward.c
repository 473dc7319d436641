/* Example arlo reward plugin in plain C: rewards completions that contain a keyword.
 *
 * Config string: "keyword=<text>" (required) and optionally ";bonus=<number>" added when the
 * completion also stopped on its own (finish_reason "stop"). An empty keyword means "use the task's
 * answer as the keyword". Metrics: "found" (0/1) and "chars" (completion length).
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

static void* kw_create(const char* config, char* error, size_t error_size) {
  const char* kw;
  const char* end;
  size_t len;
  keyword_reward* self;
  if (!config || strncmp(config, "keyword=", 8) != 0) {
    snprintf(error, error_size, "config must start with 'keyword=' (got '%s')", config ? config : "");
    return NULL;
  }
  kw = config + 8;
  end = strchr(kw, ';');
  len = end ? (size_t)(end - kw) : strlen(kw);
  if (len >= sizeof(self->keyword)) {
    snprintf(error, error_size, "keyword longer than %zu bytes", sizeof(self->keyword) - 1);
    return NULL;
  }
  self = (keyword_reward*)calloc(1, sizeof(keyword_reward));
  if (!self) {
    snprintf(error, error_size, "out of memory");
    return NULL;
  }
  memcpy(self->keyword, kw, len);
  self->keyword[len] = '\0';
  if (end && strncmp(end, ";bonus=", 7) == 0) self->bonus = strtod(end + 7, NULL);
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
