#!/usr/bin/env python
"""One benchmark variant in its own process; prints one `BENCHMARK_RESULT {json}` line.

Run by scripts/benchmark.py. Every variant trains the same model (the
classification task's) on
the same tf.data pipeline (trainer.data: same data, global batch, order) under the
same strategy (trainer.distribute.devices), and times windows of
--steps_per_loop steps after
a warm-up window that absorbs tracing. A window ends at a host sync (a value read
back), so queued work cannot hide in it.

Variants:
  trainer        trainer.train(config), the public API (speed from its results.json:
                 wall clock between loop-call ends, so host work between calls counts)
  trainer_quiet  the same with --summaries=false (no summaries or progress lines)
  trainer_dataset  trainer with --array_input=dataset: the distributed iterator
                 instead of the in-graph gather
  seed_loop      hand-written: one strategy.run per tf.function call (the seed's shape)
  k_loop         hand-written: K steps per tf.function call (tf.range): the ceiling
  k_loop_outside the k_loop with trainer's step shape: the replicas return their
                 gradients, the outer function all-reduces them once
                 (batch_reduce_to) and applies them (k_loop applies them inside the
                 replica function)
  keras_fit      Keras 3 model.fit under the strategy, --steps_per_execution=E
  single_device  the K-step loop with no strategy, same global batch
  orbit          Orbit's Controller over a StandardTrainer (tf.while_loop of K
                 steps), the k_loop's step; needs `pip install --no-deps
                 tf-models-official==2.20.0 tf-keras==2.21.0`
  pipeline       the distributed input alone: next() K times per call, no model

With --train_files (TFRecord shards of scripts/make_tfrecords.py), `trainer` reads
them (--dataset=tfrecord: batched parsing) and `keras_fit_records` runs Keras fit
on the usual per-record pipeline over the same files and parse function
(TFRecordDataset -> map(parse, AUTOTUNE) -> shuffle -> batch -> prefetch).
  trainer_tfdata   trainer on a task whose train_data() is an unbatched
                   tf.data.Dataset of the same arrays
  keras_fit_tfdata Keras fit on that dataset: shuffle -> batch -> prefetch
  trainer_eval     trainer --mode=train_and_eval, an evaluation after every
                   window: the evaluations' examples/s (warm) and the time they
                   add; then --mode=eval on the run (one evaluation, tracing in)
  keras_evaluate   Keras evaluate on the same eval split, model and strategy
                   (batched as the trainer's global batch): warm examples/s, and
                   the first call's (tracing in)
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from trainer import tf_loader
from trainer.outputs.process_stats import peak_rss_mib, seconds_since_process_start

VARIANTS = ("trainer", "trainer_quiet", "trainer_dataset", "seed_loop", "k_loop",
            "k_loop_outside", "keras_fit", "single_device", "orbit", "pipeline",
            "keras_fit_records", "trainer_tfdata", "keras_fit_tfdata", "trainer_eval",
            "keras_evaluate")


def variant_config(args, **overrides):
  """The Config every variant trains (also scripts/profile_steps.py's runs)."""
  from trainer import config as config_lib
  values = dict(cpu_devices=args.replicas,
                per_replica_batch_size=args.per_replica_batch_size, optimizer="adam",
                learning_rate=1e-3, seed=0, steps_per_loop=args.steps_per_loop,
                mixed_precision=args.mixed_precision, jit_compile=args.jit_compile,
                summary_every=getattr(args, "summary_every", 0),
                fused_optimizer=getattr(args, "fused_optimizer", True),
                sync_batchnorm=getattr(args, "batchnorm", "none") != "per_replica",
                strategy=getattr(args, "strategy", "mirrored"))
  if values["strategy"] == "multi_worker":  # Config asks for the run's directory.
    values["model_dir"] = tempfile.mkdtemp(prefix="bench-worker-")
  values.update(overrides)
  data_flags = [f"--dataset={args.dataset}",
                f"--synthetic_shape={getattr(args, 'synthetic_shape', '28,28,1')}",
                f"--synthetic_examples={getattr(args, 'synthetic_examples', 4096)}",
                f"--task.batchnorm={getattr(args, 'batchnorm', 'none') != 'none'}"]
  if getattr(args, "train_files", None):
    data_flags = ["--dataset=tfrecord", f"--train_files={args.train_files}",
                  f"--eval_files={args.train_files.replace('train-', 'test-')}"]
  return config_lib.from_argv([*data_flags, f"--model={args.model}"]).replace(
      **values)


def _windows(run_window, args):
  """Runs warm-up and timed windows; returns (examples/s per window, ttfs)."""
  run_window()  # Traces.
  ttfs = seconds_since_process_start()
  for _ in range(args.warmup_windows):
    run_window()
  rates = []
  for _ in range(args.windows):
    start = time.perf_counter()
    run_window()
    seconds = time.perf_counter() - start
    rates.append(args.steps_per_loop * args.global_batch / seconds)
  return rates, ttfs


def _trainer_config(args, model_dir, **overrides):
  """The trainer variants' Config: one loop call per window (the first traces),
  unless --train_steps is given (--steps_per_loop=0 lets the trainer size its
  calls); no checkpoint but the last."""
  train_steps = args.train_steps or (
      (1 + args.warmup_windows + args.windows) * args.steps_per_loop)
  return variant_config(args, model_dir=model_dir, train_steps=train_steps,
                        checkpoint_every=10**9, **overrides)


def _training_speed(results) -> dict:
  """A trainer variant's numbers from its results.json."""
  return {"examples_per_second": results["examples_per_second_median"],
          "time_to_first_call_s": results["time_to_first_step_s"],
          "timed_windows": results["timed_loop_calls"]}


def run_trainer(args, *, summaries, array_input="gather", task_class=None):
  import trainer
  with tempfile.TemporaryDirectory() as model_dir:
    config = _trainer_config(args, model_dir, summaries=summaries,
                             array_input=array_input)
    task = task_class(**config.task_kwargs) if task_class else None
    return _training_speed(trainer.train(config, task=task))


def _dataset_task_class():
  """The classification task, its train_data() an unbatched tf.data.Dataset of
  its arrays (a user's stream task)."""
  tf = tf_loader.load_tensorflow()
  from trainer.tasks.classification import Classification

  class DatasetClassification(Classification):
    """Classification whose training examples come as a tf.data.Dataset."""

    def train_data(self):
      return tf.data.Dataset.from_tensor_slices(super().train_data())

  DatasetClassification.__module__ = Classification.__module__  # A task spec.
  return DatasetClassification


def run_trainer_eval(args):
  """Training with an evaluation after every window, then --mode=eval."""
  import trainer
  with tempfile.TemporaryDirectory() as model_dir:
    config = _trainer_config(args, model_dir, summaries=True, mode="train_and_eval",
                             eval_every=args.steps_per_loop)
    start = time.perf_counter()
    results = trainer.train(config)
    wall = time.perf_counter() - start
    evaluated = trainer.train(config.replace(mode="eval"))
  evaluations = config.train_steps // args.steps_per_loop
  return {"examples_per_second": results["eval_examples_per_second"],
          "eval_examples": results["eval"]["examples"],
          "evaluations": evaluations,
          "eval_seconds_each": results["eval_seconds"] / evaluations,
          "eval_share_of_run": results["eval_seconds"] / wall,
          "train_examples_per_second": results["examples_per_second_median"],
          "eval_mode_examples_per_second": evaluated["eval_examples_per_second"],
          "time_to_first_call_s": results["time_to_first_step_s"]}


def _compiled_keras_model(config, task, strategy, steps_per_execution):
  import keras
  with strategy.scope():
    keras.utils.set_random_seed(config.seed)
    model = task.build_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)
  return model


