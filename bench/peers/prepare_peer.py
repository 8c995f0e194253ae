#!/usr/bin/env python3
"""The Python side of bench/prepare_data.sh: what a user writes without meshwork-train's
prepare-data (the shape of llm.c's fineweb.py): stream a JSON Lines file, encode 1,024 documents at a
time with PyPI's `tokenizers` (encode_batch_fast on its rayon pool, RAYON_NUM_THREADS threads), frame
each as bos + ids + eos, and append the ids to an llm.c token file (uint16 ids; the header's count
written at the end). Prints one JSON line: seconds, bytes read, tokens written.

usage: prepare_peer.py TOKENIZER_JSON FIELD INPUT.jsonl OUT.bin BOS_ID EOS_ID
"""
import array
import json
import sys
import time

sys.dont_write_bytecode = True


def main():
    if len(sys.argv) != 7:
        sys.exit(__doc__)
    from tokenizers import Tokenizer

    tok_path, field, src, dst, bos, eos = sys.argv[1:7]
    bos, eos = int(bos), int(eos)
    tok = Tokenizer.from_file(tok_path)
    start = time.perf_counter()
    read = written = 0
    header = array.array("i", [20240520, 1, 0, tok.get_vocab_size(True)] + [0] * 252)
    with open(src, "rb") as f, open(dst, "wb") as out:
        out.write(header.tobytes())
        batch = []

        def flush():
            nonlocal written
            ids = array.array("H")
            for e in tok.encode_batch_fast(batch, add_special_tokens=False):
                ids.append(bos)
                ids.extend(e.ids)
                ids.append(eos)
            out.write(ids.tobytes())
            written += len(ids)
            batch.clear()

        for line in f:
            read += len(line)
            if line.strip():
                batch.append(json.loads(line)[field])
            if len(batch) == 1024:
                flush()
        if batch:
            flush()
        header[2] = written
        out.seek(0)
        out.write(header.tobytes())
    print(json.dumps({"seconds": time.perf_counter() - start, "bytes": read, "tokens": written}))


if __name__ == "__main__":
    main()
