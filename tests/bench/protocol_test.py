#!/usr/bin/env python3
"""The bench protocol's arithmetic on made-up step logs (bench/protocol.py): the warm-up steps are
dropped, a run's figure is the median of its measured steps, a configuration's the median, min and
max over its runs, a short protocol is flagged in the title, lib.sh interleaves A B A B; and the
netlab reports on top of it (bench/netlab/pareto.py's dominance verdicts, simulator_oos.py's
errors through a stand-in meshwork-simulate). Usage: protocol_test.py [REPO_ROOT]"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "bench", "netlab"))
import protocol  # noqa: E402
import pareto  # noqa: E402
import simulator_oos  # noqa: E402

MIB = 1 << 20

LOG = textwrap.dedent("""\
    parallelism: 2 ranks, FSDP over mesh dp_replicate 1 x dp_shard 2 (gloo); parameters on this rank 95.5 MiB; activation checkpointing: none
    compiled plan: passes checkpoint,keep_gathered; bucketing auto, budget 1286 MiB (fsdp.memory_budget); 40 collectives/step (eager 52); predicted step 4.7850 s (eager 6.6643), exposed comm 0.3 s (eager 1.2), peak dynamic 1200 MiB (eager 1206 MiB) + static 382 MiB; dp_shard link 80 us + 0.11 GB/s
    compiled plan chose: 3 of 12 layers kept gathered
    re-plan: the compiled step measured 4.600 s (median over ranks) against 4.785 s predicted; compute x0.95 (was x1.00); the plan stays, predicted 4.600 s
    communication (rank 0): all_gather 100 calls 900 MiB sent; exposed 7.77 s (16.5% of the run)
    done: 8 steps, 4096 tokens in 40.1 s | final loss 10.3712 | 178 tok/s | mfu 1.00% | peak mem 2417 MiB (cpu) | step peak tensors 1523 MiB (from step 5)
    """)


def steps_jsonl(path, step_seconds, exposed, peaks_mib):
    with open(path, "w") as f:
        for i, (s, e, p) in enumerate(zip(step_seconds, exposed, peaks_mib), start=1):
            f.write(json.dumps({"step": i, "loss": 10.0, "step_seconds": s, "exposed_comm_seconds": e,
                                "peak_tensor_bytes": int(p * MIB)}) + "\n")


class RawRecords(unittest.TestCase):
    """A temporary raw file and made-up runs recorded into it."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.raw = os.path.join(self.dir.name, "raw.jsonl")

    def tearDown(self):
        self.dir.cleanup()

    def add(self, name, step_seconds, exposed=None, peaks=None, skip=4, status="ok", log=None, **tags):
        path = os.path.join(self.dir.name, name + ".jsonl")
        n = len(step_seconds)
        steps_jsonl(path, step_seconds, exposed or [0.1] * n, peaks or [100] * n)
        log_path = None
        if log is not None:
            log_path = os.path.join(self.dir.name, name + ".log")
            with open(log_path, "w") as f:
                f.write(log)
        return protocol.record(self.raw, tags, skip, path, log_path, status)


