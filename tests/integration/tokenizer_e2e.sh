#!/usr/bin/env bash
# Tokenizers against their reference libraries: PyPI's `tokenizers` and `sentencepiece` (installed
# by scripts/setup.sh into .meshwork/tools/tokenizer-ref) train five tokenizers on local text
# (tests/trainer/data/tokenizer_reference.py), and meshwork-train must give the same ids on a
# corpus of varied text; then prepare-data with one of them, the vocabulary check at training, and
# bad input with its exit codes; and the real SentencePiece models sentencepiece's PyPI sources
# ship (Google's test models, English and Japanese). Skips (exit 77, with the reason) where the reference packages or
# this build's Hugging Face support are absent; without SentencePiece its checks print SKIP lines
# with the reason and the rest runs.
# usage: tokenizer_e2e.sh path/to/meshwork-train
set -uo pipefail

bin="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ref_dir="${MESHWORK_TOKENIZER_REF:-$root/.meshwork/tools/tokenizer-ref}"
reference="$root/tests/trainer/data/tokenizer_reference.py"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/common/checks.sh
source "$root/tests/common/checks.sh"
skip() { echo "SKIPPED: $*"; exit 77; }

python=/usr/bin/python3
[ -x "$python" ] || python=python3
[ -f "$ref_dir/.installed" ] ||
  skip "no reference tokenizers under $ref_dir (scripts/setup.sh installs PyPI's tokenizers and sentencepiece there)"
ref() { PYTHONPATH="$ref_dir" "$python" "$reference" "$@"; }
info="$("$bin" tokenize --tokenizer "$root/tests/trainer/data/testdata/wordlevel/tokenizer.json" --info 2>&1)"
[ $? -eq 0 ] || skip "this meshwork-train reads no tokenizer.json: $info"
spm_ok=1

ref corpus "$work/corpus" || { fail "the reference corpus"; checks_done tokenizer_e2e; exit; }
ref train "$root/docs" "$work/tok" >"$work/train.log" 2>&1 ||
  { fail "training the reference tokenizers: $(tail -5 "$work/train.log")"; checks_done tokenizer_e2e; exit; }
docs=("$work"/corpus/*.txt)

# --- identical ids ------------------------------------------------------------------------------
for t in llama3-bpe/tokenizer.json bytefallback/tokenizer.json unigram/tokenizer.json \
         spm-unigram/tokenizer.model spm-bpe/tokenizer.model; do
  want="$(ref encode "$work/tok/$t" "${docs[@]}")"
  got="$("$bin" tokenize --tokenizer "$work/tok/$t" "${docs[@]}" 2>"$work/err")"
  rc=$?
  if [ $rc -eq 5 ] && [[ "$t" == *.model ]]; then
    echo "SKIP: $t: this build cannot read SentencePiece models: $(cat "$work/err")"
    spm_ok=0
  elif [ $rc -ne 0 ]; then
    fail "$t: meshwork-train tokenize exit $rc: $(cat "$work/err")"
  elif [ "$want" = "$got" ]; then
    pass "$t: ids identical to the reference on ${#docs[@]} documents ($(wc -w <<<"$got") tokens)"
  else
    diff <(tr ' ' '\n' <<<"$want") <(tr ' ' '\n' <<<"$got") | head -5
    line=$(diff <(echo "$want") <(echo "$got") | grep -m1 -o '^[0-9]*')
    fail "$t: ids differ from the reference, first at document ${docs[$((line - 1))]##*/}"
  fi
done

# --- real tokenizer files a registry ships: sentencepiece's own test models (its PyPI sources) ----
real="$ref_dir/real"
if [ $spm_ok = 0 ]; then
  echo "SKIP: sentencepiece's test models: this build cannot read SentencePiece models"
elif [ ! -f "$real/.installed" ]; then
  echo "SKIP: sentencepiece's test models: not unpacked under $real (scripts/setup.sh does it from PyPI's source archive)"
else
  for m in test_model.model test_ja_model.model; do
    want="$(ref encode "$real/$m" "${docs[@]}" "$real/botchan.txt")"
    got="$("$bin" tokenize --tokenizer "$real/$m" "${docs[@]}" "$real/botchan.txt" 2>"$work/err")"
    if [ "$want" = "$got" ]; then
      pass "$m (Google's, shipped in sentencepiece's sources): ids identical on $((${#docs[@]} + 1)) documents ($(wc -w <<<"$got") tokens)"
    else
      fail "$m: ids differ from the Python sentencepiece's: $(head -c 300 "$work/err")"
    fi
  done
fi

