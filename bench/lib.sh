# Shared by the bench scripts (source it): provenance lines, the parsing of a trainer log, and the
# benchmark protocol's loop and records (bench/protocol.py, bench/README.md).

# bench_command_line SCRIPT ROOT [VAR...]: "Command: `VAR=value... SCRIPT` (date, commit ...)", each
# VAR that is set in the environment written before the script as the command was given; the
# commit is marked when the working tree differs from it.
bench_command_line() {
  local script=$1 root=$2 var env="" commit
  shift 2
  for var in "$@"; do
    [ -n "${!var+set}" ] || continue
    if [[ ${!var} =~ ^[A-Za-z0-9_./:=+,-]*$ ]]; then
      env+="$var=${!var} "
    else
      env+="$var=\"$(sed 's/["$`\\]/\\&/g' <<<"${!var}")\" "
    fi
  done
  commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if [ "$commit" != unknown ] && ! git -C "$root" diff --quiet HEAD -- 2>/dev/null; then
    commit+=" with uncommitted changes"
  fi
  echo "Command: \`$env$script\` ($(date -u +%Y-%m-%d), commit $commit)"
}

# bench_machine: "N cores, <CPU model>"
bench_machine() {
  echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
}

# parse_run LOG: sets done_line, tps, peak (rank 0's peak memory), step_peak (the most tensor
# memory one step held once the schedule settled, may be empty), comm (the communication
# summary line, may be empty) and exposed (rank 0's exposed communication, may be empty).
parse_run() {
  done_line="$(grep '^done:' "$1")"
  tps="$(sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/' <<<"$done_line")"
  peak="$(sed -E 's/.*peak mem ([0-9]+ MiB).*/\1/' <<<"$done_line")"
  step_peak="$(sed -nE 's/.*step peak tensors ([0-9]+ MiB).*/\1/p' <<<"$done_line")"
  comm="$(grep '^communication' "$1" || true)"
  exposed="$(sed -nE 's/.*exposed ([0-9.]+ s \([0-9.]+% of the run\)).*/\1/p' <<<"$comm")"
}

# bench_home_made_rows RESULTS CELLS: the retired home-made meshwork-controlplane's rows of the table
# in RESULTS (its last measurement, kept beside the meshwork-cluster rows that replace it): rows of
# the old format (CELLS cells, the first a number) get a first column naming it and the commit its
# results name; rows that already have it are kept as they are. Nothing when RESULTS is missing.
bench_home_made_rows() {
  python3 - "$1" "$2" <<'PY'
import os, re, sys
path, cells_wanted = sys.argv[1], int(sys.argv[2])
if not os.path.exists(path):
    sys.exit()
text = open(path).read()
commit = re.search(r"commit ([0-9a-f]{7,})", text)
label = f"home-made meshwork-controlplane (commit {commit.group(1)})" if commit else "home-made meshwork-controlplane"
table = text.split("\n## ")[0].split("### The earlier run")[0]
for line in table.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if re.fullmatch(r"\d+", cells[0]) and len(cells) == cells_wanted:
        print("| " + label + " | " + " | ".join(cells) + " |")
    elif cells[0].startswith("home-made"):
        print(line)
PY
}

# The benchmark protocol (bench/protocol.py, bench/README.md): every configuration runs REPEATS
# times (default 5), interleaved, and each run's figure is the median over MEASURED steps (default
# 20) after the warm-up it skips; a table gives the median, min and max over the repeats.
# bench_protocol_sizes: sets repeats and measured from the environment.
bench_protocol_sizes() {
  repeats=${REPEATS:-5}
  measured=${MEASURED:-20}
  [[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "REPEATS '$repeats': expected a positive integer" >&2; return 2; }
  [[ $measured =~ ^[1-9][0-9]*$ ]] || { echo "MEASURED '$measured': expected a positive integer" >&2; return 2; }
}

# bench_interleave RUN NAME...: `RUN NAME REPEAT` for REPEAT 1..$repeats, every NAME in the order given
# within each round (A B C A B C ...), so that a drift of the machine falls on every configuration
# alike. RUN records its own failures; a failing RUN does not stop the rounds.
bench_interleave() {
  local run=$1 rep name
  shift
  for ((rep = 1; rep <= repeats; rep++)); do
    for name in "$@"; do
      "$run" "$name" "$rep" || echo "[bench] $name, repeat $rep: failed (recorded)" >&2
    done
  done
}

# bench_record RAW SKIP STEPS_JSONL LOG STATUS [--tag K=V]... [--attach NAME=FILE]...: one run into the
# raw records (protocol.py record); STATUS ok or failed.
bench_record() {
  local raw=$1 skip=$2 steps=$3 log=$4 status=$5
  shift 5
  python3 "$(dirname "${BASH_SOURCE[0]}")/protocol.py" record "$raw" --skip "$skip" --steps "$steps" \
    --log "$log" --status "$status" "$@"
}

# bench_tail_logs PREFIX: the last lines of every rank's log of a run (PREFIX.rank<r>.log) on stderr,
# for a run that failed.
bench_tail_logs() {
  local f
  for f in "$1".rank*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done
}

# bench_write_results TAG: the end of a bench that wrote its table to $tmp/table.md: the raw records
# ($raw) compressed to $raw_dest, the table put above OUT's earlier results (`out`), and printed.
bench_write_results() {
  python3 "$(dirname "${BASH_SOURCE[0]}")/protocol.py" finish "$raw" "$raw_dest"
  mkdir -p "$(dirname "$out")"
  { cat "$tmp/table.md"; echo; bench_earlier_results "$out"; } >"$tmp/with_earlier.md"
  cp "$tmp/with_earlier.md" "$out"
  cat "$tmp/table.md"
  echo "[$1] wrote $out and $raw_dest" >&2
}

# bench_earlier_results OUT: the results file's earlier contents under "## Earlier results", their
# titles one level down (nothing when OUT does not exist yet): what a script appends below its new table.
bench_earlier_results() {
  [ -f "$1" ] || return 0
  printf '## Earlier results\n\n'
  sed 's/^# /### /' "$1"
}

# bench_estimate RUNS STEPS STEP_SECONDS OVERHEAD_SECONDS: "RUNS runs x STEPS steps: about H h MM min"
bench_estimate() {
  python3 -c '
import sys
runs, steps, step_s, overhead_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
total = runs * (steps * step_s + overhead_s)
print(f"{runs} runs x {steps} steps at about {step_s:.1f} s a step (+{overhead_s:.0f} s a run): "
      f"about {int(total // 3600)} h {int(total % 3600 // 60):02d} min")' "$@"
}

# netlab_run_world PREFIX BATCH FLAGS...: one training run on netlab (bench/netlab/netlab.sh,
# already up): every rank in its namespace, rank r pinned to core r (mod the cores) with one
# intra-op thread, BATCH sequences a rank (data.batch_size), rank 0's per-step records in
# PREFIX.jsonl and rank r's log in PREFIX.rank<r>.log. Reads bin, netlab, world, cores, preset,
# seq, steps and both_sets (the SETS flags for every run) from the caller; both_sets come after
# BATCH (so SETS may change it) and FLAGS, the configuration's own, last.
netlab_run_world() {
  local prefix=$1 batch_per_rank=$2 r pids=() rc=0
  shift 2
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR="$("$netlab" addr 0)" MASTER_PORT=29500 \
      "$netlab" exec "$r" taskset -c "$((r % cores))" "$bin" train --set model.preset="$preset" \
      --set data.train=synthetic --set data.seq_len="$seq" --set data.batch_size="$batch_per_rank" \
      --set schedule.steps="$steps" --set schedule.warmup_steps=1 --set training.threads=1 \
      --set dist.gloo_hostname="$("$netlab" addr "$r")" --set dist.timeout_seconds=600 \
      --set metrics.port=-1 --set metrics.device_profile=cpu --set logging.every=1000 \
      --set logging.jsonl="$prefix.jsonl" "${both_sets[@]}" "$@" >"$prefix.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || rc=$?; done
  return $rc
}

# netlab_machine_lines: the results' first two lines on where a netlab run ran (the caller's next
# line goes on with "(training.threads=1). ...").
netlab_machine_lines() {
  echo "Machine: $(bench_machine), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo). Each rank in its own network namespace, its"
  echo "link shaped to the rate in both directions (tc tbf; bench/netlab/netlab.sh), pinned to its own core"
}

# bench_begin NAME: what a protocol bench does before its runs: the raw records' destination (RAW,
# else bench/results/raw/NAME/<time>-<commit>.jsonl.gz beside OUT's file `out`), a work folder
# `tmp` with `raw` in it, removed at exit, and the build (`bin`) checked. Reads root, out and bin.
bench_begin() {
  local stamp
  stamp="$(date -u +%Y%m%dT%H%M%SZ)-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  raw_dest="${RAW:-$(dirname "$out")/raw/$1/$stamp.jsonl.gz}"
  tmp="$(mktemp -d)"
  raw="$tmp/raw.jsonl"
  trap 'rm -rf "$tmp"' EXIT
  [ -x "$bin" ] || { echo "no $bin: build first (scripts/setup.sh)" >&2; exit 1; }
}

# netlab_begin NAME: bench_begin, with `tmp` removed at exit after netlab is taken down (its files
# copied to LOGS when set), netlab checked (exit 77 where netlab cannot run), and `cores`. Reads
# root, out, bin and netlab from the caller.
netlab_begin() {
  bench_begin "$1"
  trap '"$netlab" down; [ -z "${LOGS:-}" ] || { mkdir -p "$LOGS" && cp "$tmp"/* "$LOGS"/; }; rm -rf "$tmp"' EXIT
  "$netlab" check || exit $?
  cores=$(nproc)
}

# ---- processes of a local cluster (bench/operator_load.sh, bench/operator_vs_job.sh)

# bench_start_cluster RUN CLUSTER AGENT [FLAG...]: a fresh meshwork-cluster with its data in RUN/cp
# and its log in RUN/cp.log (cp_pid: its pid), the CRDs applied and Established and namespace
# bench made, through $KUBECONFIG (the caller exports RUN/cp/kubeconfig). 1 when it did not start.
bench_start_cluster() {
  local run=$1 cluster=$2 agent=$3
  shift 3
  (cd "$run" && exec "$cluster" --data-dir "$run/cp" --node-agent "$agent" "$@" >"$run/cp.log" 2>&1) &
  cp_pid=$!
  for _ in $(seq 1 1800); do grep -q "serving on" "$run/cp.log" && break; sleep 0.1; done
  grep -q "serving on" "$run/cp.log" || { cat "$run/cp.log" >&2; return 1; }
  kubectl --request-timeout=60s apply -f "$(dirname "${BASH_SOURCE[0]}")/../crds/" >/dev/null
  kubectl --request-timeout=60s wait --for=condition=Established crd/trainingjobs.meshwork.dev --timeout=30s >/dev/null
  kubectl --request-timeout=60s create namespace bench >/dev/null
}
# bench_stop_pid PID: SIGTERM, up to 20 s for a clean exit, then SIGKILL.
bench_stop_pid() {
  local p="$1"
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null || return 0
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 1 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}
# bench_cpu_s PID: user + system seconds of the process (its reaped children are not counted).
bench_cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{sub(/.*\) /, ""); print ($12 + $13) / hz}' "/proc/$1/stat"; }
# bench_children_cpu_s PID: user + system seconds of its reaped children.
bench_children_cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{sub(/.*\) /, ""); print ($14 + $15) / hz}' "/proc/$1/stat"; }
# bench_hwm_kib PID: the process's peak RSS (VmHWM) in KiB.
bench_hwm_kib() { awk '/VmHWM/ {print $2}' "/proc/$1/status"; }
