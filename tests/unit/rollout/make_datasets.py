"""Writes the datasets of rollout_dataset_test into DIR with the real libraries: Parquet files with
pyarrow, datasets saved to disk with Hugging Face `datasets`. Usage: make_datasets.py DIR"""
import os
import sys

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
import datasets  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

out = sys.argv[1]
datasets.disable_progress_bars()


def parquet(name, table):
    pq.write_table(table, os.path.join(out, name))


rows = [{"prompt": f"{i}+{i}=", "answer": 2 * i, "info": {"i": i}, "uid": f"q{i}"} for i in range(10)]
good = pa.Table.from_pylist(rows)
parquet("good.parquet", good)
parquet("chat.parquet", pa.table({
    "question": [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]],
    "solution": ["hello"],
    "meta": ['{"level": 3}'],
}))
parquet("no_answer.parquet", good.drop_columns(["answer"]))
parquet("wrong_type.parquet", pa.table({"prompt": ["a", "b"], "answer": [["x"], ["y"]]}))
parquet("null_prompt.parquet", pa.table({"prompt": ["a", "b", None], "answer": ["1", "2", "3"]}))
parquet("no_rows.parquet", pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}))
open(os.path.join(out, "zero_bytes.parquet"), "wb").close()
with open(os.path.join(out, "good.parquet"), "rb") as f:
    data = f.read()
with open(os.path.join(out, "corrupt.parquet"), "wb") as f:
    f.write(data[: len(data) // 2])
parquet("dup_ids.parquet", pa.table({"prompt": ["a", "b"], "answer": ["1", "2"], "uid": ["x", "x"]}))
os.makedirs(os.path.join(out, "shards"))
parquet("shards/part-0.parquet", good.slice(0, 4))
parquet("shards/part-1.parquet", good.slice(4))

ds = datasets.Dataset.from_list(rows)
ds.save_to_disk(os.path.join(out, "hf_one"))
datasets.DatasetDict({"train": ds.select(range(7)), "test": ds.select(range(7, 10))}).save_to_disk(
    os.path.join(out, "hf_dict"))
