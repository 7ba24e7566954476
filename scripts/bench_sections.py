"""scripts/benchmark.py's sections beyond the variant grid (--sections=...).

  streams     TFRecord files (digits as PNG: decode-bound; synthetic 28x28 float32
              as raw bytes: model-bound) and an unbatched tf.data.Dataset task:
              trainer against Keras fit on the usual pipeline, and against the
              trainer on the same examples as in-memory arrays; the task also
              with --fused_optimizer=false (Keras's own Adam ops, as Keras fit
              updates), to show the loop's margin apart from the fused kernel
  evaluation  in-training evaluations and --mode=eval against Keras evaluate on the
              same split, model and strategy; evaluation against training speed;
              the time evaluations add to a run
  startup     the quickstart's time to first step minus `import tensorflow` alone
  workers     2 worker processes x 1 replica (gRPC collectives on 127.0.0.1)
              against 1 process x 2 replicas, on the same global batch, and
              against the hand-written MultiWorkerMirroredStrategy K-step loop and
              Keras fit on the same 2 workers
  programs    ported Keras programs against the originals (scripts/bench_programs.py):
              keras-io's image classification from a folder of JPEGs, with
              its augmentation in the dataset (the port per example, and on
              the original's batched dataset) and in the model; and its text
              classification, Task.preprocess run once and per batch
  plain_records  a plain 1,200-step run (results.json's examples/s, 2 replicas,
              digits, cnn) on TFRecord files against the same digits as arrays
  batchnorm   what synchronised BatchNormalization costs: the resnet with
              --task.batchnorm, its statistics over the global batch (the
              default) against each replica's (--sync_batchnorm=false), and the
              resnet without BatchNormalization, on 2 replicas
  history     what the train loop's summary rows cost: the trainer with its
              default points (about 100 per run: a row every 2 steps here)
              against none inside calls (--summary_every above the run), on
              the default run's digits and the cnn cell's synthetic data

Each ratio is measured side by side in one invocation, every variant in its own
process: streams, evaluation, start-up and history take the median of --repeats
runs (at least 3 for start-up and history; workers run once), in rounds of one
run of each variant, so that a slow spell of the machine hits every side alike.
Streams and start-up also give the ratio of the fastest repeats, a quiet
machine's estimate where some processes run at half speed. Nothing here is
asserted by a test.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("streams", "evaluation", "startup", "workers", "history", "batchnorm",
            "programs", "plain_records")
# (ratio name, target): the performance issue's.
TARGETS = {"trainer / keras_fit_records": 1.3, "trainer_tfdata / keras_fit_tfdata": 1.3,
           "records / arrays": 0.9, "trainer_tfdata / arrays": 0.9,
           "eval / keras_evaluate": 1.2, "eval_mode / keras_evaluate": 1.2,
           "eval / train": 1.5, "startup_minus_import_s": 1.0,
           "rows / no rows": 0.98, "records / arrays (plain run)": 0.9,
           "2 workers / 1 process": 0.9, "2 workers / hand loop": 2.0,
           # Any variant of the programs against the original's Keras fit.
           "* / keras_fit": 1.2}
# The tf.data task with Keras's element-wise Adam (--fused_optimizer=false), as the
# Keras peers update: shown, no target.
UNFUSED = "trainer_tfdata (Keras's Adam ops)"


def process_result(output: str, returncode: int, errors: str) -> dict:
  """The dict of a benchmark process's last `BENCHMARK_RESULT {json}` line in
  `output`; without one, {"error": its exit code and the last line of `errors`}."""
  lines = [line for line in output.splitlines()
           if line.startswith("BENCHMARK_RESULT ")]
  if lines:
    return json.loads(lines[-1].split(" ", 1)[1])
  tail = (errors.strip().splitlines() or ["no output"])[-1]
  return {"error": f"exit {returncode}: {tail[:300]}"}


def run_process(command, timeout: float) -> dict:
  """Runs a benchmark process (scripts/bench_variants.py, bench_programs.py) in
  the repository, TensorFlow's C++ logs quiet: its result (process_result)."""
  process = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                           timeout=timeout, check=False)
  return process_result(process.stdout, process.returncode, process.stderr)


