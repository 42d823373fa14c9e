"""Writes the Parquet fixtures of parquet_test.cc with pyarrow, and what pyarrow reads back.

    make_parquet.py DIR

DIR/rows.parquet: 50 rows in row groups of 8 (7 row groups); columns of every kind the reader
turns into text: int64, string (nulls, unicode), large_string, float64, bool, a `messages`
list<struct<role, content>> (nulls, unicode) and a list<string> with null items.
DIR/one_group.parquet: 10 rows in one row group.
DIR/rows.jsonl: the same 50 rows as JSON Lines (the loader test compares the two).
DIR/saved/: the same 50 rows as Hugging Face `datasets` writes a Dataset with save_to_disk: two
Arrow IPC stream files of 25 rows in record batches of 8 (data-0000N-of-00002.arrow, as
datasets' ArrowWriter writes them with pa.RecordBatchStreamWriter) listed in state.json's
_data_files, and dataset_info.json. DIR/dict/: a DatasetDict of it (dataset_dict.json, train/).
DIR/expected.json: per row of rows.parquet, [[column, text], ...] as the C++ reader must give
it, computed from pyarrow's own read of the file (parquet_reader.h: null -> "", strings as they
are, numbers and bools as JSON text, lists and structs as compact JSON).
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def rows(n):
    out = []
    for i in range(n):
        out.append({
            "id": i,
            "instruction": None if i % 7 == 3 else f"q{i} ünïcødé 日本語 🙂 " + "x" * (i % 5),
            "output": f"a{i} ✓",
            "score": i * 0.25,
            "ok": i % 2 == 0,
            "messages": None if i % 9 == 4 else [
                {"role": "user", "content": f"hi {i} ☃ \"quoted\""},
                {"role": "assistant", "content": f" yo {i}\n"}],
            "tags": ["a", None, "c"] if i % 3 == 0 else [],
        })
    return out


SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("instruction", pa.string()),
    ("output", pa.large_string()),
    ("score", pa.float64()),
    ("ok", pa.bool_()),
    ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("tags", pa.list_(pa.string())),
])


def text(value):
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def write_saved_dataset(folder, data):
    os.makedirs(folder)
    names = [f"data-{k:05d}-of-00002.arrow" for k in range(2)]
    for k, name in enumerate(names):
        table = pa.Table.from_pylist(data[25 * k:25 * (k + 1)], schema=SCHEMA)
        with pa.OSFile(os.path.join(folder, name), "wb") as sink:
            with pa.ipc.new_stream(sink, SCHEMA) as writer:
                for batch in table.to_batches(max_chunksize=8):
                    writer.write_batch(batch)
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"_data_files": [{"filename": n} for n in names], "_fingerprint": "0",
                   "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
                   "_output_all_columns": False, "_split": "train"}, f, indent=2)
    with open(os.path.join(folder, "dataset_info.json"), "w") as f:
        json.dump({"citation": "", "description": "", "features": {}}, f)


def main():
    out = sys.argv[1]
    data = rows(50)
    pq.write_table(pa.Table.from_pylist(data, schema=SCHEMA),
                   os.path.join(out, "rows.parquet"), row_group_size=8)
    pq.write_table(pa.Table.from_pylist(rows(10), schema=SCHEMA),
                   os.path.join(out, "one_group.parquet"))
    with open(os.path.join(out, "rows.jsonl"), "w", encoding="utf-8") as f:
        for row in data:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    write_saved_dataset(os.path.join(out, "saved"), data)
    write_saved_dataset(os.path.join(out, "dict", "train"), data)
    with open(os.path.join(out, "dict", "dataset_dict.json"), "w") as f:
        json.dump({"splits": ["train"]}, f)
    back = pq.read_table(os.path.join(out, "rows.parquet"))
    assert pq.ParquetFile(os.path.join(out, "rows.parquet")).metadata.num_row_groups == 7
    expected = [[[k, text(v)] for k, v in row.items()] for row in back.to_pylist()]
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
