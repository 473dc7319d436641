"""Reads a W&B run file (run-<id>.wandb, the transaction log the wandb client writes, offline too)
back into wandb's own protobuf records (wandb.proto.wandb_internal_pb2.Record).

The file is W&B's 7-byte header (":W&B", the magic 0xBEE1, a version byte) followed by a LevelDB-style
log: 32 KiB blocks of chunks, each chunk a 7-byte header (masked CRC-32C, length, type: 1 full,
2 first, 3 middle, 4 last) and its bytes; a block's last < 7 bytes are padding.
"""

import struct

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(HEADER):
        raise ValueError(f"{path}: not a W&B run file (header {data[:7]!r})")
    pos, parts = len(HEADER), []
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zeroed tail (a preallocated or partly written block)
            pos += left_in_block
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        parts.append(chunk)
        if kind in (1, 4):  # full or last: a whole record
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(b"".join(parts))
            parts = []
            yield rec


def history(path):
    """The history rows (wandb.log calls) of a run file, each as a dict of key -> value."""
    import json

    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            yield {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
