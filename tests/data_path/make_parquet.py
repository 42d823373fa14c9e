"""Writes the Parquet fixtures of parquet_test.cc with pyarrow, and what pyarrow reads back.

    make_parquet.py DIR

DIR/rows.parquet: 50 rows in row groups of 8 (7 row groups); columns of every kind the reader
turns into text: int64, string (nulls, unicode), large_string, float64, bool, a `messages`
list<struct<role, content>> (nulls, unicode) and a list<string> with null items.
DIR/one_group.parquet: 10 rows in one row group.
DIR/rows.jsonl: the same 50 rows as JSON Lines (the loader test compares the two).
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
    back = pq.read_table(os.path.join(out, "rows.parquet"))
    assert pq.ParquetFile(os.path.join(out, "rows.parquet")).metadata.num_row_groups == 7
    expected = [[[k, text(v)] for k, v in row.items()] for row in back.to_pylist()]
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
