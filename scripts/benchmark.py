#!/usr/bin/env python
"""Benchmarks trainer against hand-written loops, Keras fit and a single device.

  python scripts/benchmark.py --fast_paths         # every cell and variant (~20 min)
  python scripts/benchmark.py --quick --json=b.json
  python scripts/benchmark.py --models=cnn --datasets=synthetic --replicas=2 \
      --sections=streams,evaluation,startup,workers  # scripts/bench_sections.py
  python scripts/benchmark.py --variants= --sections=fit  # trainer.fit: bench_fit.py

Each variant runs in its own process (scripts/bench_variants.py) on the same model,
strategy, replica count, global batch, data pipeline and step count. Examples/s is
the median of timed windows after a warm-up that absorbs tracing; with --repeats the
variants are interleaved and the median of the repeats is reported, since a shared
2-core machine drifts. Also reported: time from process start to the end of the
first loop call, peak resident memory, the input pipeline alone, the quickstart
run's time to first step, and the fast-path flags.
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import bench_fit  # noqa: E402 (beside this file: the section `fit`)
import bench_sections  # noqa: E402 (beside this file)
from bench_sections import fmt  # noqa: E402

WORKER = os.path.join(REPO, "scripts", "bench_variants.py")
# The grid's variants (--variants); bench_sections runs the others.
VARIANTS = ("trainer", "trainer_quiet", "trainer_dataset", "seed_loop", "k_loop",
            "k_loop_outside", "keras_fit", "single_device", "orbit", "pipeline")
# (name, variant, extra worker flags): each fast-path flag, on one configuration.
FAST_PATHS = (("trainer", "trainer", []),
              ("trainer --mixed_precision=mixed_bfloat16", "trainer",
               ["--mixed_precision=mixed_bfloat16"]),
              ("trainer --mixed_precision=mixed_float16", "trainer",
               ["--mixed_precision=mixed_float16"]),
              ("trainer --jit_compile", "trainer", ["--jit_compile"]),
              ("trainer --steps_per_loop=0 (auto)", "trainer",
               ["--steps_per_loop=0", "--train_steps=1500"]))
# (ratio, target, replicas it applies to (None: every configuration)): issue 15's.
TARGETS = (("trainer / single_device", 0.95, 1), ("trainer / k_loop", 1.0, 2),
           ("trainer / keras_fit", 1.2, 2), ("trainer / orbit", 1.2, 2),
           ("trainer / trainer_dataset", 1.0, None))
QUICKSTART_TARGET_S = 5.0
ORBIT_INSTALL = "pip install --no-deps tf-models-official==2.20.0 tf-keras==2.21.0"


def _machine() -> dict:
  model = "unknown CPU"
  try:
    with open("/proc/cpuinfo") as f:
      model = next(line.split(":", 1)[1].strip() for line in f
                   if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  versions = subprocess.run(
      [sys.executable, "-c", "import tensorflow as tf, keras; "
       "print(tf.__version__, keras.__version__)"], capture_output=True, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), check=False).stdout.split()
  return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
          "tensorflow": versions[0] if versions else "?",
          "keras": versions[1] if len(versions) > 1 else "?"}


def run_variant(variant, *, model, dataset, replicas, args, extra=()):
  """Runs one variant process; returns its result dict (with "error" on failure)."""
  command = [sys.executable, WORKER, f"--variant={variant}", f"--model={model}",
             f"--dataset={dataset}", f"--replicas={replicas}",
             f"--per_replica_batch_size={args.per_replica_batch_size}",
             f"--steps_per_loop={args.steps_per_loop}", f"--windows={args.windows}",
             *extra]
  start = time.monotonic()
  result = bench_sections.run_process(command, args.timeout)
  if "error" in result:
    result = {"variant": variant, **result}
  result["process_seconds"] = round(time.monotonic() - start, 1)
  return result


def _keras_fit(model, dataset, replicas, args):
  """Keras fit with steps_per_execution = K, falling back to 1 if K fails."""
  result = run_variant("keras_fit", model=model, dataset=dataset, replicas=replicas,
                       args=args,
                       extra=[f"--steps_per_execution={args.steps_per_loop}"])
  if "error" in result:
    failed = result["error"]
    result = run_variant("keras_fit", model=model, dataset=dataset, replicas=replicas,
                         args=args, extra=["--steps_per_execution=1"])
    result["note"] = (f"steps_per_execution={args.steps_per_loop} failed ({failed}); "
                      "this is steps_per_execution=1")
  return result


def _median_of_repeats(results: list) -> dict:
  good = [r for r in results if "error" not in r]
  if not good:
    return dict(results[-1])
  merged = dict(good[-1])
  merged["examples_per_second"] = statistics.median(
      r["examples_per_second"] for r in good)
  merged["repeats"] = [round(r["examples_per_second"], 1) for r in good]
  return merged


def ratios(by_variant: dict) -> dict:
  """The issue's ratios for one configuration (None where a side is missing)."""
  out = {}
  for name in [t for t, _, _ in TARGETS] + ["k_loop / single_device",
                                            "k_loop_outside / k_loop",
                                            "trainer / trainer_quiet",
                                            "pipeline / trainer"]:
    top, bottom = (bench_sections.rate(by_variant.get(n.strip(), {}))
                   for n in name.split("/"))
    out[name] = bench_sections.ratio(top, bottom)
  return out


