#!/usr/bin/env python3
"""An independent safetensors reader and writer, written from the published format description
only (no arlo code, no safetensors package), used to check that arlo's files are readable by any
reader that follows the format, and that arlo reads files that another writer produced.

Format: 8-byte little-endian unsigned header length N; N bytes of UTF-8 JSON: an object mapping
tensor names to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional "__metadata__"
object of string to string; then the data section. Offsets are relative to the data section; the
tensors cover it exactly, without gaps or overlaps. Little-endian, row-major.

Usage:
  read_safetensors.py verify FILE SPEC   check FILE against SPEC and the value pattern
  read_safetensors.py write FILE SPEC    write FILE holding SPEC's tensors filled with the pattern

SPEC is a JSON file: {"tensors": [{"name", "dtype", "shape"}...], "metadata": {str: str}}.
The value pattern for flat element index i (shared with safetensors_python_test.cc):
  floats (F64 F32 F16 BF16 F8_E4M3 F8_E5M2): ((i % 16) - 8) * 0.5
  I64: ((i*37) % 251 - 125) * 1000000007     I32: ((i*37) % 251 - 125) * 1000003
  I16: ((i*37) % 251 - 125) * 211            I8:  (i*37) % 251 - 125
  U8:  (i*37) % 251 + 2                      BOOL: i % 3 == 0
Exit status 0 on success; 1 with a message on stderr otherwise.
"""
import json
import math
import struct
import sys

import numpy as np

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
ITEM_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
             "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
INT_NUMPY = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1"}
INT_SCALE = {"I64": 1000000007, "I32": 1000003, "I16": 211, "I8": 1}


class FormatError(Exception):
    pass


def fp8_table(exp_bits, man_bits, bias, e4m3fn):
    """Value of each of the 256 codes of an 8-bit float (NaN where the code is not a number)."""
    values = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp = (code >> man_bits) & ((1 << exp_bits) - 1)
        man = code & ((1 << man_bits) - 1)
        max_exp = (1 << exp_bits) - 1
        if e4m3fn and exp == max_exp and man == (1 << man_bits) - 1:
            values.append(math.nan)  # E4M3 "fn": no infinities, one NaN pattern per sign
        elif not e4m3fn and exp == max_exp:
            values.append(sign * math.inf if man == 0 else math.nan)
        elif exp == 0:
            values.append(sign * (man / (1 << man_bits)) * 2.0 ** (1 - bias))
        else:
            values.append(sign * (1 + man / (1 << man_bits)) * 2.0 ** (exp - bias))
    return np.array(values, dtype=np.float64)


E4M3 = fp8_table(4, 3, 7, e4m3fn=True)
E5M2 = fp8_table(5, 2, 15, e4m3fn=False)


def expected_values(dtype, count):
    i = np.arange(count, dtype=np.int64)
    if dtype in FLOAT_DTYPES:
        return ((i % 16) - 8).astype(np.float64) * 0.5
    if dtype in INT_SCALE:
        return ((i * 37) % 251 - 125) * INT_SCALE[dtype]
    if dtype == "U8":
        return (i * 37) % 251 + 2
    if dtype == "BOOL":
        return (i % 3) == 0
    raise FormatError(f"unknown dtype {dtype!r}")


def decode(dtype, raw, count):
    if dtype == "F64":
        return np.frombuffer(raw, dtype="<f8").astype(np.float64)
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float64)
    if dtype == "BF16":
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32).astype(np.float64)
    if dtype == "F8_E4M3":
        return E4M3[np.frombuffer(raw, dtype=np.uint8)]
    if dtype == "F8_E5M2":
        return E5M2[np.frombuffer(raw, dtype=np.uint8)]
    if dtype in INT_NUMPY:
        return np.frombuffer(raw, dtype=INT_NUMPY[dtype]).astype(np.int64)
    if dtype == "BOOL":
        b = np.frombuffer(raw, dtype=np.uint8)
        if np.any(b > 1):
            raise FormatError("BOOL tensor holds bytes other than 0 and 1")
        return b.astype(bool)
    raise FormatError(f"unknown dtype {dtype!r}")


