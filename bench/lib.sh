# Shared by the bench scripts (source it): provenance lines and the parsing of a trainer log.

# bench_command_line SCRIPT ROOT: "Command: `SCRIPT` (date, commit ...)"
bench_command_line() {
  echo "Command: \`$1\` ($(date -u +%Y-%m-%d), commit $(git -C "$2" rev-parse --short HEAD 2>/dev/null || echo unknown))"
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
