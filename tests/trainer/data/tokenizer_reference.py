#!/usr/bin/env python3
"""The reference side of tokenizer_e2e.sh: PyPI's `tokenizers` and `sentencepiece` train tokenizers
on local text (no hub downloads) and encode a corpus; meshwork-train must give identical ids.

usage: tokenizer_reference.py corpus OUT_DIR            varied test documents, one file each
       tokenizer_reference.py train TEXT_DIR OUT_DIR    trains every tokenizer below into OUT_DIR
       tokenizer_reference.py encode TOKENIZER DOC...   one line of ids per document (no specials)

Tokenizers trained (OUT_DIR/<name>/):
  llama3-bpe     byte-level BPE with Llama 3's pre-tokenizer pattern, <|begin_of_text|> and
                 <|end_of_text|> as special added tokens, named in tokenizer_config.json
  bytefallback   Llama 2 style BPE: "▁" for spaces, byte fallback (<0x00>..<0xFF>) for characters
                 outside the trained alphabet, <s> and </s>
  unigram        Unigram with the Metaspace pre-tokenizer, its specials given in tokenizer_config.json
                 as AddedToken objects
  spm-unigram    SentencePiece unigram model (tokenizer.model)
  spm-bpe        SentencePiece BPE with byte fallback (tokenizer.model)
"""
import json
import os
import sys

sys.dont_write_bytecode = True

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus(out_dir):
    """Documents chosen to reach the corners: Unicode of many scripts, whitespace runs, long words,
    digits, special tokens written in the text, code."""
    docs = {
        "ascii": "The quick brown fox jumps over the lazy dog. It's 12:45, and we'll see.\n",
        "whitespace": "a  b   c\t\td\n\n\nend   \r\n  leading and trailing  \t\n",
        "only-spaces": "     ",
        "unicode": "Grüße aus Köln — naïve café, Ελληνικά, русский текст, עברית, العربية, हिन्दी\n",
        "cjk-emoji": "日本語のテキストと中文文本。한국어 문장. 🎉🚀👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ✓\n",
        "combining": "e\u0301 a\u0300 n\u0303 Zalgo: Z\u0336\u0321a\u0338l\u0337g\u0335o\u0334\n",
        "long-word": "x" * 3000 + " " + "antidisestablishmentarianism" * 40 + "\n",
        "digits": "3.14159265358979 1000000 2026-12-01 0x7fffffff 1e-6 ١٢٣ ⅧⅨ\n",
        "specials-in-text": "before <|end_of_text|> middle <|begin_of_text|> </s> <s> after\n",
        "code": "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\tif x:\n\t\tpass\n",
        "control": "bell\x07 escape\x1b[0m form\x0cfeed del\x7f\n",
        "mixed-newlines": "one\rtwo\r\nthree\nfour\n\n\n\n",
        "single-char": "a",
        "rare-bytes": "\U0001F9EC \U00010348 \u2028 \ufeff BOM-in-text \U0010FFFD\n",
    }
    os.makedirs(out_dir, exist_ok=True)
    for name, text in docs.items():
        with open(os.path.join(out_dir, name + ".txt"), "w", encoding="utf-8", newline="") as f:
            f.write(text)


def training_lines(text_dir):
    lines = []
    for root, _, files in os.walk(text_dir):
        for name in sorted(files):
            if not name.endswith((".md", ".txt")):
                continue
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                lines.extend(line.rstrip("\n") for line in f if line.strip())
    # Some non-Latin text, so the trained vocabularies hold more than ASCII.
    lines += ["Grüße aus Köln, naïve café", "русский текст для обучения", "日本語のテキスト", "中文文本"] * 20
    return lines


def write_config(directory, bos, eos):
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": bos, "eos_token": eos, "model_max_length": 8192}, f, indent=1)


def train(text_dir, out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    import sentencepiece as spm

    lines = training_lines(text_dir)

    # Llama 3 style: the regex split, then byte-level; a post-processor adding <|begin_of_text|>,
    # which meshwork-train's documents must not get twice (they add bos themselves).
    d = os.path.join(out_dir, "llama3-bpe")
    os.makedirs(d, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>"]
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=1200, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    tok.save(os.path.join(d, "tokenizer.json"))
    write_config(d, "<|begin_of_text|>", "<|end_of_text|>")

    # Llama 2 style BPE with byte fallback: characters outside the trained alphabet become
    # <0xNN> byte tokens, which the model's vocabulary must hold.
    d = os.path.join(out_dir, "bytefallback")
    os.makedirs(d, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=900, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=120, show_progress=False))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    base = max(vocab.values()) + 1
    for b in range(256):
        vocab.setdefault("<0x%02X>" % b, base + b)
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.save(os.path.join(d, "tokenizer.json"))  # no tokenizer_config.json: <s> and </s> by name

    # Unigram with Metaspace; specials as AddedToken objects in tokenizer_config.json.
    d = os.path.join(out_dir, "unigram")
    os.makedirs(d, exist_ok=True)
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(lines, trainers.UnigramTrainer(
        vocab_size=800, special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"], unk_token="<unk>", show_progress=False))
    tok.save(os.path.join(d, "tokenizer.json"))
    write_config(d, {"content": "<bos>", "special": True}, {"content": "<eos>", "special": True})

    corpus_file = os.path.join(out_dir, "spm-training.txt")
    with open(corpus_file, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    for name, extra in (("spm-unigram", {"model_type": "unigram"}),
                        ("spm-bpe", {"model_type": "bpe", "byte_fallback": True})):
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        spm.SentencePieceTrainer.train(input=corpus_file, model_prefix=os.path.join(d, "tokenizer"), vocab_size=700,
                                       hard_vocab_limit=False, minloglevel=2, **extra)


def encode(tokenizer_file, docs):
    texts = []
    for path in docs:
        with open(path, "rb") as f:
            texts.append(f.read().decode("utf-8"))
    if tokenizer_file.endswith(".model"):
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=tokenizer_file)
        ids = [sp.encode(t) for t in texts]
    else:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(tokenizer_file)
        tok.no_truncation()
        tok.no_padding()
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    for row in ids:
        print(" ".join(str(i) for i in row))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "corpus":
        corpus(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "encode":
        encode(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
