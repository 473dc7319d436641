/* A minimal trainer in C on libarlo_bridge.so, for the restart tests. It "trains" a step by
 * appending "trained <step>" to its log (its checkpoint: a restart resumes after the last line),
 * then acks the step and announces version <step>.
 *
 *   arlo_bridge_test_trainer <config-json> <log> <last-step> [<die-at-step>]
 *
 * With die-at-step it kills itself (SIGKILL) right after receiving that step, before training it:
 * a crash mid-batch. Exits 0 after acking last-step. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer_bridge/arlo_bridge.h"

static long long last_trained(const char* log) {
  FILE* f = fopen(log, "r");
  long long step = 0, s = 0;
  if (!f) return 0;
  while (fscanf(f, "trained %lld\n", &s) == 1) step = s;
  fclose(f);
  return step;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s <config-json> <log> <last-step> [<die-at-step>]\n", argv[0]);
    return 2;
  }
  const char* log = argv[2];
  const long long last = atoll(argv[3]);
  const long long die_at = argc > 4 ? atoll(argv[4]) : -1;
  const long long resume = last_trained(log);

  char config[4096];
  /* The config arrives without start_after_step; add the checkpoint's step. */
  const size_t n = strlen(argv[1]);
  if (n < 2 || n > sizeof(config) - 64 || argv[1][n - 1] != '}') return 2;
  snprintf(config, sizeof(config), "%.*s,\"start_after_step\":%lld}", (int)(n - 1), argv[1], resume);

  arlo_bridge* b = NULL;
  if (arlo_bridge_connect(config, &b) != ARLO_OK) {
    fprintf(stderr, "connect: %s\n", arlo_bridge_last_error());
    return 1;
  }
  if (resume == 0 && arlo_bridge_announce(b, 0, "{\"note\":\"initial weights\"}") != ARLO_OK) return 1;
  for (;;) {
    arlo_batch* batch = NULL;
    arlo_status s = arlo_bridge_next_batch(b, 60000, &batch);
    if (s != ARLO_OK) {
      fprintf(stderr, "next_batch: %d %s\n", (int)s, arlo_bridge_last_error());
      return 1;
    }
    const long long step = batch->step;
    if (step == die_at) raise(SIGKILL);
    const arlo_tensor* ids = arlo_batch_tensor(batch, "input_ids");
    const arlo_tensor* mask = arlo_batch_tensor(batch, "loss_mask");
    if (ids == NULL || mask == NULL || ids->dtype != ARLO_I32 || ids->ndim != 2 || ids->shape[1] != batch->seq_len) {
      fprintf(stderr, "batch %lld: unexpected tensors\n", step);
      return 1;
    }
    FILE* f = fopen(log, "a");
    if (!f) return 1;
    fprintf(f, "trained %lld\n", step);
    fflush(f);
    fsync(fileno(f));
    fclose(f);
    if (arlo_bridge_ack(b, step) != ARLO_OK) return 1;
    arlo_batch_release(batch);
    if (arlo_bridge_announce(b, step, NULL) != ARLO_OK) return 1;
    if (step >= last) break;
  }
  arlo_bridge_close(b);
  return 0;
}