class Protocol(RawRecords):
    def test_a_run_is_the_median_of_its_steps_after_the_skipped_ones(self):
        # Steps 1-4 are far slower and hold more: they must not count.
        run = self.add("a", [50, 50, 50, 50, 3, 1, 2, 9], [9, 9, 9, 9, 0.3, 0.1, 0.2, 0.4],
                       [999, 999, 999, 999, 10, 30, 20, 25], config="a", repeat=1)
        self.assertEqual(run["measured_steps"], 4)
        self.assertAlmostEqual(run["step_s"], 2.5)      # median of 3, 1, 2, 9
        self.assertAlmostEqual(run["exposed_s"], 0.25)  # median of 0.3, 0.1, 0.2, 0.4
        self.assertAlmostEqual(run["step_peak_mib"], 30)  # the largest measured step's peak

    def test_a_configuration_is_the_median_min_and_max_over_its_repeats(self):
        for rep, base in enumerate([4.0, 6.0, 5.0], start=1):
            self.add(f"a{rep}", [99] * 4 + [base] * 5, peaks=[100 + rep] * 9, config="a", repeat=rep)
            self.add(f"b{rep}", [99] * 4 + [base + 10] * 5, config="b", repeat=rep)
        runs = protocol.load_runs(self.raw)
        s = protocol.summarize(runs, {"config": "a"})
        self.assertEqual(s["runs"], 3)
        self.assertEqual(s["measured_steps"], 5)
        self.assertEqual(s["step_s"], (5.0, 4.0, 6.0))
        self.assertEqual(s["step_peak_mib"], (102.0, 101.0, 103.0))
        self.assertEqual(protocol.fmt_spread(s["step_s"]), "5.000 [4.000, 6.000]")
        table = protocol.table(runs, ["config"])
        self.assertIn("| a | 3 | 5.000 [4.000, 6.000] |", table)
        self.assertIn("| b | 3 | 15.000 [14.000, 16.000] |", table)
        # The raw file keeps every step, each marked measured or not.
        with open(self.raw) as f:
            steps = [json.loads(l) for l in f if '"kind": "step"' in l]
        self.assertEqual(len(steps), 6 * 9)
        self.assertEqual(sum(s["measured"] for s in steps), 6 * 5)

    def test_the_title_says_when_the_protocol_was_cut_short(self):
        for rep in (1, 2):
            self.add(f"a{rep}", [1.0] * 7, config="a", repeat=rep)
        short = protocol.title(protocol.load_runs(self.raw), "T")
        self.assertTrue(short.startswith("# T: 2 interleaved repeats x 3 measured steps"), short)
        self.assertIn("FEWER", short)
        full = os.path.join(self.dir.name, "full.jsonl")
        self.raw = full
        for rep in range(1, 6):
            self.add(f"f{rep}", [1.0] * 24, config="a", repeat=rep)
        self.assertEqual(protocol.title(protocol.load_runs(full), "T"),
                         "# T: 5 interleaved repeats x 20 measured steps")

    def test_paired_compares_round_by_round_at_each_rate(self):
        # Round 1: b takes 0.8 of a's step and exposes a quarter; round 2: 0.9 and a half; round
        # 3's b failed, so round 3 is left out rather than paired with another round's b.
        for rep, (step_b, exposed_b) in enumerate([(8.0, 0.25), (9.0, 0.5)], start=1):
            self.add(f"a{rep}", [10.0] * 5, [1.0] * 5, skip=1, rate="1gbit", config="a", repeat=rep)
            self.add(f"b{rep}", [step_b] * 5, [exposed_b] * 5, skip=1, rate="1gbit", config="b", repeat=rep)
        self.add("a3", [10.0] * 5, [1.0] * 5, skip=1, rate="1gbit", config="a", repeat=3)
        self.add("b3", [1.0] * 2, skip=1, rate="1gbit", config="b", repeat=3, status="failed")
        table = protocol.paired(protocol.load_runs(self.raw), "rate", "a", "b")
        self.assertIn("| 1gbit | 2 | x0.850 [0.800, 0.900] | x0.375 [0.250, 0.500] | 62.5 [50.0, 75.0] % |", table)

    def test_a_peer_without_exposed_communication_is_not_read_as_none_exposed(self):
        # pipeline_peer.py's steps carry no exposed_comm_seconds: its run has no exposed figure, and
        # paired leaves that column empty instead of calling all of the base's hidden.
        path = os.path.join(self.dir.name, "peer.jsonl")
        with open(path, "w") as f:
            for i, loss in enumerate([10.0, 9.0, 8.0], start=1):
                f.write(json.dumps({"step": i, "loss": loss * (1 + 1e-6), "step_seconds": 12.0}) + "\n")
        peer = protocol.record(self.raw, {"rate": "1gbit", "config": "peer", "repeat": 1}, 1, path)
        self.assertNotIn("exposed_s", peer)
        base = os.path.join(self.dir.name, "base.jsonl")
        with open(base, "w") as f:
            for i, loss in enumerate([10.0, 9.0, 8.0], start=1):
                f.write(json.dumps({"step": i, "loss": loss, "step_seconds": 10.0, "exposed_comm_seconds": 1.0}) + "\n")
        protocol.record(self.raw, {"rate": "1gbit", "config": "base", "repeat": 1}, 1, base)
        table = protocol.paired(protocol.load_runs(self.raw), "rate", "base", "peer")
        self.assertIn("| 1gbit | 1 | x1.200 | x- | - |", table)
        self.assertIn("1.0e-06 [1.0e-06, 1.0e-06] over 1 rounds", protocol.losses(self.raw, "base", "peer"))

    def test_a_failed_run_is_counted_not_measured(self):
        self.add("ok", [1.0] * 6, config="a", repeat=1)
        self.add("bad", [1.0] * 3, config="a", repeat=2, status="failed",
                 log="error: out of device memory: CPU tensor memory limit reached (training.memory_limit_mib)\n")
        s = protocol.summarize(protocol.load_runs(self.raw), {"config": "a"})
        self.assertEqual(s["runs"], 1)
        self.assertEqual(len(s["failed"]), 1)
        self.assertIn("out of device memory", s["failed"][0])
        # A run that stopped before its measured steps is a failure even if it exited 0.
        run = self.add("short", [1.0] * 4, config="b", repeat=1)
        self.assertEqual(run["status"], "failed")

    def test_the_log_facts(self):
        facts = protocol.parse_trainer_log(LOG)
        self.assertEqual(facts["params_mib"], 95.5)
        self.assertEqual(facts["predicted_compiled_s"], 4.785)
        self.assertEqual(facts["fitted_eager_s"], 6.6643)
        self.assertEqual(facts["predicted_peak_mib"], 1582)
        self.assertEqual(facts["static_mib"], 382)
        self.assertEqual(facts["budget_mib"], 1286)
        self.assertEqual(facts["done_step_peak_mib"], 1523)
        self.assertEqual(facts["peak_rss_mib"], 2417)
        self.assertEqual(facts["exposed_run_s"], 7.77)
        self.assertFalse(facts["replan_new_plan"])
        self.assertEqual(facts["plan_choices"], ["3 of 12 layers kept gathered"])

    def test_lib_sh_interleaves_the_configurations_round_by_round(self):
        out = subprocess.run(["bash", "-c", f"""
            set -euo pipefail
            source {ROOT}/bench/lib.sh
            REPEATS=3 MEASURED=20 bench_protocol_sizes
            say() {{ printf '%s%s ' "$1" "$2"; [ "$1$2" != B2 ]; }}
            bench_interleave say A B C 2>/dev/null
            """], capture_output=True, text=True, check=True).stdout
        self.assertEqual(out.split(), ["A1", "B1", "C1", "A2", "B2", "C2", "A3", "B3", "C3"])
        bad = subprocess.run(["bash", "-c", f"source {ROOT}/bench/lib.sh; REPEATS=x bench_protocol_sizes"],
                             capture_output=True, text=True)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("REPEATS 'x'", bad.stderr)