def rate(result):
  """A variant's examples/s, or None (it failed or measured nothing)."""
  value = result.get("examples_per_second")
  return value if isinstance(value, (int, float)) and value > 0 else None


def fastest_rate(result):
  """A variant's fastest repeat (examples/s), or None: on a VM that runs some
  processes at half speed for their whole life, the fastest of the repeats
  estimates a quiet machine, where the median can land on a slow one."""
  return max(result.get("repeats") or [rate(result) or 0]) or None


def ratio(top, bottom):
  """top / bottom to 3 decimals, or None where a side is missing."""
  return round(top / bottom, 3) if top and bottom else None


def _make_records(out, *flags):
  subprocess.run([sys.executable, os.path.join(REPO, "scripts", "make_tfrecords.py"),
                  f"--out={out}", *flags], check=True, capture_output=True)
  return os.path.join(out, "train-*")


def streams(run_variant, args, scratch) -> list:
  """Per data set: trainer on TFRecords, Keras fit on the usual pipeline, trainer
  on arrays; and (synthetic) the tf.data task against Keras fit on it."""
  rows = []
  # make_tfrecords.py writes synthetic's default 2,048 examples: the arrays too.
  cases = (("digits", ["--dataset=digits", "--format=png", "--shards=8"]),
           ("synthetic", ["--dataset=synthetic", "--format=raw", "--shards=8"]))
  for dataset, flags in cases:
    files = _make_records(os.path.join(scratch, dataset), *flags)
    common = dict(model="cnn", dataset=dataset, replicas=2, args=args)
    arrays = ["--synthetic_examples=2048"]
    steps = [f"--steps_per_execution={args.steps_per_loop}"]
    specs = {
        "trainer (records)": dict(variant="trainer", extra=[f"--train_files={files}"],
                                  **common),
        "keras_fit_records": dict(variant="keras_fit_records",
                                  extra=[f"--train_files={files}", *steps], **common),
        "trainer (arrays)": dict(variant="trainer", extra=arrays, **common)}
    if dataset == "synthetic":
      specs["trainer_tfdata"] = dict(variant="trainer_tfdata", extra=arrays, **common)
      # Without the fused Adam kernel: the loop's own margin over Keras fit.
      specs[UNFUSED] = dict(variant="trainer_tfdata",
                            extra=[*arrays, "--fused_optimizer=false"], **common)
      specs["keras_fit_tfdata"] = dict(variant="keras_fit_tfdata",
                                       extra=[*arrays, *steps], **common)
    variants = interleaved(run_variant, args.repeats, specs)
    rows.append({"dataset": dataset, "variants": variants,
                 "ratios": _stream_ratios({n: rate(r) for n, r in variants.items()}),
                 "fastest_ratios": _stream_ratios(
                     {n: fastest_rate(r) for n, r in variants.items()})})
  return rows


def _stream_ratios(speed: dict) -> dict:
  """The streams section's ratios of its variants' `speed`s."""
  ratios = {"trainer / keras_fit_records": ratio(speed["trainer (records)"],
                                                  speed["keras_fit_records"]),
            "records / arrays": ratio(speed["trainer (records)"],
                                       speed["trainer (arrays)"])}
  if "trainer_tfdata" in speed:
    ratios["trainer_tfdata / keras_fit_tfdata"] = ratio(speed["trainer_tfdata"],
                                                         speed["keras_fit_tfdata"])
    ratios["trainer_tfdata / arrays"] = ratio(speed["trainer_tfdata"],
                                               speed["trainer (arrays)"])
  if UNFUSED in speed:
    ratios[f"{UNFUSED} / keras_fit_tfdata"] = ratio(speed[UNFUSED],
                                                    speed["keras_fit_tfdata"])
  return ratios


