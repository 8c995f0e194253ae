#!/usr/bin/env python3
"""The Python side of bench/tokenizer_throughput.sh: PyPI's `tokenizers` encoding the same files as
`meshwork-train tokenize --time N`, the same way (one batch, no special tokens, no offsets:
encode_batch_fast, which is what the Rust side calls), printing one JSON line a pass in the same
fields. Threads: RAYON_NUM_THREADS, as for meshwork-train (both use the crate's rayon pool).

usage: tokenize_peer.py TOKENIZER_JSON PASSES FILE...
"""
import json
import sys
import time

sys.dont_write_bytecode = True


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(sys.argv[1])
    tok.no_truncation()
    tok.no_padding()
    passes = int(sys.argv[2])
    texts = []
    for path in sys.argv[3:]:
        with open(path, "rb") as f:
            texts.append(f.read().decode("utf-8"))
    size = sum(len(t.encode("utf-8")) for t in texts)
    for step in range(1, passes + 1):
        start = time.perf_counter()
        encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(e.ids) for e in encodings)
        print(json.dumps({"step": step, "step_seconds": seconds, "tokens": tokens, "bytes": size, "texts": len(texts)}),
              flush=True)


if __name__ == "__main__":
    main()