def run_keras_evaluate(args):
  tf = tf_loader.load_tensorflow()
  config, strategy, task, _ = _setup(args)
  model = _compiled_keras_model(config, task, strategy, args.steps_per_execution)
  x, y = task.eval_data()
  split = (tf.data.Dataset.from_tensor_slices((x, y)).batch(args.global_batch)
           .map(lambda x, y: (task.preprocess(x), y), tf.data.AUTOTUNE)
           .prefetch(tf.data.AUTOTUNE))
  start = time.perf_counter()
  model.evaluate(split, verbose=0)
  first = time.perf_counter() - start
  rates = []
  for _ in range(args.windows):
    start = time.perf_counter()
    model.evaluate(split, verbose=0)
    rates.append(len(x) / (time.perf_counter() - start))
  return {"examples_per_second": statistics.median(rates), "windows": rates,
          "eval_examples": len(x), "first_call_examples_per_second": len(x) / first,
          "time_to_first_call_s": seconds_since_process_start()}


def _usual_records_pipeline(args, task, config):
  """Keras' usual input over the trainer's TFRecord files: one record at a time
  through the same parse function, then shuffle, batch and prefetch."""
  tf = tf_loader.load_tensorflow()
  from trainer.tasks import image_records
  paths = sorted(tf.io.gfile.glob(args.train_files))
  parse_batch = image_records.read_layout(paths, flag="--train_files").batch_parser(
      task.source.num_classes)

  def parse(record):
    images, labels = parse_batch(tf.expand_dims(record, 0))
    return task.preprocess(images[0]), labels[0]

  return (tf.data.TFRecordDataset(paths, num_parallel_reads=tf.data.AUTOTUNE)
          .map(parse, num_parallel_calls=tf.data.AUTOTUNE).repeat()
          .shuffle(config.shuffle_buffer, seed=config.seed)
          .batch(args.global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))