def evaluation(run_variant, args) -> dict:
  """The trainer's evaluations against Keras evaluate (synthetic, 16,384 train and
  2,048 eval examples, cnn, 2 replicas)."""
  common = dict(model="cnn", dataset="synthetic", replicas=2, args=args,
                extra=["--synthetic_examples=16384",
                       f"--steps_per_execution={args.steps_per_loop}"])
  # Training alone: trainer_eval's own training rate counts its evaluations.
  variants = interleaved(run_variant, args.repeats, {
      "trainer_eval": dict(variant="trainer_eval", **common),
      "keras_evaluate": dict(variant="keras_evaluate", **common),
      "trainer (training alone)": dict(variant="trainer", **common)})
  ours, keras_ = variants["trainer_eval"], variants["keras_evaluate"]
  return {"variants": variants,
          "ratios": {
              "eval / keras_evaluate": ratio(rate(ours), rate(keras_)),
              "eval_mode / keras_evaluate": ratio(
                  ours.get("eval_mode_examples_per_second"),
                  keras_.get("first_call_examples_per_second")),
              "eval / train": ratio(rate(ours), rate(
                  variants["trainer (training alone)"])),
              "eval_share_of_run": ours.get("eval_share_of_run")}}


def startup(quickstart, repeats=3) -> dict:
  """`import tensorflow` alone against the quickstart's time to first step
  (`quickstart()`'s), each the median of `repeats` fresh processes, interleaved."""
  imports, quickstarts = [], []
  # Timed by the process itself with the clock results.json's time to first step
  # uses (from the process's start: its interpreter start counts in both).
  script = ("from trainer.outputs.process_stats import seconds_since_process_start"
            "\nimport tensorflow\nprint(seconds_since_process_start())")
  for _ in range(max(3, repeats)):
    imported = subprocess.run([sys.executable, "-c", script], check=True, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                              capture_output=True, cwd=REPO)
    imports.append(float(imported.stdout.strip().splitlines()[-1]))
    quickstarts.append(quickstart())
  timed = sorted((q for q in quickstarts if q.get("time_to_first_step_s")),
                 key=lambda q: q["time_to_first_step_s"])
  first = timed[(len(timed) - 1) // 2] if timed else quickstarts[-1]
  ttfs = first.get("time_to_first_step_s")
  imported = statistics.median(imports)
  fastest = (round(timed[0]["time_to_first_step_s"] - min(imports), 2) if timed
             else None)
  return {"import_tensorflow_s": round(imported, 2), "quickstart": first,
          "ratios": {"startup_minus_import_s": None if ttfs is None
                     else round(ttfs - imported, 2)},
          "fastest_ratios": {"startup_minus_import_s": fastest}}


def workers(args, scratch) -> dict:
  """trainer as 2 workers x 1 replica (gRPC collectives on 127.0.0.1) against 1
  process x 2 replicas, and against the peers on the same 2 workers: TensorFlow's
  own custom-loop recipe (a hand-written MultiWorkerMirroredStrategy K-step loop)
  and Keras fit (which fails under that strategy: its error is the result). The
  same cnn, synthetic data, global batch and steps; variants in rounds."""
  steps = args.steps_per_loop * (2 + args.windows)
  flags = ["--model=cnn", "--dataset=synthetic", "--synthetic_shape=28,28,1",
           f"--per_replica_batch_size={args.per_replica_batch_size}",
           f"--steps_per_loop={args.steps_per_loop}", f"--train_steps={steps}",
           "--checkpoint_every=1000000", "--mode=train"]
  runs = {"1 process x 2 replicas": lambda i: _trainer_run(
              [sys.executable, "-m", "trainer.main", *flags, "--cpu_devices=2"],
              os.path.join(scratch, f"one-{i}"), args),
          "2 workers x 1 replica": lambda i: _trainer_run(
              [sys.executable, os.path.join(REPO, "scripts", "launch_workers.py"),
               "--num_workers=2", "--", *flags, "--cpu_devices=1"],
              os.path.join(scratch, f"two-{i}"), args),
          "hand-written MWMS K-step loop (2 workers)": lambda i: _two_worker_variant(
              "k_loop", args),
          "keras_fit (2 workers)": lambda i: _two_worker_variant("keras_fit", args)}
  counter = iter(range(10**6))
  variants = interleaved(lambda *, name: runs[name](next(counter)),
                         max(1, args.repeats), {name: dict(name=name) for name in runs})
  speed = {name: rate(result) for name, result in variants.items()}
  two = speed["2 workers x 1 replica"]
  return {"variants": variants, "ratios": {
      "2 workers / 1 process": ratio(two, speed["1 process x 2 replicas"]),
      "2 workers / hand loop": ratio(two, speed[
          "hand-written MWMS K-step loop (2 workers)"])}}


def _trainer_run(command, model_dir, args) -> dict:
  """A trainer command's speed from its results.json (median of its calls)."""
  process = subprocess.run([*command, f"--model_dir={model_dir}"], cwd=REPO,
                           capture_output=True, text=True,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                           timeout=args.timeout, check=False)
  try:
    with open(os.path.join(model_dir, "results.json")) as f:
      data = json.load(f)
    return {"examples_per_second": data["examples_per_second_median"],
            "time_to_first_call_s": data["time_to_first_step_s"]}
  except (OSError, KeyError, ValueError):
    tail = ((process.stdout + process.stderr).strip().splitlines() or
            ["no output"])[-1]
    return {"error": f"exit {process.returncode}: {tail[:300]}"}


def _two_worker_variant(variant, args) -> dict:
  """A scripts/bench_variants.py variant run as both workers of a local
  MultiWorkerMirroredStrategy cluster; the chief's result."""
  from trainer.distribute import launcher
  ports = launcher.free_ports(2)
  command = [sys.executable, os.path.join(REPO, "scripts", "bench_variants.py"),
             f"--variant={variant}", "--strategy=multi_worker", "--model=cnn",
             "--dataset=synthetic", "--replicas=1",
             f"--per_replica_batch_size={args.per_replica_batch_size}",
             f"--steps_per_loop={args.steps_per_loop}",
             f"--steps_per_execution={args.steps_per_loop}",
             f"--windows={args.windows}"]
  processes = [subprocess.Popen(
      command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               TF_CONFIG=launcher.tf_config(ports, index))) for index in range(2)]
  try:
    outputs = [p.communicate(timeout=args.timeout)[0] for p in processes]
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {args.timeout} s"}
  finally:
    for process in processes:
      process.kill()
  return process_result(outputs[0], processes[0].returncode, outputs[0])