# --- document separators ------------------------------------------------------------------------
specials() { # TOKENIZER: "bos eos source" as tokenize --info reports them
  "$bin" tokenize --tokenizer "$1" --info | awk '/^bos /{b=$2} /^eos /{e=$2} /^separators_from /{sub(/^separators_from /,""); s=$0} END{print b, e, s}'
}
id_of() { PYTHONPATH="$ref_dir" "$python" -c 'import sys; from tokenizers import Tokenizer; print(Tokenizer.from_file(sys.argv[1]).token_to_id(sys.argv[2]))' "$1" "$2"; }
check_specials() { # NAME TOKENIZER_DIR BOS EOS SOURCE
  local got want
  got="$(specials "$work/tok/$2")"
  want="$(id_of "$work/tok/$2/tokenizer.json" "$3") $(id_of "$work/tok/$2/tokenizer.json" "$4") $5"
  [ "$got" = "$want" ] && pass "$1: bos and eos are $3 and $4 ($5)" || fail "$1: separators '$got', want '$want'"
}
check_specials "tokenizer_config.json strings" llama3-bpe "<|begin_of_text|>" "<|end_of_text|>" tokenizer_config.json
check_specials "tokenizer_config.json AddedToken objects" unigram "<bos>" "<eos>" tokenizer_config.json
check_specials "the usual names" bytefallback "<s>" "</s>" "the usual name <s>, the usual name </s>"
if [ $spm_ok = 1 ]; then
  got="$("$bin" tokenize --tokenizer "$work/tok/spm-bpe" --info | awk '/^bos /{b=$2} /^eos /{e=$2} END{print b, e}')"
  [ "$got" = "1 2" ] && pass "SentencePiece: bos 1 and eos 2 from the model file" || fail "SentencePiece separators '$got', want '1 2'"
fi
got="$("$bin" tokenize --tokenizer "$work/tok/llama3-bpe" --eos-token "<|reserved_special_token_0|>" --info | awk '/^eos /{print $2}')"
want="$(id_of "$work/tok/llama3-bpe/tokenizer.json" "<|reserved_special_token_0|>")"
[ "$got" = "$want" ] && pass "--eos-token overrides tokenizer_config.json" || fail "--eos-token: eos $got, want $want"

# --- prepare-data with a tokenizer, and the vocabulary at training ----------------------------------
tok3="$work/tok/llama3-bpe"
if "$bin" prepare-data --tokenizer "$tok3" --out "$work/train.bin" --val-out "$work/val.bin" \
    "$work/corpus" "$root/docs" >"$work/prep.log" 2>&1; then
  pass "prepare-data --tokenizer: $(head -1 "$work/prep.log")"
else
  fail "prepare-data --tokenizer: $(cat "$work/prep.log")"
fi
# The first document in sorted order, as the reference encodes it, framed by bos and eos; and the
# header's slot 3 holding the tokenizer's vocabulary size.
check="$(PYTHONPATH="$ref_dir" "$python" - "$work/train.bin" "$tok3/tokenizer.json" "$work/corpus/ascii.txt" <<'PY'
import struct, sys
from tokenizers import Tokenizer
data = open(sys.argv[1], "rb").read()
header = struct.unpack("<256i", data[:1024])
width = 2 if header[1] == 1 else 4
tokens = struct.unpack("<%d%s" % (header[2], "H" if width == 2 else "I"), data[1024:])
tok = Tokenizer.from_file(sys.argv[2])
doc = [tok.token_to_id("<|begin_of_text|>")] + tok.encode(open(sys.argv[3], encoding="utf-8").read(),
                                                            add_special_tokens=False).ids + [tok.token_to_id("<|end_of_text|>")]
# prepare-data ran with --val-out at the default val_fraction 0.1: the document's last tenth went to val.
keep = len(doc) - int(len(doc) * 0.1)
problems = []
vocab = max(tok.get_vocab(True).values()) + 1
if header[3] != vocab:
    problems.append("header slot 3 is %d, the tokenizer's ids end at %d" % (header[3], vocab))
if list(tokens[:keep]) != doc[:keep] or tokens[keep] != doc[0]:
    problems.append("the first document's train part is %s..., want %s... and then the next bos" % (list(tokens[:8]), doc[:8]))
print("; ".join(problems) or "ok %d" % header[3])
PY
)"
[[ "$check" == ok* ]] && pass "the token file: bos + the reference's ids + eos, vocabulary ${check#ok } in the header" ||
  fail "the token file: $check"
vocab="${check#ok }"

small=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_hidden_layers=2
       --set data.seq_len=32 --set data.batch_size=4 --set metrics.port=-1 --set logging.every=1000
       --set data.train="$work/train.bin" --set data.val="$work/val.bin" --set schedule.steps=2)
expect_exit "a model smaller than the tokenizer" 3 "written by a tokenizer of $vocab tokens (its header), but the model's vocab_size is 320" \
  -- "$bin" train "${small[@]}"