def _usual_dataset_pipeline(args, task, config):
  """Keras' usual input over the task's unbatched tf.data.Dataset."""
  tf = tf_loader.load_tensorflow()
  dataset = tf.data.Dataset.from_tensor_slices(task.train_data())
  return (dataset.repeat().shuffle(config.shuffle_buffer, seed=config.seed)
          .batch(args.global_batch, drop_remainder=True)
          .map(lambda x, y: (task.preprocess(x), y), tf.data.AUTOTUNE)
          .prefetch(tf.data.AUTOTUNE))


def _setup(args, *, strategy_free=False):
  from trainer import data
  from trainer.distribute import devices
  from trainer.tasks import RunContext
  from trainer.tasks.classification import Classification
  config = variant_config(args, cpu_devices=1 if strategy_free else args.replicas)
  devices.configure_devices(config.distribute)
  strategy = None if strategy_free else devices.make_strategy(config.distribute)
  task = Classification(**config.task_kwargs)
  task.prepare(RunContext(seed=config.seed))
  train = data.as_task_data(task.train_data(), what="train data")
  dataset = None  # TFRecords: only keras_fit_records, on its own pipeline.
  if hasattr(train, "train_dataset"):
    dataset = train.train_dataset(
        data.Order(seed=0, shuffle=True, global_batch_size=args.global_batch),
        start_step=0, preprocess=task.preprocess)
  return config, strategy, task, dataset


def _distribute(strategy, dataset):
  from trainer.data import base
  return base.distribute(strategy, dataset)


def _model_and_optimizer(config, task, strategy):
  import contextlib

  import keras

  from trainer.training.optimizers import build_optimizer
  with strategy.scope() if strategy else contextlib.nullcontext():
    keras.utils.set_random_seed(config.seed)
    model = task.build_model()
    optimizer = build_optimizer(config.optimization, task.build_optimizer())
    optimizer.build(model.trainable_variables)
  return model, optimizer


def _hand_replica_step(args, model, optimizer, *, apply_inside=True):
  """The hand-written loops' step on one replica's batch: the average loss over
  the global batch, its gradients applied inside the replica function (or, with
  apply_inside=False, returned with the loss for the caller to all-reduce)."""
  tf = tf_loader.load_tensorflow()
  import keras
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                       reduction="none")

  def replica_step(x, y, unused_weights=None):  # The arrays' batches carry ones.
    with tf.GradientTape() as tape:
      loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)),
                                        global_batch_size=args.global_batch)
      scaled = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    if not apply_inside:
      return loss, grads
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  return replica_step


