#!/usr/bin/env bash
# Checks on the CPU, in fp32, that the PyTorch peer (llama_peer.py) trains the same model on the
# same data as meshwork-train: both train `tiny` from the same weights on the same windows of a
# token file, and their per-step losses must agree to TOL (relative). Two cases:
#   file       Meshwork's initial weights exported as a Hugging Face directory, loaded by both
#              (--init-from / model.init_from); a token file made by `prepare-data`; warmup only.
#   synthetic  each builds its own weights from the seed (the peer reproduces InitWeights);
#              synthetic tokens; warmup, then cosine decay.
# usage: bench/peers/check_cpu.sh PYTHON MESHWORK_TRAIN [TEXT...]
#   PYTHON          a python3 with torch and numpy (e.g. /work/peer-venv/bin/python)
#   MESHWORK_TRAIN  a meshwork-train binary (copy it out of a build folder someone is rebuilding)
#   TEXT            files or folders for prepare-data (default: the repository's docs/)
#   STEPS=10 TOL=1e-4 KEEP=1 (keep the work folder)
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
python="$1" bin="$2"
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
peer="$root/bench/peers/llama_peer.py"
text=("$@")
[ ${#text[@]} -gt 0 ] || text=("$root/docs")
steps="${STEPS:-10}" tol="${TOL:-1e-4}"
work="$(mktemp -d)"
if [ "${KEEP:-0}" = 1 ]; then echo "[check] work folder: $work" >&2; else trap 'rm -rf "$work"' EXIT; fi

mw() { "$bin" train --set training.device=cpu --set metrics.port=-1 --set logging.every=1000 "$@"; }
# One intra-op thread for the peer: torch's default, one per core, spins OpenMP workers that any
# other load on the machine (ctest -j) slows 10-15x here. The losses are the same either way.
peer_run() { "$python" "$peer" --device cpu --dtype fp32 --threads 1 "$@"; }

# compare NAME MESHWORK_JSONL PEER_LOSSES: prints each step's pair, fails beyond TOL.
compare() {
  "$python" - "$1" "$2" "$3" "$tol" <<'EOF'
import json, sys
name, mw_path, peer_path, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
mw = [json.loads(line)["loss"] for line in open(mw_path)]
peer = [float(line) for line in open(peer_path)]
if len(mw) != len(peer):
    sys.exit(f"[check] {name}: meshwork-train logged {len(mw)} steps, the peer {len(peer)}")
worst = 0.0
print(f"[check] {name}: step | meshwork-train | peer | relative difference")
for step, (a, b) in enumerate(zip(mw, peer), 1):
    rel = abs(a - b) / abs(a)
    worst = max(worst, rel)
    print(f"  {step:3d} | {a:.9f} | {b:.9f} | {rel:.2e}")
verdict = "agree" if worst <= tol else "DIFFER"
print(f"[check] {name}: losses {verdict}: max relative difference {worst:.2e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
EOF
}

echo "[check] $("$bin" devices 2>&1 | head -1); peer: $("$python" -c 'import torch; print("torch", torch.__version__)')" >&2
"$bin" prepare-data --out "$work/tokens.bin" "${text[@]}" >&2

# --- file: Meshwork's initial weights, exported --------------------------------------------------
# schedule.steps >= 1 and optimizer.lr > 0 are required; a step at lr 1e-300 moves no fp32
# weight (the update and the decay both round away), so the export is the initial model.
mw --set model.preset=tiny --set data.train="$work/tokens.bin" --set schedule.steps=1 \
  --set optimizer.lr=1e-300 --set checkpoint.export_hf="$work/init" >"$work/export.log" 2>&1 ||
  { cat "$work/export.log" >&2; exit 1; }
mw --set model.init_from="$work/init" --set data.train="$work/tokens.bin" \
  --set schedule.steps="$steps" --set logging.jsonl="$work/file.jsonl" >"$work/file-mw.log" 2>&1 ||
  { cat "$work/file-mw.log" >&2; exit 1; }
peer_run --init-from "$work/init" --data "$work/tokens.bin" --steps "$steps" \
  --losses-out "$work/file-peer.txt" >"$work/file-peer.log"
status=0
compare file "$work/file.jsonl" "$work/file-peer.txt" || status=1

# --- synthetic: each its own seeded init; warmup then cosine decay ---------------------------------
warmup=$((steps / 3))
mw --set model.preset=tiny --set data.train=synthetic --set schedule.steps="$steps" \
  --set schedule.warmup_steps="$warmup" --set logging.jsonl="$work/synthetic.jsonl" \
  >"$work/synthetic-mw.log" 2>&1 || { cat "$work/synthetic-mw.log" >&2; exit 1; }
peer_run --preset tiny --steps "$steps" --warmup "$warmup" \
  --losses-out "$work/synthetic-peer.txt" >"$work/synthetic-peer.log"
compare synthetic "$work/synthetic.jsonl" "$work/synthetic-peer.txt" || status=1
exit $status