if "$bin" train "${small[@]}" --set model.vocab_size=1280 >"$work/train2.log" 2>&1; then
  pass "trains 2 steps with vocab_size 1280 >= $vocab"
else
  fail "training on the tokenized file: $(tail -3 "$work/train2.log")"
fi

printf 'fine first line\nbad \xff byte\n' >"$work/bad.txt"
# --- train-tokenizer: the crate's BpeTrainer, as PyPI's runs it ---------------------------------------
if "$bin" train-tokenizer --vocab-size 600 --out "$work/mwtok" "$root/docs" >"$work/tt.log" 2>&1; then
  pass "train-tokenizer: $(cat "$work/tt.log")"
  same="$(PYTHONPATH="$ref_dir" "$python" - "$work/mwtok/tokenizer.json" "$root/docs" <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[2], "..", "tests", "trainer", "data"))
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
import tokenizer_reference as ref
paths = sorted(os.path.join(r, f) for r, _, fs in os.walk(sys.argv[2]) for f in fs)
docs = [open(p, encoding="utf-8").read() for p in paths]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(ref.LLAMA3_PATTERN), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=600, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
want = json.loads(tok.to_str())["model"]
got = json.load(open(sys.argv[1]))["model"]
print("same" if (want["vocab"], want["merges"]) == (got["vocab"], got["merges"]) else
      "differ: %d/%d ids, %d/%d merges" % (len(got["vocab"]), len(want["vocab"]), len(got["merges"]), len(want["merges"])))
PY
)"
  [ "$same" = same ] && pass "train-tokenizer's vocabulary and merges equal PyPI's BpeTrainer on the same documents" ||
    fail "train-tokenizer against PyPI's trainer: $same"
  want="$(ref encode "$work/mwtok/tokenizer.json" "${docs[@]}")"
  got="$("$bin" tokenize --tokenizer "$work/mwtok" "${docs[@]}")"
  [ "$want" = "$got" ] && pass "the trained tokenizer: ids identical to the reference's on ${#docs[@]} documents" ||
    fail "the trained tokenizer's ids differ from the reference's"
else
  fail "train-tokenizer: $(cat "$work/tt.log")"
fi
expect_exit "train-tokenizer with too few ids" 2 "--vocab-size: 100 must count the 256 byte tokens" \
  -- "$bin" train-tokenizer --vocab-size 100 --out "$work/x" "$root/docs"
expect_exit "train-tokenizer on text that is not UTF-8" 3 "is not UTF-8: invalid byte 0xff at byte offset 20" \
  -- "$bin" train-tokenizer --vocab-size 300 --out "$work/x" "$work/bad.txt"

# --- bad input ---------------------------------------------------------------------------------
printf 'fine first line\nbad \xff byte\n' >"$work/bad.txt"
expect_exit "invalid UTF-8" 3 "input '$work/bad.txt' is not UTF-8: invalid byte 0xff at line 2, byte offset 20" \
  -- "$bin" prepare-data --tokenizer "$tok3" --out "$work/x.bin" "$work/bad.txt"
[ -e "$work/x.bin" ] && fail "a refused prepare-data left $work/x.bin" || pass "nothing written after the refusal"
expect_exit "a missing tokenizer" 3 "tokenizer '$work/nope' does not exist" \
  -- "$bin" prepare-data --tokenizer "$work/nope" --out "$work/x.bin" "$work/corpus"
expect_exit "a directory without a tokenizer" 3 "has neither tokenizer.json nor tokenizer.model" \
  -- "$bin" prepare-data --tokenizer "$work/corpus" --out "$work/x.bin" "$work/corpus"
echo '{"version": "1.0", "model": ' >"$work/broken.json"
expect_exit "a malformed tokenizer.json" 3 "cannot read the Hugging Face tokenizer '$work/broken.json'" \
  -- "$bin" tokenize --tokenizer "$work/broken.json" --info
expect_exit "an --eos-token not in the vocabulary" 3 "--eos-token '<|nope|>' is not a token of" \
  -- "$bin" prepare-data --tokenizer "$tok3" --eos-token "<|nope|>" --out "$work/x.bin" "$work/corpus"
expect_exit "separators with the byte vocabulary" 2 "--bos-token and --eos-token apply to a tokenizer file" \
  -- "$bin" prepare-data --eos-token "</s>" --out "$work/x.bin" "$work/corpus"
if [ $spm_ok = 1 ]; then
  printf 'not a model' >"$work/broken.model"
  expect_exit "a malformed SentencePiece model" 3 "cannot read the SentencePiece model '$work/broken.model'" \
    -- "$bin" tokenize --tokenizer "$work/broken.model" --info
fi

checks_done tokenizer_e2e