def history(run_variant, args) -> list:
  """The trainer with and without summary rows inside its calls, interleaved
  over --repeats (at least 3), the median of each."""
  rows = []
  for dataset in ("digits", "synthetic"):
    variants = interleaved(run_variant, max(3, args.repeats), {
        name: dict(variant="trainer", model="cnn", dataset=dataset, replicas=2,
                   args=args, extra=[f"--summary_every={every}"])
        for name, every in (("rows", 0), ("no rows", 10**9))})
    rows.append({"dataset": dataset, "variants": variants, "ratios": {
        "rows / no rows": ratio(rate(variants["rows"]), rate(variants["no rows"]))}})
  return rows


def batchnorm(run_variant, args) -> dict:
  """The resnet (synthetic 28x28) with BatchNormalization synchronised over the
  replicas, per replica, and without it: 2 replicas, interleaved over --repeats."""
  common = dict(variant="trainer", model="resnet", dataset="synthetic", replicas=2,
                args=args)
  variants = interleaved(run_variant, args.repeats, {
      name: dict(common, extra=[f"--batchnorm={mode}"])
      for name, mode in (("BatchNorm synced", "sync"),
                         ("BatchNorm per replica", "per_replica"),
                         ("no BatchNorm", "none"))})
  speed = {name: rate(result) for name, result in variants.items()}
  return {"variants": variants, "ratios": {
      "synced / per replica": ratio(speed["BatchNorm synced"],
                                    speed["BatchNorm per replica"]),
      "synced / no BatchNorm": ratio(speed["BatchNorm synced"],
                                     speed["no BatchNorm"])}}


