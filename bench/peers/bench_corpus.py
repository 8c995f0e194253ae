#!/usr/bin/env python3
"""The text corpus and tokenizer the tokenizer benches share (bench/tokenizer_throughput.sh,
bench/prepare_data.sh): the given files and directories (this repository's docs, the machine's
license texts) cut into documents of about 4 KiB at paragraph ends, and a byte-level BPE with
Llama 3's pre-tokenizer pattern trained on them by PyPI's trainer (VOCAB ids).

usage: bench_corpus.py OUT VOCAB MB SOURCE...
  OUT/docs/NNNNN.txt      the documents
  OUT/tokenizer.json      the tokenizer
  with MB > 0, the documents repeated (numbered copies, no two alike) to MB megabytes of text, as
  OUT/corpus.jsonl (field "text") and OUT/corpus.parquet (4,096-row groups; needs pyarrow)
"""
import json
import os
import sys

sys.dont_write_bytecode = True


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    out, vocab, mb, sources = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "tests", "trainer", "data"))
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    import tokenizer_reference as ref

    text = []
    for src in sources:
        paths = [src] if os.path.isfile(src) else [os.path.join(r, f) for r, _, fs in os.walk(src) for f in sorted(fs)]
        for p in sorted(paths):
            with open(p, encoding="utf-8", errors="replace") as f:
                text.append(f.read())
    docs, cur = [], ""
    for para in "\n\n".join(text).split("\n\n"):
        cur += para + "\n\n"
        if len(cur) >= 4096:
            docs.append(cur)
            cur = ""
    if cur:
        docs.append(cur)
    os.makedirs(os.path.join(out, "docs"))
    for i, d in enumerate(docs):
        with open(os.path.join(out, "docs", "%05d.txt" % i), "w", encoding="utf-8") as f:
            f.write(d)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(ref.LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(os.path.join(out, "tokenizer.json"))
    size = sum(len(d.encode()) for d in docs)
    print("[corpus] %d documents, %.1f MB, vocabulary %d" % (len(docs), size / 1e6, tok.get_vocab_size(True)),
          file=sys.stderr)
    if mb <= 0:
        return

    import pyarrow as pa
    import pyarrow.parquet as pq
    base, i = list(docs), 0
    while size < mb * 1e6:
        d = "(%d) %s" % (i, base[i % len(base)])
        docs.append(d)
        size += len(d.encode())
        i += 1
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    pq.write_table(pa.table({"text": docs}), os.path.join(out, "corpus.parquet"), row_group_size=4096)
    print("[corpus] repeated to %d documents, %.1f MB" % (len(docs), size / 1e6), file=sys.stderr)


if __name__ == "__main__":
    main()
