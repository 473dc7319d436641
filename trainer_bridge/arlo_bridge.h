/* arlo trainer bridge: the C ABI of libarlo_bridge.so, for trainers written in anything.
 *
 * A trainer connects, waits for batches, acknowledges each one after its optimizer step, and
 * publishes its new weights (sent through arlo's weight_sync, then announced to the orchestrator).
 *
 *   arlo_bridge* b = NULL;
 *   if (arlo_bridge_connect("{\"transport\":\"dir\",\"run_dir\":\"/runs/x\",\"rank\":0,"
 *                           "\"weight_sync\":{\"transport\":\"filesystem\",\"dir\":\"/runs/x/weights\"}}",
 *                           &b) != ARLO_OK) { fprintf(stderr, "%s\n", arlo_bridge_last_error()); }
 *   arlo_bridge_publish(b, 0, params, n_params, 60000);          // v0: the initial weights
 *   for (;;) {
 *     arlo_batch* batch = NULL;
 *     arlo_status s = arlo_bridge_next_batch(b, 60000, &batch);  // ARLO_TIMEOUT: nothing yet
 *     if (s != ARLO_OK) ...;
 *     ... train on batch->tensors[i] (see trainer_bridge/batch.h for the schema) ...
 *     arlo_bridge_ack(b, batch->step);
 *     arlo_batch_release(batch);
 *     arlo_bridge_publish(b, batch_step, params, n_params, 60000);
 *   }
 *   arlo_bridge_close(b);
 *
 * Contracts
 * - Every call returns a status; on failure arlo_bridge_last_error() returns a message saying what
 *   went wrong and what to do. The message is per thread and stays valid until this thread's next
 *   call into the library.
 * - Thread-safe: calls on one bridge may come from several threads. arlo_bridge_close wakes a thread
 *   blocked in next_batch (which returns ARLO_CANCELLED), waits for calls in progress to return, and
 *   frees the bridge; no call may start on it after close began.
 * - A batch's tensor views stay valid until arlo_batch_release, even after arlo_bridge_close.
 * - next_batch returns the oldest unacknowledged step again until it is acknowledged, so a trainer
 *   that crashes mid-step sees the same batch after it restarts; pass "start_after_step" (the last
 *   step in the trainer's checkpoint) in the config so steps already applied are never trained twice.
 *
 * Config JSON keys: transport ("dir" | "socket"), run_dir (dir), host (socket: the orchestrator's
 * IP address or host name, resolved on every connection attempt), port (socket), rank,
 * start_after_step, heartbeat_interval_ms, heartbeat_timeout_ms, weight_sync (object: the
 * weight-sync block of docs/weight-sync.md, e.g. {"transport": "tcp", "address": "0.0.0.0:0",
 * "expected_receivers": 2}; a trainer that arlo run starts finds it in $ARLO_WEIGHT_SYNC).
 */
#ifndef ARLO_TRAINER_BRIDGE_ARLO_BRIDGE_H_
#define ARLO_TRAINER_BRIDGE_ARLO_BRIDGE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ARLO_BRIDGE_ABI_VERSION 2

typedef enum arlo_status {
  ARLO_OK = 0,
  ARLO_INVALID_ARGUMENT = 1,
  ARLO_PARSE = 2,
  ARLO_NOT_FOUND = 3,
  ARLO_IO = 4,
  ARLO_TIMEOUT = 5,
  ARLO_CANCELLED = 6,
  ARLO_MISMATCH = 7,
  ARLO_UNAVAILABLE = 8,
  ARLO_RESOURCE_EXHAUSTED = 9,
  ARLO_INTERNAL = 10
} arlo_status;

/* Element types, as safetensors names them. */
typedef enum arlo_dtype {
  ARLO_F64 = 0,
  ARLO_F32 = 1,
  ARLO_F16 = 2,
  ARLO_BF16 = 3,
  ARLO_F8_E4M3 = 4,
  ARLO_F8_E5M2 = 5,
  ARLO_I64 = 6,
  ARLO_I32 = 7,
  ARLO_I16 = 8,
  ARLO_I8 = 9,
  ARLO_U8 = 10,
  ARLO_BOOL = 11
} arlo_dtype;

/* A borrowed, C-contiguous host tensor. */
typedef struct arlo_tensor {
  const char* name;
  int32_t dtype; /* arlo_dtype */
  int32_t ndim;
  const int64_t* shape;
  const void* data;
  uint64_t nbytes;
} arlo_tensor;

typedef struct arlo_batch {
  int64_t step;
  int32_t rank;
  int32_t num_ranks;
  int32_t rows;
  int32_t seq_len;
  size_t num_tensors;
  const arlo_tensor* tensors; /* input_ids, position_ids, loss_mask, ... (batch.h) */
  const char* metadata_json;  /* the batch metadata as a JSON object of strings */
  void* internal_;            /* owned by the library */
} arlo_batch;