def run_program(args, *, program, variant, **options) -> dict:
  """One scripts/bench_programs.py process: its result (with "error" on failure)."""
  script = os.path.join(REPO, "scripts", "bench_programs.py")
  return run_process([sys.executable, script, f"--program={program}",
                      f"--variant={variant}",
                      *[f"--{name}={value}" for name, value in options.items()]],
                     args.timeout)


def programs(args, scratch) -> list:
  """The ported programs against the originals, each group in rounds."""
  sys.path.insert(0, os.path.join(REPO, "scripts"))
  import bench_programs
  images = os.path.join(scratch, "jpegs")
  bench_programs.make_images(images)
  run = lambda **spec: run_program(args, **spec)  # noqa: E731
  groups = {
      "images, augmentation in the dataset": {
          "keras_fit": dict(program="images", variant="keras", data=images),
          "trainer (port, per example)": dict(program="images", variant="trainer",
                                              data=images),
          "trainer (the original's batched dataset)": dict(
              program="images", variant="trainer_batched", data=images)},
      "images, augmentation in the model": {
          name: dict(spec, augment="model") for name, spec in (
              ("keras_fit", dict(program="images", variant="keras", data=images)),
              ("trainer (port)", dict(program="images", variant="trainer",
                                      data=images)))},
      "text": {
          "keras_fit": dict(program="text", variant="keras"),
          "trainer (port)": dict(program="text", variant="trainer"),
          "trainer (--preprocess_once=false)": dict(
              program="text", variant="trainer",
              flags=json.dumps({"preprocess_once": False}))}}
  rows = []
  for name, specs in groups.items():
    variants = interleaved(run, args.repeats, specs)
    keras_fit = rate(variants["keras_fit"])
    rows.append({"dataset": name, "variants": variants, "ratios": {
        f"{variant} / keras_fit": ratio(rate(result), keras_fit)
        for variant, result in variants.items() if variant != "keras_fit"}})
  return rows


def plain_records(args, scratch) -> dict:
  """`python -m trainer.main`, 1,200 steps on 2 replicas (digits, cnn), on
  TFRecord files and on the same digits as arrays, in rounds: results.json's
  examples/s (the whole run after its first call)."""
  files = _make_records(os.path.join(scratch, "plain"), "--dataset=digits",
                        "--format=png", "--shards=8")
  sources = {"records": ["--dataset=tfrecord", f"--train_files={files}"],
             "arrays": ["--dataset=digits"]}
  runs = {name: [] for name in sources}
  for round_ in range(max(1, args.repeats)):
    for name, flags in sources.items():
      model_dir = os.path.join(scratch, f"plain-{name}-{round_}")
      subprocess.run([sys.executable, "-m", "trainer.main", *flags, "--model=cnn",
                      "--cpu_devices=2", "--train_steps=1200", "--mode=train",
                      f"--model_dir={model_dir}"], cwd=REPO, capture_output=True,
                     env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                     timeout=args.timeout, check=False)
      try:
        with open(os.path.join(model_dir, "results.json")) as f:
          runs[name].append(json.load(f)["examples_per_second"])
      except (OSError, KeyError, ValueError):
        pass
  variants = {name: ({"examples_per_second": statistics.median(speeds),
                      "repeats": [round(s) for s in sorted(speeds)]} if speeds
                     else {"error": "no results.json"})
              for name, speeds in runs.items()}
  return {"variants": variants, "ratios": {"records / arrays (plain run)": ratio(
      rate(variants["records"]), rate(variants["arrays"]))}}


