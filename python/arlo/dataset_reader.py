"""Reads a Parquet dataset or a Hugging Face dataset saved to disk into arlo tasks, one JSON line each.

arlo's environment kinds `parquet` and `hf_dataset` (rollout/environments/parquet.cc) run this script
under the project's Python (pyarrow, Apache Arrow's own reader) and read the lines it writes:

    python dataset_reader.py --format parquet|hf --path PATH --output FILE
        [--prompt-column prompt] [--answer-column answer] [--info-column ""] [--id-column ""]
        [--split train] [--max-rows 0]

Each output line is {"row": N, "prompt": str | "messages": [{role, content}], "answer": str,
"info": {...}, "id": str}, in the dataset's order; N counts the rows of the whole dataset from 0.

- parquet: PATH is a .parquet file, or a directory whose *.parquet files are read in name order.
- hf: PATH is the directory Dataset.save_to_disk wrote (state.json and its Arrow files), or the one
  DatasetDict.save_to_disk wrote (dataset_dict.json and a directory per split: --split picks one).
  Arrow files are read with pyarrow directly; the datasets package is not needed.

Column mapping: the prompt column holds a string (a completion-style prompt) or a list of
{role, content} (chat messages); the answer column a string or a number ("" for none: no answers);
the info column a struct, a map or a string holding a JSON object ("" for none); the id column a
string or an integer ("" for none: arlo names tasks "<kind>-<row>").

Bad input exits with status 2 and one line on stderr naming the file, the row (counted from 0 in
that file) and the column: a missing column, a value of the wrong type or null, an empty file, a
file Arrow cannot read. Status 3: PATH does not exist; 4: pyarrow is not installed.
"""

import argparse
import json
import os
import sys


class DatasetError(Exception):
    pass


def _fail(status, message):
    sys.stderr.write(message.replace("\n", " ") + "\n")
    sys.exit(status)


def _describe(value):
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "struct"
    return type(value).__name__


class Mapping:
    """Turns one row (a dict of column -> Python value) into a task, or raises DatasetError."""

    def __init__(self, args):
        self.prompt = args.prompt_column
        self.answer = args.answer_column
        self.info = args.info_column
        self.id = args.id_column

    def columns(self):
        return [(key, col) for key, col in (("prompt", self.prompt), ("answer", self.answer),
                                             ("info", self.info), ("id", self.id)) if col]

    def check_schema(self, file, schema):
        names = schema.names
        for key, col in self.columns():
            if col not in names:
                raise DatasetError(f"{file}: no column '{col}' (env.{key}_column; the file has: "
                                   f"{', '.join(names) if names else 'no columns'})")

    def task(self, file, row, values):
        def where(col):
            return f"{file}: row {row}, column '{col}'"

        out = {}
        prompt = values[self.prompt]
        if isinstance(prompt, str):
            out["prompt"] = prompt
        elif isinstance(prompt, (list, tuple)):
            out["messages"] = self._messages(where(self.prompt), prompt)
        else:
            raise DatasetError(f"{where(self.prompt)}: expected a string or a list of {{role, content}} "
                               f"messages, got {_type_name(prompt)} ({_describe(prompt)})")
        if self.answer:
            answer = values[self.answer]
            if isinstance(answer, str):
                out["answer"] = answer
            elif isinstance(answer, (int, float)) and not isinstance(answer, bool):
                out["answer"] = json.dumps(answer)
            else:
                raise DatasetError(f"{where(self.answer)}: expected a string or a number, got "
                                   f"{_type_name(answer)} ({_describe(answer)})")
        if self.info:
            out["info"] = self._info(where(self.info), values[self.info])
        if self.id:
            ident = values[self.id]
            if isinstance(ident, str) and ident:
                out["id"] = ident
            elif isinstance(ident, int) and not isinstance(ident, bool):
                out["id"] = str(ident)
            else:
                raise DatasetError(f"{where(self.id)}: expected a non-empty string or an integer, got "
                                   f"{_type_name(ident)} ({_describe(ident)})")
        return out

    @staticmethod
    def _messages(where, value):
        if not value:
            raise DatasetError(f"{where}: the list of messages is empty")
        messages = []
        for i, m in enumerate(value):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise DatasetError(f"{where}: message {i} needs string 'role' and 'content', got {_describe(m)}")
            messages.append({"role": m["role"], "content": m["content"]})
        return messages

    @staticmethod
    def _info(where, value):
        if isinstance(value, dict):
            return value
        if isinstance(value, list) and all(isinstance(kv, tuple) and len(kv) == 2 for kv in value):
            return {str(k): v for k, v in value}  # an Arrow map column
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                return parsed
            raise DatasetError(f"{where}: expected a JSON object in the string, got {_describe(value)}")
        raise DatasetError(f"{where}: expected a struct, a map or a JSON object string, got "
                           f"{_type_name(value)} ({_describe(value)})")