def benchmark_config(model, dataset, replicas, args, variants):
  per_variant = {v: [] for v in variants}
  for _ in range(args.repeats):  # Interleaved: drift hits every variant alike.
    for variant in variants:
      if variant == "keras_fit":
        result = _keras_fit(model, dataset, replicas, args)
      else:
        result = run_variant(variant, model=model, dataset=dataset,
                             replicas=replicas, args=args)
      per_variant[variant].append(result)
      _progress(model, dataset, replicas, result)
  merged = {v: _median_of_repeats(rs) for v, rs in per_variant.items()}
  return {"model": model, "dataset": dataset, "replicas": replicas,
          "global_batch": args.per_replica_batch_size * replicas,
          "variants": merged, "ratios": ratios(merged)}


def _progress(model, dataset, replicas, result):
  speed = result.get("examples_per_second")
  what = f"{speed:,.0f} examples/s" if speed else result.get("error")
  print(f"  {model} {dataset} x{replicas} {result['variant']}: {what}", file=sys.stderr,
        flush=True)


def quickstart_time_to_first_step(args) -> dict:
  """`python -m trainer.main --flagfile=flags/quickstart.flags`: its first step."""
  with tempfile.TemporaryDirectory() as model_dir:
    start = time.monotonic()
    process = subprocess.run(
        [sys.executable, "-m", "trainer.main", "--flagfile=flags/quickstart.flags",
         f"--model_dir={model_dir}"], cwd=REPO, capture_output=True, text=True,
        timeout=args.timeout, check=False)
    wall = time.monotonic() - start
    try:
      with open(os.path.join(model_dir, "results.json")) as f:
        results = json.load(f)
    except OSError:
      return {"error": f"exit {process.returncode}: {process.stderr[-300:]}"}
  return {"time_to_first_step_s": results["time_to_first_step_s"],
          "peak_rss_mib": results["peak_rss_mib"], "wall_s": round(wall, 1),
          "examples_per_second": results.get("examples_per_second")}


def fast_paths(args) -> list:
  rows = []
  for name, variant, extra in FAST_PATHS:
    runs = [run_variant(variant, model="cnn", dataset="synthetic", replicas=2,
                        args=args, extra=extra) for _ in range(args.repeats)]
    result = _median_of_repeats(runs)
    result["name"] = name
    rows.append(result)
    speed = result.get("examples_per_second") or result.get("error")
    print(f"  fast path {name}: {speed}",
          file=sys.stderr, flush=True)
  return rows


