"""scripts/benchmark.py: every variant runs and is reported (speed is never
asserted)."""

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO, cli_env

pytestmark = pytest.mark.slow  # Ten short benchmark processes: about a minute.


def _load_benchmark():
  spec = importlib.util.spec_from_file_location(
      "benchmark", os.path.join(REPO, "scripts", "benchmark.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_quick_benchmark_reports_every_variant(tmp_path):
  out = tmp_path / "bench.json"
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "benchmark.py"), "--quick",
       f"--json={out}"], cwd=REPO, env=cli_env(), capture_output=True, text=True,
      timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(out.read_text())
  [config] = report["configs"]
  assert (config["model"], config["dataset"], config["replicas"]) == ("cnn",
                                                                       "synthetic", 2)
  # Orbit is optional (not in the test extra): run where it is installed.
  orbit = {"orbit"} if importlib.util.find_spec("orbit") else set()
  assert set(config["variants"]) == {"trainer", "trainer_quiet", "trainer_dataset",
                                     "seed_loop", "k_loop", "k_loop_outside",
                                     "keras_fit",
                                     "single_device", "pipeline"} | orbit
  for name, variant in config["variants"].items():
    assert "error" not in variant, (name, variant)
    assert variant["examples_per_second"] > 0, name
    assert variant["peak_rss_mib"] > 100, name
    assert 0 < variant["time_to_first_call_s"] < 120, name
  for name, value in config["ratios"].items():  # A ratio wherever both sides ran.
    if all(side.strip() in config["variants"] for side in name.split("/")):
      assert isinstance(value, float), name
    else:
      assert value is None, name
  assert report["quickstart"]["time_to_first_step_s"] > 0
  assert report["machine"]["tensorflow"] not in ("", "?")
  for variant in config["variants"]:
    assert f"| cnn | synthetic | 2 | {variant} |" in result.stdout
  assert "trainer / k_loop: " in result.stdout


def test_ratios_and_targets_are_computed_from_the_medians():
  benchmark = _load_benchmark()
  variants = {"trainer": [{"variant": "trainer", "examples_per_second": s}
                          for s in (90.0, 100.0, 300.0)],
              "k_loop": [{"variant": "k_loop", "examples_per_second": 100.0}],
              "keras_fit": [{"variant": "keras_fit", "error": "boom"}]}
  merged = {v: benchmark._median_of_repeats(r)
            for v, r in variants.items()}
  assert merged["trainer"]["examples_per_second"] == 100.0
  assert merged["trainer"]["repeats"] == [90.0, 100.0, 300.0]
  ratios = benchmark.ratios(merged)
  assert ratios["trainer / k_loop"] == 1.0
  assert ratios["trainer / keras_fit"] is None  # A failed side is no ratio.


def test_profile_steps_tabulates_where_a_step_goes(tmp_path):
  out = tmp_path / "profile.json"
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "profile_steps.py"),
       "--datasets=digits", "--replicas=2", "--array_input=gather", f"--json={out}"],
      cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  [row] = json.loads(out.read_text())
  breakdown = row["profile"]
  assert breakdown["steps"] == 60 and breakdown["loop_calls"] == 3
  for part in ("input", "forward_backward", "optimizer"):
    # Every part's ops are found and attributed.
    assert breakdown["ops_per_step"][part] > 0, part
  # The digits' gradients are small: their sum on one device may run inline,
  # untraced, leaving only the all-reduce's copies in the trace.
  assert breakdown["ops_per_step"]["all_reduce"] + breakdown["ops_per_step"][
      "copies"] > 0
  for part in ("input", "forward_backward", "optimizer"):
    assert breakdown["op_ms_per_step"][part] > 0, part
  assert breakdown["host_ms_between_calls"] > 0
  assert "| cnn | digits | 2 | gather | " in result.stdout


def test_sections_report_each_ratio_against_its_target():
  import sys
  sys.path.insert(0, os.path.join(REPO, "scripts"))
  import bench_sections
  lines = bench_sections.render({
      "evaluation": {"variants": {"trainer_eval": {"examples_per_second": 300.0},
                                  "keras_evaluate": {"error": "exit 1: boom"}},
                     "ratios": {"eval / keras_evaluate": None, "eval / train": 1.2}},
      "startup": {"import_tensorflow_s": 3.0, "quickstart": {
          "time_to_first_step_s": 3.8, "peak_rss_mib": 700},
                  "ratios": {"startup_minus_import_s": 0.8},
                  "fastest_ratios": {"startup_minus_import_s": 0.7}}})
  assert "| - | trainer_eval | 300 | - |  |" in lines
  assert "| - | keras_evaluate | - | - | exit 1: boom |" in lines
  assert "  eval / keras_evaluate = -" in lines  # A side failed: no ratio.
  assert "  eval / train = 1.20 (target >= 1.5: not met)" in lines
  assert ("  startup_minus_import_s = 0.80 (target <= 1.0: met); of the fastest "
          "repeats 0.70") in lines


def test_the_fastest_repeats_give_a_quiet_machines_ratio():
  import sys
  sys.path.insert(0, os.path.join(REPO, "scripts"))
  import bench_sections
  # One half-speed process among 3 repeats: the median can land on it.
  assert bench_sections.fastest_rate({"examples_per_second": 9000.0,
                                      "repeats": [18743, 18601, 8884]}) == 18743
  assert bench_sections.fastest_rate({"examples_per_second": 9000.0}) == 9000.0
  assert bench_sections.fastest_rate({"error": "exit 1"}) is None


def test_sections_run_their_variants_in_rounds_and_keep_the_median():
  import sys
  sys.path.insert(0, os.path.join(REPO, "scripts"))
  import bench_sections
  calls = []
  speeds = {"a": iter([10.0, 30.0, 20.0]), "b": iter([5.0, None, 7.0])}

  def run_variant(*, variant):
    calls.append(variant)
    speed = next(speeds[variant])
    return {"examples_per_second": speed} if speed else {"error": "exit 1"}

  merged = bench_sections.interleaved(run_variant, 3, {"A": dict(variant="a"),
                                                       "B": dict(variant="b")})
  # Rounds, not runs of one; each round starts one variant later.
  assert calls == ["a", "b", "b", "a", "a", "b"]
  assert merged["A"] == {"examples_per_second": 20.0, "repeats": [10, 20, 30]}
  # A failed repeat counts nowhere: the lower middle of the two that measured.
  assert merged["B"] == {"examples_per_second": 5.0, "repeats": [5, 7]}


def test_a_process_knows_its_age_to_the_clock_tick():
  # results.json's time_to_first_step_s and the benchmarks' start-up use it. A
  # process's age from psutil's create_time() carries the boot time's fraction
  # of a second (Linux gives it in whole seconds): up to 1 s too old.
  script = ("import time\nfrom trainer.outputs.process_stats import "
            "seconds_since_process_start as age\nprint(time.monotonic(), age())")
  before = time.monotonic()
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=120, check=True)
  now, age = map(float, result.stdout.split())
  assert 0 < age <= now - before + 0.02  # It started after `before`; 10 ms ticks.