class Netlab(RawRecords):
    def point(self, rate, config, mode, step, exposed, peak, reps=2, predicted=None, budget=None):
        for rep in range(1, reps + 1):
            log = LOG.replace("predicted step 4.7850", f"predicted step {predicted}") if predicted else ""
            tags = {"rate": rate, "config": config, "mode": mode, "repeat": rep}
            if budget:
                tags["budget_mib"] = budget
            self.add(f"{rate}-{config}-{rep}", [99] * 4 + [step + 0.01 * rep] * 3, [9] * 4 + [exposed] * 3,
                     [peak] * 7, log=log, **tags)

    def test_pareto_says_where_a_compiled_point_does_not_dominate(self):
        self.point("1gbit", "eager-reshard", "eager", 6.0, 2.0, 1668)
        self.point("1gbit", "eager-keep", "eager", 5.0, 1.5, 1900)
        self.point("1gbit", "sched-vs-reshard", "compiled", 5.5, 0.7, 1600, budget=1286)
        self.point("1gbit", "full-vs-keep", "compiled", 4.0, 0.2, 1950, budget=1500)
        self.point("1gbit", "sched-vs-keep", "compiled", 4.2, 0.7, 1800, budget=1500)
        self.point("1gbit", "full-vs-reshard", "compiled", 4.5, 0.3, 1500, budget=1286)
        out = pareto.report(protocol.load_runs(self.raw))
        self.assertIn("**1gbit**: **not everywhere**", out)
        self.assertIn("sched-vs-reshard against eager-keep (no: step +10.0%)", out)
        self.assertIn("full-vs-keep against eager-reshard (no: peak +282 MiB)", out)
        self.assertIn("| full-vs-reshard | yes, beyond the spread | yes, beyond the spread |", out)
        # Best eager is eager-keep (5.0 s): sched-vs-keep exposes 0.7 / 1.5 at less peak, full-vs-keep
        # steps 4.0 / 5.0 = 0.8x but holds 50 MiB more: not met.
        self.assertRegex(out, r"\| 1gbit \| eager-keep .*\| 0\.467x \(sched-vs-keep\) \| -100 MiB \| \*\*met\*\* "
                              r"\| 0\.801x \(full-vs-keep\) \| \+50 MiB \| \*\*not met\*\* \|")

    def test_simulator_errors_out_of_sample_and_from_the_logs(self):
        self.point("1gbit", "eager-reshard", "eager", 6.0, 2.0, 1668)
        self.point("1gbit", "full-vs-reshard", "compiled", 4.0, 0.2, 1500, predicted=4.4, budget=1286)
        self.point("4gbit", "eager-reshard", "eager", 4.0, 0.5, 1668)
        self.point("4gbit", "full-vs-reshard", "compiled", 3.0, 0.1, 1500, predicted=3.3, budget=1286)
        runs = protocol.load_runs(self.raw)
        # From the logs: run 1's 4.4 against run 2's 4.02 and run 2's 4.4 against run 1's 4.01, at both rates.
        others, own = simulator_oos.in_log_predictions(runs)
        self.assertEqual(len(others), 4)
        self.assertAlmostEqual(sorted(others)[-1], 4.4 / 4.01 - 1)
        self.assertEqual(len(own), 4)
        no_cxx = simulator_oos.report(runs, "/nonexistent", "1gbit", "full-vs-reshard", 1)
        self.assertIn("**Not out of sample yet**", no_cxx)
        self.assertNotIn("6.6643", no_cxx)  # the fitted eager figure is never shown

        # A stand-in meshwork-simulate: eager 6 s and compiled 4 s at the calibration's rate, the
        # communication part (1 s) divided by --link-scale.
        stub = os.path.join(self.dir.name, "simulate")
        with open(stub, "w") as f:
            f.write(textwrap.dedent("""\
            #!/usr/bin/env python3
            import sys
            a = sys.argv[1:]
            if "--help" in a:
                print("  --calibration FILE"); sys.exit(0)
            assert open(a[a.index("--calibration") + 1]).read() == "meshwork-calibration 1\\n"
            k = float(a[a.index("--link-scale") + 1])
            print(f"eager:    step {5 + 1 / k:.4f} s | exposed comm 1 s")
            print(f"compiled: step {3 + 1 / k:.4f} s | exposed comm 0.1 s")
            """))
        os.chmod(stub, 0o755)
        with open(self.raw) as f:
            lines = [json.loads(l) for l in f]
        for r in lines:
            if r["kind"] == "run" and r["mode"] == "compiled":
                r["calibration"] = "meshwork-calibration 1\n"
        with open(self.raw, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in lines)
        runs = protocol.load_runs(self.raw)
        cal = next(r for r in runs if r["rate"] == "1gbit" and r["config"] == "full-vs-reshard" and r["repeat"] == 1)
        predicted = simulator_oos.out_of_sample(runs, stub, cal)
        self.assertEqual(len(predicted), 7)  # every ok run but the calibration's
        by = {(r["rate"], r["config"], r["repeat"]): p for r, p in predicted}
        self.assertAlmostEqual(by[("4gbit", "eager-reshard", 1)], 5.25)
        self.assertAlmostEqual(by[("1gbit", "full-vs-reshard", 2)], 4.0)
        out = simulator_oos.report(runs, stub, "1gbit", "full-vs-reshard", 1)
        self.assertIn("Calibrated on one run", out)
        self.assertIn("| eager | 4 |", out)
        self.assertIn("| compiled | 3 |", out)
        self.assertIn("Target (median error within 10%), eager: **not met**", out)  # 4 Gbit/s: 5.25 s against 4.01 s


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
