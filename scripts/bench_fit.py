#!/usr/bin/env python
"""trainer.fit against Keras's own fit on the same Keras programs, examples/s:
scripts/benchmark.py's section `fit`, and the process each of its variants
runs in.

  python scripts/benchmark.py --variants= --sections=fit --repeats=3
  python scripts/bench_fit.py --program=fit_mnist_convnet.py --variant=trainer_fit

Each variant runs a program of examples/ (fit_*.py, keras-io's programs with
`trainer.fit`) as written, in its own process, on one device: `keras_fit` with
Keras's `model.fit` in trainer.fit's place (`build()` then `fit`: the program
before its port), `trainer_fit` as ported. A callback added to the program's
times its epoch ends, which both fits reach after the epoch's validation:
examples/s is the training examples of the epochs after the first (which
traces) over their time, each fit's own (Keras's last batch of an epoch is
partial, trainer's batches whole). The process prints one
`BENCHMARK_RESULT {json}` line. Nothing here is asserted by a test.
"""

import argparse
import json
import os
import runpy
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
PROGRAMS = ("fit_mnist_convnet.py", "fit_imbalanced.py",
            "fit_text_classification.py", "fit_weather_forecast.py")
VARIANTS = ("keras_fit", "trainer_fit")
SECTION = "fit"


def _epoch_examples(x, arguments) -> int:
  """The examples a fit trains on per epoch, before it rounds: the array's (less
  validation_split's), or a dataset's."""
  import tensorflow as tf
  if isinstance(x, tf.data.Dataset):
    return int(x.unbatch().reduce(0, lambda count, _: count + 1))
  count = len(x)
  return count - int(count * arguments.get("validation_split", 0.0))


def measured_fit(variant: str, marks: list, sizes: list):
  """A `trainer.fit` stand-in for the program: the variant's fit, with a
  callback noting each epoch's end (time) and the epoch's examples."""
  import keras

  import trainer

  real_fit = trainer.fit

  class EpochTimer(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
      marks.append(time.perf_counter())

  def fit(build, x=None, y=None, *, model_dir=None, **arguments):
    arguments["callbacks"] = [*arguments.get("callbacks", []), EpochTimer()]
    arguments["verbose"] = 0
    if variant == "trainer_fit":
      history = real_fit(build, x, y, model_dir=model_dir, **arguments)
      steps, batch = history.params["steps"], history.results["global_batch_size"]
      sizes.append(steps * batch)
      return history
    del model_dir
    keras.utils.set_random_seed(0)
    model = build()
    sizes.append(_epoch_examples(x, arguments))
    return model.fit(x, y, **arguments)

  return fit


def run(program: str, variant: str) -> dict:
  """Runs examples/PROGRAM with the variant's fit, in a scratch directory."""
  import trainer
  marks, sizes = [], []
  trainer.fit = measured_fit(variant, marks, sizes)
  path = os.path.join(EXAMPLES, program)
  with tempfile.TemporaryDirectory() as scratch:
    os.chdir(scratch)
    sys.argv = [path, f"--model_dir={os.path.join(scratch, 'run')}"]
    runpy.run_path(path, run_name="__main__")
  timed = len(marks) - 1
  return {"variant": variant, "program": program, "epochs_timed": timed,
          "examples_per_second": (timed * sizes[0] / (marks[-1] - marks[0])
                                  if timed > 0 else None)}


def section(args, run_process) -> list:
  """The `fit` section: each program's two variants in rounds (--repeats), as
  bench_sections' rows: {"dataset", "variants", "ratios"}."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import bench_sections

  def run_variant(program, variant):
    return run_process([sys.executable, os.path.abspath(__file__),
                        f"--program={program}", f"--variant={variant}"],
                       args.timeout)

  rows = []
  for program in PROGRAMS:
    variants = bench_sections.interleaved(
        run_variant, args.repeats,
        {variant: dict(program=program, variant=variant) for variant in VARIANTS})
    rows.append({"dataset": program, "variants": variants, "ratios": {
        "trainer_fit / keras_fit": bench_sections.ratio(
            bench_sections.rate(variants["trainer_fit"]),
            bench_sections.rate(variants["keras_fit"]))}})
  return rows


def run_sections(names, *, args, **kwargs) -> dict:
  """bench_sections.run_sections, with this module's section among them."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import bench_sections
  out = bench_sections.run_sections([n for n in names if n != SECTION], args=args,
                                    **kwargs)
  if SECTION in names:
    print(f"  section {SECTION}", file=sys.stderr, flush=True)
    out[SECTION] = section(args, bench_sections.run_process)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--program", choices=PROGRAMS, required=True)
  parser.add_argument("--variant", choices=VARIANTS, required=True)
  args = parser.parse_args(argv)
  print("BENCHMARK_RESULT " + json.dumps(run(args.program, args.variant)),
        flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
