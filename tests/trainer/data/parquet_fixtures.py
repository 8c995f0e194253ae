"""Parquet and JSON Lines inputs for tests/integration/prepare_data_e2e.sh, written by PyPI's
pyarrow (the Apache Arrow release whose C++ library meshwork-train's Parquet module links).

usage: parquet_fixtures.py OUT_DIR
  OUT_DIR/same.jsonl and OUT_DIR/shards/*.parquet hold the same documents in the same order
  (three shards, small row groups so reads cross them; one stores large_string and has extra
  columns, one is dictionary-encoded and zstd-compressed); OUT_DIR/bad/*.parquet are the malformed cases the test names.
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def documents():
    docs = []
    for i in range(700):
        docs.append(f"Document {i}: " + "naïve café, 東京, emoji 🦀 " * (i % 5) + "end.\n" * (1 + i % 3))
    docs[17] = ""  # an empty document, skipped in both formats
    return docs


def main(out):
    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    os.makedirs(os.path.join(out, "bad"), exist_ok=True)
    docs = documents()
    with open(os.path.join(out, "same.jsonl"), "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, "text": d}, ensure_ascii=False) + "\n")
    parts = [docs[:300], docs[300:650], docs[650:]]
    pq.write_table(pa.table({"text": parts[0]}), os.path.join(out, "shards", "part-0.parquet"), row_group_size=64)
    pq.write_table(pa.table({"id": list(range(300, 650)), "text": pa.array(parts[1], pa.large_string()),
                             "score": [0.5] * len(parts[1])}),
                   os.path.join(out, "shards", "part-1.parquet"), row_group_size=100)
    pq.write_table(pa.table({"text": pa.array(parts[2]).dictionary_encode()}),
                   os.path.join(out, "shards", "part-2.parquet"), compression="zstd")

    bad = os.path.join(out, "bad")
    pq.write_table(pa.table({"body": ["x"], "id": [1]}), os.path.join(bad, "no-column.parquet"))
    pq.write_table(pa.table({"text": [1, 2, 3]}), os.path.join(bad, "not-string.parquet"))
    pq.write_table(pa.table({"text": ["a", "b", None, "d"]}), os.path.join(bad, "null-row.parquet"),
                   row_group_size=2)
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), os.path.join(bad, "no-rows.parquet"))
    pq.write_table(pa.table({"text": pa.array([b"ok", b"bad \xff"], pa.binary())}),
                   os.path.join(bad, "binary.parquet"))
    whole = open(os.path.join(out, "shards", "part-0.parquet"), "rb").read()
    with open(os.path.join(bad, "truncated.parquet"), "wb") as f:
        f.write(whole[: len(whole) // 2])


if __name__ == "__main__":
    main(sys.argv[1])
