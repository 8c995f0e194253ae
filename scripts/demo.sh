#!/usr/bin/env bash
# The main job: install and build (scripts/setup.sh), turn English text that ships with Debian
# and with Meshwork into byte-level tokens, train the `tiny` Llama on the CPU with live
# /metrics, evaluate it, and export it as a Hugging Face model directory.
# Extra arguments go to `meshwork-train train`, e.g. scripts/demo.sh --set schedule.steps=50
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh"

bin="${MESHWORK_BUILD_DIR:-$root/build}/trainer/meshwork-train"
mkdir -p .meshwork/data
corpus=()
for f in GPL-3 GPL-2 LGPL-2.1 LGPL-3 Apache-2.0 GFDL-1.3 MPL-2.0 Artistic; do
  [ -f "/usr/share/common-licenses/$f" ] && corpus+=("/usr/share/common-licenses/$f")
done
corpus+=(README.md docs)

echo
echo "== preparing data"
"$bin" prepare-data --out .meshwork/data/train.bin --val-out .meshwork/data/val.bin "${corpus[@]}"

echo
echo "== training examples/tiny.yaml (metrics on http://localhost:9400/metrics while it runs)"
"$bin" train --config examples/tiny.yaml "$@"

echo
echo "== evaluating the exported model"
"$bin" eval --weights .meshwork/tiny-hf --data .meshwork/data/val.bin --config examples/tiny.yaml

cat <<MSG

Done. What you have now:
  .meshwork/tiny-hf/          the trained model as a Hugging Face directory (config.json + model.safetensors)
  .meshwork/data/*.bin        the token files (llm.c layout, byte-level vocabulary; docs/data.md)
Next:
  $bin train --config examples/tiny.yaml --set schedule.steps=1000   # train longer
  $bin config --config examples/tiny.yaml                            # every key, resolved
  docs/config.md, docs/metrics.md, docs/data.md                      # what the keys and metrics mean
MSG