def render(report: dict) -> str:
  """The report as the plain-text tables docs/performance.md shows."""
  m = report["machine"]
  lines = [f"machine: {m['cpu']}, {m['cores']} cores; TensorFlow {m['tensorflow']}, "
           f"Keras {m['keras']}, Python {m['python']}",
           f"settings: per-replica batch {report['settings']['per_replica_batch_size']}"
           f", K={report['settings']['steps_per_loop']} steps per call/window, "
           f"{report['settings']['windows']} windows, {report['settings']['repeats']}"
           " repeat(s)", "",
           "| model | data | replicas | variant | examples/s | first call s | "
           "peak RSS MiB | note |", "|---|---|---|---|---|---|---|---|"]
  if not report["configs"]:  # --variants= : the sections alone.
    return "\n".join(lines[:2])
  for config in report["configs"]:
    for variant, r in config["variants"].items():
      lines.append(
          f"| {config['model']} | {config['dataset']} | {config['replicas']} | "
          f"{variant} | {fmt(r.get('examples_per_second'))} | "
          f"{fmt(r.get('time_to_first_call_s'), '.1f')} | "
          f"{fmt(r.get('peak_rss_mib'), '.0f')} | "
          f"{r.get('error') or r.get('note') or ''} |")
  lines += ["", "| model | data | replicas | " +
            " | ".join(report["configs"][0]["ratios"]) + " |",
            "|---|---|---|" + "---|" * len(report["configs"][0]["ratios"])]
  for config in report["configs"]:
    lines.append(f"| {config['model']} | {config['dataset']} | {config['replicas']} | "
                 + " | ".join(fmt(v, ".2f") for v in config["ratios"].values())
                 + " |")
  lines += ["", "targets: " + ", ".join(
      f"{n} >= {t}" + (f" ({r} replica(s))" if r else "") for n, t, r in TARGETS)]
  for name, target, replicas in TARGETS:
    values = [c["ratios"][name] for c in report["configs"] if c["ratios"][name] and
              replicas in (None, c["replicas"])]
    if values:
      met = sum(v >= target for v in values)
      lines.append(f"  {name}: {met} of {len(values)} configurations meet {target} "
                   f"(min {min(values):.2f}, max {max(values):.2f})")
  if report.get("quickstart"):
    q = report["quickstart"]
    first_step = fmt(q.get("time_to_first_step_s"), ".1f")
    rss = fmt(q.get("peak_rss_mib"), ".0f")
    lines.append(f"quickstart: time to first step {first_step}"
                 f" s (target <= {QUICKSTART_TARGET_S:g}), peak RSS {rss} MiB, "
                 f"whole run {fmt(q.get('wall_s'), '.1f')} s")
  if report.get("fast_paths"):
    lines += ["", "| fast path (cnn, synthetic, 2 replicas) | examples/s | note |",
              "|---|---|---|"]
    for r in report["fast_paths"]:
      lines.append(f"| {r['name']} | {fmt(r.get('examples_per_second'))} | "
                   f"{r.get('error') or ''} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="cnn,resnet")
  parser.add_argument("--datasets", default="synthetic,digits")
  parser.add_argument("--replicas", default="1,2,4")
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--per_replica_batch_size", type=int, default=32)
  parser.add_argument("--steps_per_loop", type=int, default=20)
  parser.add_argument("--windows", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--fast_paths", action="store_true",
                      help="also benchmark the fast-path flags (cnn, 2 replicas)")
  parser.add_argument("--quick", action="store_true",
                      help="cnn, synthetic, 2 replicas, short windows: a smoke run")
  sections_known = (*bench_sections.SECTIONS, bench_fit.SECTION)
  parser.add_argument("--sections", default="",
                      help="also: " + ",".join(sections_known) +
                      " (scripts/bench_sections.py, bench_fit.py)")
  parser.add_argument("--timeout", type=int, default=600)
  parser.add_argument("--json", help="also write the report here")
  args = parser.parse_args(argv)
  if args.quick:
    args.models, args.datasets, args.replicas = "cnn", "synthetic", "2"
    args.steps_per_loop, args.windows, args.repeats = 5, 2, 1
  sections = [name for name in args.sections.split(",") if name]
  unknown = sorted(set(sections) - set(sections_known))
  if unknown:
    parser.error(f"--sections: unknown {', '.join(unknown)}; use "
                 f"{', '.join(sections_known)}")
  variants = [name for name in args.variants.split(",") if name]  # "": no grid.
  if "orbit" in variants and importlib.util.find_spec("orbit") is None:
    variants.remove("orbit")  # Optional: its install line is in docs/performance.md.
    print(f"orbit: not installed, skipped ({ORBIT_INSTALL})", file=sys.stderr)
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    parser.error(f"--variants: unknown {', '.join(unknown)}; use {', '.join(VARIANTS)}")
  report = {"machine": _machine(), "settings": vars(args), "configs": []}
  for model in args.models.split(",") if variants else ():
    for dataset in args.datasets.split(","):
      for replicas in (int(r) for r in args.replicas.split(",")):
        report["configs"].append(benchmark_config(model, dataset, replicas, args,
                                                  variants))
  report["quickstart"] = quickstart_time_to_first_step(args)
  if args.fast_paths:
    report["fast_paths"] = fast_paths(args)
  report["sections"] = bench_fit.run_sections(
      sections, args=args, quickstart=lambda: quickstart_time_to_first_step(args),
      run_variant=run_variant)
  text = "\n".join([render(report), *bench_sections.render(report["sections"])])
  print(text)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