def run_hand_loop(args, *, k_steps, strategy_free=False, apply_inside=True):
  tf = tf_loader.load_tensorflow()
  config, strategy, task, dataset = _setup(args, strategy_free=strategy_free)
  model, optimizer = _model_and_optimizer(config, task, strategy)
  replica_step = _hand_replica_step(args, model, optimizer, apply_inside=apply_inside)
  variables = model.trainable_variables
  sum_ = tf.distribute.ReduceOp.SUM

  def step(iterator):
    if strategy is None:
      return replica_step(*next(iterator))
    if apply_inside:
      losses = strategy.run(replica_step, args=next(iterator))
      return strategy.reduce(sum_, losses, axis=None)
    losses, grads = strategy.run(replica_step, args=next(iterator))
    grads = strategy.extended.batch_reduce_to(
        sum_, [(g, v.value) for g, v in zip(grads, variables)])
    optimizer.apply(grads, variables)
    return strategy.reduce(sum_, losses, axis=None)

  iterator = iter(dataset if strategy is None else _distribute(strategy, dataset))
  if k_steps:
    @tf.function
    def loop(iterator, k):
      loss = tf.constant(0.0)
      for _ in tf.range(k):
        loss = step(iterator)
      return loss

    k = tf.constant(args.steps_per_loop)
    run_window = lambda: float(loop(iterator, k))
  else:
    step_fn = tf.function(step)

    def run_window():
      for _ in range(args.steps_per_loop):
        loss = step_fn(iterator)
      return float(loss)  # One sync per window, as a loop that logs would do.

  rates, ttfs = _windows(run_window, args)
  return {"examples_per_second": statistics.median(rates), "windows": rates,
          "time_to_first_call_s": ttfs}


def run_orbit(args):
  """Orbit's Controller + StandardTrainer: the k_loop's replica step, K steps per
  controller loop, the same model, data and strategy."""
  tf = tf_loader.load_tensorflow()
  import orbit
  config, strategy, task, dataset = _setup(args)
  model, optimizer = _model_and_optimizer(config, task, strategy)
  replica_step = _hand_replica_step(args, model, optimizer)
  with strategy.scope():
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                              aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  class Trainer(orbit.StandardTrainer):
    """The benchmark's step as an Orbit trainer."""

    def __init__(self):
      self.loss = tf.Variable(0.0, trainable=False)  # Read once per window.
      super().__init__(train_dataset=_distribute(strategy, dataset),
                       options=orbit.StandardTrainerOptions(use_tf_while_loop=True))

    def train_step(self, iterator):
      losses = strategy.run(replica_step, args=next(iterator))
      self.loss.assign(strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None))
      global_step.assign_add(1)

    def train_loop_end(self):
      return {}

  controller = orbit.Controller(trainer=Trainer(), strategy=strategy,
                                global_step=global_step,
                                steps_per_loop=args.steps_per_loop)

  def run_window():
    controller.train(steps=int(global_step.numpy()) + args.steps_per_loop)
    return float(controller.trainer.loss.numpy())

  rates, ttfs = _windows(run_window, args)
  return {"examples_per_second": statistics.median(rates), "windows": rates,
          "time_to_first_call_s": ttfs}