def encode(dtype, values):
    if dtype == "F64":
        return values.astype("<f8").tobytes()
    if dtype == "F32":
        return values.astype("<f4").tobytes()
    if dtype == "F16":
        return values.astype("<f2").tobytes()
    if dtype == "BF16":
        bits = values.astype(np.float32).view(np.uint32)
        return (bits >> 16).astype("<u2").tobytes()
    if dtype in ("F8_E4M3", "F8_E5M2"):
        table = E4M3 if dtype == "F8_E4M3" else E5M2
        lookup = {}
        for code in range(256):
            v = table[code]
            if not math.isnan(v) and v not in lookup and not (v == 0 and code & 0x80):
                lookup[float(v)] = code
        return bytes(lookup[float(v)] for v in values)  # the pattern is exactly representable
    if dtype in INT_NUMPY:
        return values.astype(INT_NUMPY[dtype]).tobytes()
    if dtype == "BOOL":
        return values.astype(np.uint8).tobytes()
    raise FormatError(f"unknown dtype {dtype!r}")


def reject_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"duplicate JSON key {k!r}")
        out[k] = v
    return out


def read(path):
    """Returns (header dict without __metadata__, metadata, data start, file bytes)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError("file shorter than the 8-byte length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise FormatError(f"header length {n} runs past the end of the {len(blob)}-byte file")
    header = json.loads(blob[8:8 + n].decode("utf-8"), object_pairs_hook=reject_duplicates)
    if not isinstance(header, dict):
        raise FormatError("header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise FormatError("__metadata__ values must be strings")
    data_start = 8 + n
    data_size = len(blob) - data_start
    ranges = []
    for name, info in header.items():
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"{name}: fields {sorted(info)}")
        begin, end = info["data_offsets"]
        count = math.prod(info["shape"])
        if info["dtype"] not in ITEM_SIZE:
            raise FormatError(f"{name}: unknown dtype {info['dtype']!r}")
        if not (0 <= begin <= end <= data_size):
            raise FormatError(f"{name}: offsets {begin}, {end} outside the {data_size}-byte data section")
        if end - begin != count * ITEM_SIZE[info["dtype"]]:
            raise FormatError(f"{name}: {end - begin} bytes for {info['dtype']} shape {info['shape']}")
        ranges.append((begin, end, name))
    cursor = 0
    for begin, end, name in sorted(ranges):
        if begin != cursor:
            raise FormatError(f"{name}: starts at {begin}, expected {cursor} (gap or overlap)")
        cursor = end
    if cursor != data_size:
        raise FormatError(f"tensors cover {cursor} of {data_size} data bytes")
    return header, metadata, data_start, blob


def verify(path, spec):
    header, metadata, data_start, blob = read(path)
    if data_start % 8 != 0:
        raise FormatError(f"data section starts at {data_start}, not 8-byte aligned")
    if metadata != spec["metadata"]:
        raise FormatError(f"metadata {metadata!r} != {spec['metadata']!r}")
    if set(header) != {t["name"] for t in spec["tensors"]}:
        raise FormatError(f"tensor names {sorted(header)} != spec")
    for t in spec["tensors"]:
        info = header[t["name"]]
        if info["dtype"] != t["dtype"] or info["shape"] != t["shape"]:
            raise FormatError(f"{t['name']}: {info['dtype']} {info['shape']} != {t['dtype']} {t['shape']}")
        count = math.prod(t["shape"])
        begin, end = info["data_offsets"]
        got = decode(t["dtype"], blob[data_start + begin:data_start + end], count)
        want = expected_values(t["dtype"], count)
        if got.shape != want.shape or not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0]) if got.shape == want.shape else -1
            raise FormatError(f"{t['name']}: value mismatch at element {bad}")
        # Row-major shape: reshape must succeed and keep the first row's values.
        np.reshape(got, t["shape"])
    print(f"verified {len(spec['tensors'])} tensors and {len(metadata)} metadata entries")


def write(path, spec):
    """Writes entries in reverse name order with __metadata__ last and no padding, so the data
    section is generally unaligned: a reader must not depend on arlo's own layout choices."""
    entries = {}
    chunks = []
    offset = 0
    for t in spec["tensors"]:
        raw = encode(t["dtype"], expected_values(t["dtype"], math.prod(t["shape"])))
        entries[t["name"]] = {"shape": t["shape"], "dtype": t["dtype"],
                              "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    ordered = {k: entries[k] for k in sorted(entries, reverse=True)}
    if spec["metadata"]:
        ordered["__metadata__"] = spec["metadata"]
    text = json.dumps(ordered, ensure_ascii=False).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
    print(f"wrote {len(chunks)} tensors, header {len(text)} bytes")


def main(argv):
    if len(argv) != 4 or argv[1] not in ("verify", "write"):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[3], encoding="utf-8") as f:
        spec = json.load(f)
    try:
        (verify if argv[1] == "verify" else write)(argv[2], spec)
    except (FormatError, ValueError, KeyError, TypeError) as e:
        print(f"{argv[2]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