def interleaved(run_variant, repeats: int, specs: dict) -> dict:
  """{name: the result of median rate (the lower middle of an even count), with
  every repeat's rate, slowest first} of each of `specs` ({name: run_variant's
  keyword arguments}), run `repeats` times in rounds of one run each: a slow
  spell of this VM (some processes run at half speed for their whole life) hits
  every variant alike, not one's repeats."""
  runs = {name: [] for name in specs}
  names = list(specs)
  for round_ in range(max(1, repeats)):
    # Each round starts one variant later: none always runs after the same one.
    shift = round_ % len(names)
    for name in names[shift:] + names[:shift]:
      runs[name].append(run_variant(**specs[name]))
  merged = {}
  for name, results in runs.items():
    measured = sorted((r for r in results if rate(r)), key=rate)
    merged[name] = (dict(measured[(len(measured) - 1) // 2],
                         repeats=[round(rate(r)) for r in measured])
                    if measured else results[-1])
  return merged


def run_sections(names, *, run_variant, quickstart, args) -> dict:
  """The named sections' results (their variants and ratios)."""
  out = {}
  with tempfile.TemporaryDirectory() as scratch:
    for name in names:
      print(f"  section {name}", file=sys.stderr, flush=True)
      if name == "streams":
        out[name] = streams(run_variant, args, scratch)
      elif name == "evaluation":
        out[name] = evaluation(run_variant, args)
      elif name == "startup":
        out[name] = startup(quickstart, args.repeats)
      elif name == "workers":
        out[name] = workers(args, scratch)
      elif name == "history":
        out[name] = history(run_variant, args)
      elif name == "batchnorm":
        out[name] = batchnorm(run_variant, args)
      elif name == "programs":
        out[name] = programs(args, scratch)
      elif name == "plain_records":
        out[name] = plain_records(args, scratch)
  return out


def _target(ratio: str):
  """The target of a ratio: its own, or a "* / NAME" one's."""
  if ratio in TARGETS:
    return TARGETS[ratio]
  return TARGETS.get("* / " + ratio.rsplit(" / ", 1)[-1])


def fmt(value, spec=",.0f"):
  """`value` in `spec`, or "-" for None."""
  return "-" if value is None else format(value, spec)


def render(sections: dict) -> list:
  """The sections' lines: a table of variants and each ratio with its target."""
  lines = []
  for name, section in sections.items():
    groups = section if isinstance(section, list) else [section]
    lines += ["", f"{name}:", "| data | variant | examples/s | first call s | note |",
              "|---|---|---|---|---|"]
    for group in groups:
      for variant, r in group.get("variants", {}).items():
        lines.append(f"| {group.get('dataset', '-')} | {variant} | "
                     f"{fmt(rate(r))} | {fmt(r.get('time_to_first_call_s'), '.1f')}"
                     f" | {r.get('error', '')} |")
    if name == "startup":
      q = section["quickstart"]
      lines.append(f"import tensorflow {section['import_tensorflow_s']} s; quickstart "
                   f"first step {q.get('time_to_first_step_s')} s, peak RSS "
                   f"{q.get('peak_rss_mib')} MiB")
    for group in groups:
      for ratio, value in group["ratios"].items():
        target = _target(ratio)
        verdict = ""
        if target is not None and value is not None:
          met = value <= target if ratio.endswith("_s") else value >= target
          verdict = f" (target {'<=' if ratio.endswith('_s') else '>='} {target}: " \
                    f"{'met' if met else 'not met'})"
        where = f"{group['dataset']}: " if "dataset" in group else ""
        fastest = group.get("fastest_ratios", {}).get(ratio)
        also = ("" if fastest is None else
                f"; of the fastest repeats {fmt(fastest, '.2f')}")
        lines.append(f"  {where}{ratio} = {fmt(value, '.2f')}{verdict}{also}")
  return lines
