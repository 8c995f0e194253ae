"""The transformers side of tests/integration/hf_export_transformers.sh: load meshwork-train's HF
export with PyPI transformers (AutoTokenizer, AutoModelForCausalLM), check that the tokenizer gives
the ids meshwork-train gives and that the model scores the evaluation windows as
`meshwork-train eval` does. Prints PASS/FAIL lines; exit 1 on any FAIL.

usage: hf_export_check.py HF_DIR VAL_BIN SEQ_LEN WINDOWS MESHWORK_LOSS IDS_FILE DOC...
  IDS_FILE: `meshwork-train tokenize --tokenizer HF_DIR DOC...` output (a line of ids per document)
"""
import struct
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    hf_dir, val_bin, seq, windows, want_loss, ids_file = sys.argv[1:7]
    seq, windows, want_loss = int(seq), int(windows), float(want_loss)
    docs = sys.argv[7:]
    failed = 0

    def check(ok, what):
        nonlocal failed
        print(("PASS: " if ok else "FAIL: ") + what)
        failed += 0 if ok else 1

    tok = AutoTokenizer.from_pretrained(hf_dir)
    want_ids = [list(map(int, line.split())) for line in open(ids_file, encoding="utf-8")]
    same = 0
    for path, want in zip(docs, want_ids):
        text = open(path, encoding="utf-8").read()
        got = tok(text, add_special_tokens=False)["input_ids"]
        if got == want:
            same += 1
        else:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            print("  %s: ids differ first at %d (transformers %s, meshwork %s)" % (path, first, got[first:first + 5],
                                                                                    want[first:first + 5]))
    check(same == len(docs) and len(want_ids) == len(docs),
          "transformers %s %s gives meshwork-train's ids on %d/%d documents" % (transformers.__version__,
                                                                               type(tok).__name__, same, len(docs)))

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.eval()
    with open(val_bin, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        width = 2 if header[1] == 1 else 4
        data = f.read()
    tokens = torch.tensor(struct.unpack("<%d%s" % (len(data) // width, "H" if width == 2 else "I"), data),
                          dtype=torch.long)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(windows):
            w = tokens[i * (seq + 1):(i + 1) * (seq + 1)]
            logits = model(w[:-1].unsqueeze(0)).logits[0]
            total += torch.nn.functional.cross_entropy(logits.float(), w[1:], reduction="sum").item()
            count += seq
    loss = total / count
    check(abs(loss - want_loss) <= 1e-4 * abs(want_loss),
          "%s scores %d windows of %d at loss %.6f; meshwork-train eval %.6f" % (type(model).__name__, windows, seq,
                                                                                loss, want_loss))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