typedef struct arlo_bridge arlo_bridge;

int arlo_bridge_abi_version(void);
const char* arlo_bridge_last_error(void);

arlo_status arlo_bridge_connect(const char* config_json, arlo_bridge** out);
/* Waits up to timeout_ms (< 0: forever) for the next unacknowledged batch of this rank. */
arlo_status arlo_bridge_next_batch(arlo_bridge* bridge, int64_t timeout_ms, arlo_batch** out);
arlo_status arlo_batch_release(arlo_batch* batch);
/* Looks a tensor up by name; NULL when absent (ce_weights is optional). */
const arlo_tensor* arlo_batch_tensor(const arlo_batch* batch, const char* name);
arlo_status arlo_bridge_ack(arlo_bridge* bridge, int64_t step);
/* Stages `version` of the given host tensors in weight_sync's staging publisher (one copy: the
 * tensors are read during the call only); the version is then announced to the orchestrator and
 * served to the workers in the background (filesystem: written, then announced). The call then
 * waits up to timeout_ms (< 0: forever; 0: not at all) until the version is published (filesystem:
 * written and announced; streaming: announced, which needs no receiver): ARLO_TIMEOUT when it is
 * not by then (it stays staged and is published later). A version that could not be published
 * (e.g. a full disk, or its announcement failed) fails this call, or the next one when it was not
 * waited for, with the reason, and every later call: the orchestrator would wait for it in vain,
 * so the trainer should stop. The first publish fixes the tensor names, dtypes and shapes for the
 * session; arlo_bridge_close publishes the last staged version before it returns (and fails,
 * the bridge closed all the same, when it could not). */
arlo_status arlo_bridge_publish(arlo_bridge* bridge, int64_t version, const arlo_tensor* tensors, size_t num_tensors,
                                int64_t timeout_ms);
/* Only announces `version` (weights moved by other means); info_json may be NULL. */
arlo_status arlo_bridge_announce(arlo_bridge* bridge, int64_t version, const char* info_json);
arlo_status arlo_bridge_heartbeat(arlo_bridge* bridge);
int64_t arlo_bridge_last_acked_step(const arlo_bridge* bridge);
arlo_status arlo_bridge_close(arlo_bridge* bridge);

/* ---- The receive side: what an inference server links to take arlo's weight stream ----
 *
 * The counterpart of arlo_bridge_publish, for an inference engine that is not arlo-worker (the vLLM
 * plugin, python/arlo_vllm, uses it): a receiver pulls versions over any weight_sync transport (tcp,
 * star or chain; shm; filesystem), with every payload (full, bf16, fp8, delta) and every bucket's
 * checksum verified, and holds the newest one in host memory for the engine to load.
 *
 *   arlo_receiver* r = NULL;
 *   arlo_receiver_open("{\"transport\":\"tcp\",\"address\":\"10.0.0.5:29500\"}", &r);
 *   int64_t v = -1;
 *   arlo_receiver_receive(r, 60000, &v);       // the next version newer than the one held
 *   const arlo_tensor* t; size_t n;
 *   arlo_receiver_tensors(r, &t, &n);          // load t[0..n) into the engine
 *   arlo_receiver_close(r);
 *
 * The block is weight_sync's receiver block (docs/weight-sync.md): "transport", the trainer's
 * announced endpoint keys (tcp "address", shm "shm_name", filesystem "dir"), and optional shared keys
 * (timeout_ms, bucket_timeout_ms, relay and, when relaying, the transport's listen keys, apply_mode,
 * peer_name). A version is held only once every bucket verified; a failed receive keeps the version
 * held before it. The tensors are the newest version in the publisher's order, with its names, dtypes
 * and shapes; they stay valid until the next receive or close. One thread at a time per receiver. */
typedef struct arlo_receiver arlo_receiver;

arlo_status arlo_receiver_open(const char* block_json, arlo_receiver** out);
/* Waits up to timeout_ms (< 0: forever) for a version newer than the one held and receives it;
 * *version_out (may be NULL) is then the version held. */
arlo_status arlo_receiver_receive(arlo_receiver* receiver, int64_t timeout_ms, int64_t* version_out);
/* The version held, -1 before the first receive. */
int64_t arlo_receiver_version(const arlo_receiver* receiver);
arlo_status arlo_receiver_tensors(const arlo_receiver* receiver, const arlo_tensor** tensors, size_t* num_tensors);
/* The last successful receive as a JSON object: version, payload, wire_bytes, buckets,
 * retried_buckets, path ("tcp", "shm direct read", ...), seconds, and checksum (16 hex digits, the
 * definition of the trainer's announcement). "{}" before the first. Valid until the next call. */
const char* arlo_receiver_report(const arlo_receiver* receiver);
arlo_status arlo_receiver_close(arlo_receiver* receiver);

#ifdef __cplusplus
}
#endif

#endif /* ARLO_TRAINER_BRIDGE_ARLO_BRIDGE_H_ */