def run_keras_fit(args, pipeline=None):
  """Keras fit on the trainer's own tf.data pipeline, or on `pipeline(args, task,
  config)`'s dataset."""
  import keras
  config, strategy, task, dataset = _setup(args)
  if pipeline is not None:
    dataset = pipeline(args, task, config)
  k, e = args.steps_per_loop, args.steps_per_execution
  if k % e:
    raise ValueError(f"--steps_per_execution={e} must divide --steps_per_loop={k}")
  marks = []  # perf_counter at each window end.
  first = []

  class WindowTimer(keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      if (batch + 1) % k == 0:
        float(logs["loss"])  # Sync: the window's work is done.
        marks.append(time.perf_counter())
        if not first:
          first.append(seconds_since_process_start())

  model = _compiled_keras_model(config, task, strategy, e)
  windows = 1 + args.warmup_windows + args.windows
  model.fit(dataset, epochs=1, steps_per_epoch=windows * k, verbose=0,
            callbacks=[WindowTimer()])
  timed = marks[args.warmup_windows:]  # From the end of the last warm-up window.
  rates = [k * args.global_batch / (b - a) for a, b in zip(timed, timed[1:])]
  return {"examples_per_second": statistics.median(rates), "windows": rates,
          "time_to_first_call_s": first[0], "steps_per_execution": e}


def run_pipeline(args):
  tf = tf_loader.load_tensorflow()
  _, strategy, _, dataset = _setup(args)
  iterator = iter(_distribute(strategy, dataset))

  @tf.function
  def drain(iterator, k):
    total = tf.constant(0, tf.int64)
    for _ in tf.range(k):
      _, y, _ = next(iterator)  # (features, labels, weights)
      total += tf.cast(tf.reduce_sum(strategy.experimental_local_results(y)[0]),
                       tf.int64)
    return total

  k = tf.constant(args.steps_per_loop)
  rates, ttfs = _windows(lambda: int(drain(iterator, k)), args)
  return {"examples_per_second": statistics.median(rates), "windows": rates,
          "time_to_first_call_s": ttfs}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--variant", choices=VARIANTS, required=True)
  parser.add_argument("--model", default="cnn")
  parser.add_argument("--dataset", default="synthetic")
  parser.add_argument("--replicas", type=int, default=2)
  parser.add_argument("--per_replica_batch_size", type=int, default=32)
  parser.add_argument("--steps_per_loop", type=int, default=20)
  parser.add_argument("--steps_per_execution", type=int, default=20)
  parser.add_argument("--windows", type=int, default=5)
  parser.add_argument("--warmup_windows", type=int, default=1)
  parser.add_argument("--train_steps", type=int, default=0,
                      help="trainer variants: total steps (default: the windows)")
  parser.add_argument("--mixed_precision", default="none")
  parser.add_argument("--jit_compile", action="store_true")
  parser.add_argument("--fused_optimizer", default="true", choices=("true", "false"),
                      help="trainer variants: Adam as one fused op per variable "
                      "(the trainer's default) or as Keras's element-wise ops")
  parser.add_argument("--strategy", default="mirrored",
                      choices=("mirrored", "multi_worker"),
                      help="multi_worker: this process is one worker of TF_CONFIG's "
                      "cluster (one replica); the chief prints the result")
  parser.add_argument("--batchnorm", default="none",
                      choices=("none", "sync", "per_replica"),
                      help="trainer variants: --task.batchnorm, with the global "
                      "batch's statistics (sync) or each replica's")
  parser.add_argument("--synthetic_examples", type=int, default=4096)
  parser.add_argument("--synthetic_shape", default="28,28,1",
                      help="the synthetic images' shape, e.g. 160,160,3")
  parser.add_argument("--summary_every", type=int, default=0,
                      help="trainer variants: steps between summary points")
  parser.add_argument("--train_files", default="",
                      help="TFRecord shards (train-*; test-* beside them)")
  args = parser.parse_args()
  args.global_batch = args.per_replica_batch_size * args.replicas
  if args.strategy == "multi_worker":  # One replica per worker, on CPUs.
    args.global_batch = args.per_replica_batch_size * len(
        json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
  args.fused_optimizer = args.fused_optimizer == "true"
  tf_loader.load_tensorflow()
  runners = {
      "trainer": lambda: run_trainer(args, summaries=True),
      "trainer_quiet": lambda: run_trainer(args, summaries=False),
      "trainer_dataset": lambda: run_trainer(args, summaries=True,
                                             array_input="dataset"),
      "seed_loop": lambda: run_hand_loop(args, k_steps=False),
      "k_loop": lambda: run_hand_loop(args, k_steps=True),
      "k_loop_outside": lambda: run_hand_loop(args, k_steps=True, apply_inside=False),
      "keras_fit": lambda: run_keras_fit(args),
      "single_device": lambda: run_hand_loop(args, k_steps=True, strategy_free=True),
      "orbit": lambda: run_orbit(args),
      "pipeline": lambda: run_pipeline(args),
      "keras_fit_records": lambda: run_keras_fit(args, _usual_records_pipeline),
      "trainer_tfdata": lambda: run_trainer(args, summaries=True,
                                            task_class=_dataset_task_class()),
      "keras_fit_tfdata": lambda: run_keras_fit(args, _usual_dataset_pipeline),
      "trainer_eval": lambda: run_trainer_eval(args),
      "keras_evaluate": lambda: run_keras_evaluate(args),
  }
  try:
    result = runners[args.variant]()
  except Exception as e:  # noqa: BLE001
    # Reported, not raised: e.g. Keras fit with steps_per_execution > 1 under
    # MirroredStrategy fails in Keras 3.15, and the driver then retries with 1.
    result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
  result.update(variant=args.variant, peak_rss_mib=round(peak_rss_mib(), 1))
  print("BENCHMARK_RESULT " + json.dumps(result), flush=True)
  return 0 if "error" not in result else 1


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  sys.exit(main())