def _parquet_files(path):
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".parquet"))
        if not files:
            raise DatasetError(f"{path}: a directory without .parquet files")
        return files
    return [path]


def _parquet_batches(pa, file):
    import pyarrow.parquet as pq

    if os.path.getsize(file) == 0:
        raise DatasetError(f"{file}: the file is empty (0 bytes)")
    try:
        reader = pq.ParquetFile(file)
        schema = reader.schema_arrow
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{file}: not a readable Parquet file ({e})")
    return schema, (lambda: reader.iter_batches(batch_size=4096))


def _hf_files(path, split):
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        with open(os.path.join(path, "dataset_dict.json")) as f:
            splits = json.load(f).get("splits", [])
        if split not in splits:
            raise DatasetError(f"{path}: a dataset dictionary without the split '{split}' (env.split; it has: "
                               f"{', '.join(splits)})")
        path = os.path.join(path, split)
    state_file = os.path.join(path, "state.json")
    if not os.path.isfile(state_file):
        raise DatasetError(f"{path}: not a dataset saved with save_to_disk (no state.json or dataset_dict.json)")
    try:
        with open(state_file) as f:
            files = [d["filename"] for d in json.load(f)["_data_files"]]
    except (ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"{state_file}: not a datasets state file ({e})")
    return [os.path.join(path, name) for name in files]


def _arrow_batches(pa, file):
    import pyarrow.ipc as ipc

    if not os.path.isfile(file):
        raise DatasetError(f"{file}: listed in state.json but missing")
    if os.path.getsize(file) == 0:
        raise DatasetError(f"{file}: the file is empty (0 bytes)")
    try:
        schema = ipc.open_stream(pa.memory_map(file)).schema
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{file}: not a readable Arrow file ({e})")
    return schema, (lambda: iter(ipc.open_stream(pa.memory_map(file))))


def read(args, out):
    """Writes the tasks to `out`; returns how many."""
    import pyarrow as pa

    mapping = Mapping(args)
    if args.format == "parquet":
        sources = [(f, _parquet_batches) for f in _parquet_files(args.path)]
    else:
        sources = [(f, _arrow_batches) for f in _hf_files(args.path, args.split)]
    total = 0
    for file, open_batches in sources:
        schema, batches = open_batches(pa, file)
        mapping.check_schema(file, schema)
        row = 0
        wanted = [col for _, col in mapping.columns()]
        try:
            for batch in batches():
                columns = {col: batch.column(batch.schema.get_field_index(col)).to_pylist() for col in wanted}
                for i in range(batch.num_rows):
                    task = mapping.task(file, row, {col: columns[col][i] for col in wanted})
                    task["row"] = total
                    out.write(json.dumps(task, ensure_ascii=False, default=str) + "\n")
                    row += 1
                    total += 1
                    if args.max_rows and total >= args.max_rows:
                        return total
        except (pa.ArrowException, OSError) as e:
            raise DatasetError(f"{file}: unreadable after row {row} ({e})")
        if row == 0 and len(sources) == 1:
            raise DatasetError(f"{file}: the dataset has no rows")
    if total == 0:
        raise DatasetError(f"{args.path}: the dataset has no rows")
    return total


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--format", choices=["parquet", "hf"], required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--prompt-column", default="prompt")
    p.add_argument("--answer-column", default="answer")
    p.add_argument("--info-column", default="")
    p.add_argument("--id-column", default="")
    p.add_argument("--split", default="train")
    p.add_argument("--max-rows", type=int, default=0)
    args = p.parse_args(argv)
    if not args.prompt_column:
        _fail(2, f"{args.path}: env.prompt_column is empty: it must name the prompt column")
    if not os.path.exists(args.path):
        _fail(3, f"{args.path}: no such file or directory (check env.path)")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        _fail(4, f"pyarrow is not installed in {sys.executable}: run scripts/bootstrap --python, or set "
                 "ARLO_PYTHON to a Python that has it")
    try:
        with open(args.output, "w", encoding="utf-8") as out:
            read(args, out)
    except DatasetError as e:
        _fail(2, str(e))


if __name__ == "__main__":
    main()
