#!/usr/bin/env python3
"""Writes the seed corpora of the network and file fuzz targets into corpus/<target>/ (run from
anywhere; the files are committed, so this is only needed to change them). Each seed is a small,
well-formed instance of what the target parses, so the fuzzer starts from inputs that get deep."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def j(obj):
    return json.dumps(obj, separators=(",", ":"))


SEP = b"\n--next--\n"

# ---- manifest.json
tensors = [{"name": "embed.weight", "dtype": "F32", "shape": [4, 8]},
           {"name": "layers.0.norm", "dtype": "BF16", "shape": [8]},
           {"name": "scalar", "dtype": "F32", "shape": []}]
base = {"format": "arlo-weight-sync/1", "version": 3, "payload": "full", "zstd": False,
        "delta_density_threshold": 0.25, "bucket_bytes": 1 << 20, "total_bytes": 4 * 32 + 2 * 8 + 4,
        "tensors": tensors, "buckets": [[[0, 0, 32], [1, 0, 8], [2, 0, 1]]], "checksums": [12345]}
write("manifest_fuzz", "full", j(base))
write("manifest_fuzz", "delta", j(dict(base, payload="delta", base_version=2, zstd=True)))
write("manifest_fuzz", "split", j(dict(base, tensors=[tensors[0]], total_bytes=128,
                                       buckets=[[[0, 0, 16]], [[0, 16, 16]]], checksums=[1, 2])))
write("manifest_fuzz", "fp8_no_checksums", j(dict(base, payload="fp8", checksums=[])))
write("manifest_fuzz", "empty", j(dict(base, tensors=[], total_bytes=0, buckets=[], checksums=[])))
write("manifest_fuzz", "wrong_format", j(dict(base, format="other/2")))
# The threshold's old key name, read for one release (a trainer of the previous release writes it).
old_key = {k: v for k, v in base.items() if k != "delta_density_threshold"}
write("manifest_fuzz", "old_threshold_key", j(dict(old_key, delta_dense_threshold=0.25)))

# ---- batch files: one rank, 2 rows of 8 tokens, two samples in row 0, one in row 1.
def safetensors(tensors, metadata):
    header = {"__metadata__": metadata}
    blob = b""
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def batch(with_ce=False, step=7):
    L, rows = 8, 2
    seqs = [[3, 2], [5]]  # segment lengths per row
    ids, pos, mask, adv, lp, ver, sid = [], [], [], [], [], [], []
    sample = 0
    for row in seqs:
        used = 0
        for n in row:
            for k in range(n):
                ids.append(9 + k); pos.append(k); mask.append(1 if k >= 1 else 0)
                adv.append(0.5 if k >= 1 else 0.0); lp.append(-0.25 if k >= 1 else 0.0)
                ver.append(1 if k >= 1 else -1); sid.append(sample)
            sample += 1
            used += n
        for _ in range(L - used):
            ids.append(0); pos.append(0); mask.append(0); adv.append(0.0); lp.append(0.0); ver.append(-1); sid.append(-1)
    segs = [3, 2, 5, 0]
    t = [("input_ids", "I32", [rows, L], struct.pack(f"<{rows*L}i", *ids)),
         ("position_ids", "I32", [rows, L], struct.pack(f"<{rows*L}i", *pos)),
         ("loss_mask", "U8", [rows, L], bytes(mask)),
         ("advantages", "F32", [rows, L], struct.pack(f"<{rows*L}f", *adv)),
         ("inference_logprobs", "F32", [rows, L], struct.pack(f"<{rows*L}f", *lp)),
         ("token_versions", "I32", [rows, L], struct.pack(f"<{rows*L}i", *ver)),
         ("seq_lens", "I32", [rows, 2], struct.pack("<4i", *segs)),
         ("sample_ids", "I32", [rows, L], struct.pack(f"<{rows*L}i", *sid))]
    if with_ce:
        t.append(("ce_weights", "F32", [rows, L], struct.pack(f"<{rows*L}f", *[1.0] * (rows * L))))
    meta = {"arlo.schema_version": "1", "step": str(step), "rank": "0", "num_ranks": "2", "seq_len": str(L),
            "samples": "3", "tokens": "10", "loss_tokens": "7", "step_samples": "5", "step_tokens": "16",
            "step_loss_tokens": "11", "policy_version_min": "1", "policy_version_mean": "1.0",
            "policy_version_max": "1", "truncated": "0", "rejected": "0"}
    return safetensors(t, meta)


write("batch_fuzz", "two_rows", batch())
write("batch_fuzz", "ce_weights", batch(with_ce=True))
write("batch_fuzz", "truncated", batch()[:-5])

# ---- OpenAI requests (the worker's bodies)
for name, body in {
        "prompt_text": {"model": "m", "prompt": "What is 2+3?", "max_tokens": 8, "temperature": 0.7, "seed": 5},
        "prompt_ids": {"prompt": [1, 9, 10, 11], "n": 2, "logprobs": 0, "stop": ["\n", "."], "top_p": 0.9},
        "prompt_list": {"prompt": ["a", [1, 2, 3]], "best_of": 1, "ignore_eos": True, "echo": False, "suffix": None},
        "chat": {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                 "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 2},
        "chat_parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "stream": False},
        "bad_types": {"prompt": "x", "stream": "yes", "max_tokens": "8"},
}.items():
    write("openai_request_fuzz", name, j(body))

# ---- OpenAI responses (arlo-worker, vLLM, SGLang)
write("openai_response_fuzz", "arlo_completion", j({
    "id": "cmpl-1", "object": "text_completion", "model": "m", "prompt_token_ids": [1, 9, 10],
    "choices": [{"index": 0, "text": "ab", "finish_reason": "stop", "token_ids": [9, 10, 2],
                 "logprobs": {"tokens": ["a", "b", ""], "token_logprobs": [-0.1, -0.2, -0.3]},
                 "version_spans": [[3, 0], [4, 2]], "stop_reason": None}]}))
write("openai_response_fuzz", "vllm_chat", j({
    "id": "chat-1", "model": "m", "prompt_token_ids": [1, 5, 9],
    "choices": [{"index": 1, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length",
                 "token_ids": [9, 9], "logprobs": {"content": [{"token": "x", "logprob": -1.5}, {"token": "x", "logprob": -0.5}]}},
                {"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "abort", "token_ids": []}],
    "version": 7}))
write("openai_response_fuzz", "sglang_meta", j({
    "choices": [{"index": 0, "message": {"content": "y"}, "prompt_token_ids": [1, 2],
                 "meta_info": {"output_token_logprobs": [[-0.1, 5, "a"], [-0.2, 6, "b"]]},
                 "version_spans": [{"version": 1, "first_token": 0}]}]}))
write("openai_response_fuzz", "error", j({"error": {"message": "overloaded", "code": 503}}))

# ---- Environment protocol replies (rollout/multi_turn.h): /reset and /step
write("env_message_fuzz", "reset", j({"messages": [{"role": "user", "content": "guess: "}],
                                      "state": {"secret": 37, "guesses": 0}}))
write("env_message_fuzz", "step", j({"messages": [{"role": "tool", "content": "=102\n12+34+56="}], "done": False,
                                     "reward": None, "state": {"calls": 1}}))
write("env_message_fuzz", "step_done", j({"messages": [], "done": True, "reward": 0.8, "state": [1, "x", None]}))
write("env_message_fuzz", "null_content", j({"messages": [{"role": "assistant", "content": None}], "done": False}))
write("env_message_fuzz", "wrong_types", j({"messages": {"role": 1}, "done": "yes", "reward": "1"}))
write("env_message_fuzz", "not_utf8", b'{"done": false, "messages": [{"role": "user", "content": "\xc3\x28"}]}')

# ---- HTTP requests
write("http_request_fuzz", "get_query", b"GET /?mode=keep&x=%41+b&flag HTTP/1.1\r\nHost: a\r\n\r\n")
write("http_request_fuzz", "post_json", b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
      b"Content-Length: 15\r\n\r\n{\"prompt\":\"hi\"}")
write("http_request_fuzz", "chunked", b"POST /weights/update HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
      b"4\r\nabcd\r\n0\r\n\r\n")
write("http_request_fuzz", "keep_alive_two", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
      b"HEAD /a%20b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
write("http_request_fuzz", "expect_continue", b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc")
write("http_request_fuzz", "too_large", b"POST / HTTP/1.1\r\nContent-Length: 99999\r\n\r\nab")
write("http_request_fuzz", "http10_two_conns", b"GET /nowhere HTTP/1.0\r\n\r\n" + SEP + b"DELETE / HTTP/1.1\r\n\r\n")
write("http_request_fuzz", "bad_method", b"BREW / HTTP/1.1\r\n\r\n")

# ---- bridge frames (trainer -> orchestrator): [u8 type][u64 LE length][JSON]
def frame(t, body):
    p = body if isinstance(body, bytes) else j(body).encode()
    return bytes([t]) + struct.pack("<Q", len(p)) + p


HELLO, ACK, VERSION, HEARTBEAT = 1, 4, 5, 6
write("bridge_frame_fuzz", "hello_ack", frame(HELLO, {"rank": 0, "last_acked_step": 0, "protocol": 1}) +
      frame(ACK, {"step": 1}) + frame(HEARTBEAT, {"time_ms": 1000, "last_acked_step": 1}))
write("bridge_frame_fuzz", "two_ranks", frame(HELLO, {"rank": 0, "protocol": 1}) + frame(ACK, {"step": 1}) + SEP +
      frame(HELLO, {"rank": 1, "last_acked_step": 0, "version": 2, "info": {"dir": "/x"}}) + frame(ACK, {"step": 1}) +
      frame(VERSION, {"version": 3, "info": {}}))
write("bridge_frame_fuzz", "bad_rank", frame(HELLO, {"rank": 5}))
write("bridge_frame_fuzz", "reconnect", frame(HELLO, {"rank": 1}) + frame(VERSION, {"version": 1}) + SEP +
      frame(HELLO, {"rank": 1, "last_acked_step": 1}) + frame(9, {}) + frame(ACK, b"not json"))

# ---- tcp weight frames: FrameHeader {u32 magic, u32 type, u64 a, u64 b} then JSON (or bucket bytes)
MAGIC = 0x57534C41
def wframe(t, body=None, a=None, b=0):
    p = b"" if body is None else j(body).encode()
    return struct.pack("<IIQQ", MAGIC, t, len(p) if a is None else a, b) + p


W_HELLO, W_MANIFEST, W_ANSWER, W_BUCKET, W_DONE = 1, 2, 3, 4, 5
write("tcp_frame_fuzz", "hello", wframe(W_HELLO, {"peer": "worker-0", "version": 2, "resume": None}))
write("tcp_frame_fuzz", "hello_resume", wframe(W_HELLO, {"peer": "w", "version": None, "resume": {"version": 3, "bucket": 1}}))
write("tcp_frame_fuzz", "manifest_answer_bucket",
      wframe(W_MANIFEST, base) + wframe(W_ANSWER, {"state": "accepted", "error": "", "start": 0}) +
      wframe(W_BUCKET, a=0, b=16) + bytes(range(16)) + struct.pack("<Q", 99) + wframe(W_DONE, {"peers": []}))
write("tcp_frame_fuzz", "answer_need_full", wframe(W_ANSWER, {"state": "need_full", "error": "", "start": 0}))
write("tcp_frame_fuzz", "bad_magic", struct.pack("<IIQQ", 1, 1, 2, 0) + b"{}")

# ---- nccl TCPStore requests (torch's c10d wire protocol)
def s(x):
    x = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(x)) + x


VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)
write("nccl_store_fuzz", "current_set_get", VALIDATE + b"\x0d" + struct.pack("<I", 7) + b"\x01" + s("/k") + s("v") +
      b"\x06" + struct.pack("<Q", 1) + s("/k") + b"\x03" + s("/k") + b"\x04" + s("init/") + struct.pack("<q", 1))
write("nccl_store_fuzz", "current_multi", VALIDATE + b"\x0b" + struct.pack("<q", 2) + s("/a") + s("1") + s("/b") + s("2") +
      b"\x0a" + struct.pack("<Q", 2) + s("/a") + s("/b") + b"\x05" + struct.pack("<Q", 1) + s("/a") +
      b"\x07" + b"\x08" + s("/a") + b"\x09" + s("/b") + s("3") + b"\x02" + s("/b") + s("23") + s("4"))
write("nccl_store_fuzz", "current_wait_cancel", VALIDATE + b"\x06" + struct.pack("<Q", 1) + s("/missing") + b"\x0c")
write("nccl_store_fuzz", "legacy", b"\x00" + s("/k") + s("v") + b"\x02" + s("/k") + b"\x03" + s("/n") + struct.pack("<q", 5) +
      b"\x05" + struct.pack("<Q", 1) + s("/k") + b"\x06" + b"\x07" + s("/k"))
write("nccl_store_fuzz", "two_conns", VALIDATE + b"\x06" + struct.pack("<Q", 1) + s("/late") + SEP +
      VALIDATE + b"\x01" + s("/late") + s("x") + b"\x03" + s("/seeded"))
write("nccl_store_fuzz", "get_missing", VALIDATE + b"\x03" + s("/nope"))
