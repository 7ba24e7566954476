"""The framework's configuration in sections, one per owner; every field is a flag.

Each field carries its help text and bounds (`field`); `trainer.config.flags`
turns them into absl flags and `Config.__post_init__` validates them, so the CLI
and Python callers get the same checks and the same one-line errors. `Config` is
every section at once (flat: `config.train_steps`); a component receives only its
own section (`config.optimization`), a frozen copy of those fields.

This module imports neither absl nor TensorFlow.
"""

import dataclasses
import datetime
import os
from typing import Any, Optional, Sequence, Tuple

from trainer.config.values import parse_class_weight, parse_duration
from trainer.errors import ConfigError

MODES = ("train", "eval", "train_and_eval", "continuous_eval")
ARRAY_INPUTS = ("gather", "dataset")
STRATEGIES = ("mirrored", "one_device", "multi_worker")
CLUSTER_RESOLVERS = ("tf_config", "slurm")
CROSS_DEVICE_OPS = ("auto", "ring", "nccl", "hierarchical_copy", "reduce_to_one_device")
OPTIMIZERS = ("adam", "adamw", "lion", "sgd", "momentum")
LR_SCHEDULES = ("constant", "cosine", "linear", "step", "exponential")
ON_NAN = ("stop", "rollback")
VERIFY_EQUIVALENCE = ("false", "true", "strict")
REQUEUE_SIGNALS = ("USR1", "USR2", "HUP", "ALRM", "none")
MIXED_PRECISION = ("none", "mixed_bfloat16", "mixed_float16")
MAX_CPU_DEVICES = 64
MAX_THREADS = 1024
MAX_STEPS = 2**53  # Steps and step counts: exact in a float64 and an int64.
DEFAULT_PER_REPLICA_BATCH_SIZE = 32
HANG_TIMEOUT_FLOOR_SECONDS = 600.0  # --hang_timeout unset: at least 10 minutes.


def field(default, help_text, *, choices=None, lower=None, upper=None, layout=False,
          flag=True):
  """A config field whose metadata also defines its flag.

  Args:
    default: the default value (lists are stored as tuples).
    help_text: the flag's help.
    choices: allowed values of a string field.
    lower: smallest allowed value of a number field.
    upper: largest allowed value of a number field.
    layout: whether changing it on an existing model_dir changes the model or the
      batch layout, so a checkpoint made with another value cannot be resumed.
    flag: whether it is a command-line flag (task_params is set by --task.NAME).
  """
  return dataclasses.field(
      default=default,
      metadata=dict(help=help_text, choices=choices, lower=lower, upper=upper,
                    layout=layout, flag=flag))


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """What to run, where, and for how long."""
  mode: Optional[str] = field(
      None, "train: train only; train_and_eval: train, evaluating every "
      "--eval_every steps and at the end; eval: evaluate the latest checkpoint of "
      "--model_dir; continuous_eval: evaluate every new checkpoint of --model_dir "
      "as it appears, beside a training run, until it ends (a TF_CONFIG task of "
      "type evaluator runs this). Default: train_and_eval when the task has eval "
      "data, else train.", choices=MODES)
  model_dir: Optional[str] = field(
      None, "Run directory (events, checkpoints, results.json). Default: a new "
      "timestamped folder under runs/.")
  task: str = field("classification", "classification (--dataset, --model), "
                    "regression (scikit-learn's diabetes data) or MODULE:CLASS of a "
                    "trainer.Task subclass; its fields are --task.NAME flags.",
                    layout=True)
  task_params: Tuple[Tuple[str, Any], ...] = field(
      (), "The task's hyperparameters as (name, value) pairs.", flag=False)
  train_steps: int = field(200, "Total training steps (a rerun resumes up to it).",
                           lower=1, upper=MAX_STEPS)
  seed: int = field(0, "Seed of weights, dropout and data order.", lower=0,
                    upper=2**32 - 1, layout=True)
  deterministic: bool = field(False, "Enable TensorFlow op determinism (bit-exact "
                              "reruns and resumes).")
  export_dir: Optional[str] = field(None, "SavedModel destination. Default: "
                                    "MODEL_DIR/export.")
  summaries: bool = field(True, "Write TensorBoard summaries and progress lines.")
  hparams: Sequence[str] = field((), "Flag names to record as TensorBoard HParams "
                                 "(sweeps set this).")
  verify_equivalence: str = field(
      "false", "At the step the run starts from, compare the gradients of the "
      "global batch that step reads on the replicas with one device's, each "
      "variable against the round-off floor measured in the same call (one "
      "device, the batch in other orders), and print one line, naming a layer or "
      "the loss on evidence when they differ (true, or bare "
      "--verify_equivalence); strict: also exit 2 when they differ, leaving "
      "nothing written.", choices=VERIFY_EQUIVALENCE)


@dataclasses.dataclass(frozen=True)
class DistributeConfig:
  """Devices and the tf.distribute strategy over them."""
  strategy: str = field("mirrored", "mirrored (every local device), one_device, or "
                        "multi_worker (MultiWorkerMirroredStrategy).",
                        choices=STRATEGIES)
  cluster_resolver: str = field(
      "tf_config", "Where multi_worker finds the cluster: tf_config (TF_CONFIG) or "
      "slurm.", choices=CLUSTER_RESOLVERS)
  cross_device_ops: str = field(
      "auto", "All-reduce implementation: auto, ring or nccl (multi_worker); nccl, "
      "hierarchical_copy or reduce_to_one_device (mirrored). Alias: --communication.",
      choices=CROSS_DEVICE_OPS)
  requeue_signal: str = field(
      "USR1", "The signal that SLURM sends before a job's time limit (#SBATCH "
      "--signal=B:USR1@90): every worker stops as on SIGTERM, saving a checkpoint, "
      "then the chief requeues the job (scontrol requeue) and the run exits 4 with "
      "status requeued; the requeued job resumes. none: the signal's default "
      "action.", choices=REQUEUE_SIGNALS)
  cpu_devices: int = field(1, "Split the CPU into this many logical devices (used "
                           "when no GPU is visible).", lower=1, upper=MAX_CPU_DEVICES)
  gpus: Optional[Sequence[int]] = field(
      None, "Indices of the GPUs to use, e.g. 0,1. Default: all.")
  memory_growth: bool = field(True, "Let GPU memory grow instead of taking it all.")
  intra_op_threads: int = field(
      0, "TensorFlow intra-op threads (0 = the usable cores / --cpu_devices when the "
      "CPU is split into replicas, else TF's default).", lower=0, upper=MAX_THREADS)
  inter_op_threads: int = field(0, "TensorFlow inter-op threads (0 = TF's default).",
                                lower=0, upper=MAX_THREADS)
  hang_timeout: Optional[str] = field(
      None, "Longest a loop call, evaluation, checkpoint, action or stop vote may "
      "take (and so any collective in them), e.g. 15m: past it the process writes "
      "MODEL_DIR/hang-WORKER.txt with every thread's stack and exits 7. Default: "
      "the larger of 10m and 20 times the median loop call.")

  @property
  def hang_timeout_seconds(self) -> Optional[float]:
    """--hang_timeout in seconds (None when unset: the watchdog's default)."""
    return None if self.hang_timeout is None else parse_duration(
        self.hang_timeout, flag="--hang_timeout")


@dataclasses.dataclass(frozen=True)
class InputConfig:
  """Batches and the order of the training examples."""
  # Not layout flags: a run may resume on other replicas with the same global
  # batch (the checkpoint's run record holds it; see training/resume.py).
  per_replica_batch_size: Optional[int] = field(
      None, "Examples per replica per step; the global batch is this times the "
      f"replica count. Default: {DEFAULT_PER_REPLICA_BATCH_SIZE} (unless "
      "--global_batch_size is set).", lower=1)
  global_batch_size: Optional[int] = field(
      None, "Examples per step over all replicas, instead of "
      "--per_replica_batch_size: each replica gets this divided by the replica "
      "count, so a run can resume on other hardware with the same batches.",
      lower=1)
  shuffle: bool = field(True, "Shuffle the training set each epoch (arrays: a "
                        "stateless permutation of (seed, epoch); a tf.data task: a "
                        "seeded buffer).")
  shuffle_buffer: int = field(10000, "Shuffle buffer of streamed data (a task's "
                              "tf.data.Dataset or pipeline function, TFRecord files).",
                              lower=1)
  preprocess_once: bool = field(
      True, "Run Task.preprocess (per-example, without random work) once over "
      "data held in memory, before training, instead of on every batch (a "
      "TextVectorization of string arrays: its token ids are then gathered "
      "in-graph); the export still applies it to raw inputs. Output over 1 GiB, "
      "or a preprocess that draws random numbers, runs per batch.")
  array_input: str = field(
      "gather", "How data held in memory reaches the replicas: gather (each "
      "replica gathers its batch in-graph from a copy of the arrays on its device, "
      "by (seed, step, replica): no distributed iterator; TFRecord files and "
      "tf.data datasets that fit and read the same twice are read into memory "
      "once, before training, and gathered in the order tf.data would give; eval "
      "splits too, on one worker for files and datasets) or dataset (tf.data and "
      "a distributed iterator). The same examples either way; data over 1 GiB "
      "(decoded) or text always uses dataset (docs/data.md says when else).",
      choices=ARRAY_INPUTS)

  def batch_sizes(self, num_replicas: int, *, exact: bool = True) -> tuple:
    """(per-replica batch, global batch) on `num_replicas` replicas.

    Args:
      num_replicas: replicas in sync.
      exact: --global_batch_size must divide evenly (training); otherwise the
        per-replica batch is rounded up (an evaluation pads its batches anyway).

    Raises:
      ConfigError: --global_batch_size is not a multiple of the replica count.
    """
    if self.global_batch_size is None:
      per_replica = self.per_replica_batch_size or DEFAULT_PER_REPLICA_BATCH_SIZE
      return per_replica, per_replica * num_replicas
    per_replica = -(-self.global_batch_size // num_replicas)
    if exact and self.global_batch_size % num_replicas:
      raise ConfigError(
          f"--global_batch_size={self.global_batch_size}: must be a multiple of the "
          f"{num_replicas} replicas, e.g. {per_replica * num_replicas}")
    return per_replica, per_replica * num_replicas


@dataclasses.dataclass(frozen=True)
class OptimizationConfig:
  """How gradients become updates."""
  sync_batchnorm: bool = field(
      True, "BatchNormalization normalises with the global batch's moments (every "
      "replica and worker, masked or not), so N replicas train as one device; "
      "false: each replica's own batch, as Keras fit does (their moving "
      "statistics are averaged at every step).")
  optimizer: str = field("adam", "adam, adamw (decoupled --weight_decay), lion, sgd "
                         "or momentum.", choices=OPTIMIZERS, layout=True)
  learning_rate: float = field(1e-3, "Peak learning rate (the schedule scales it).",
                               lower=0.0)
  momentum: float = field(0.9, "Momentum of --optimizer=momentum.", lower=0.0,
                          upper=1.0)
  weight_decay: float = field(0.01, "Decoupled weight decay of --optimizer=adamw "
                              "and lion.", lower=0.0)
  lr_schedule: str = field("constant", "constant, cosine, linear (to "
                           "--min_learning_rate at --decay_steps), step (times "
                           "--lr_decay_factor at each --lr_boundaries step) or "
                           "exponential (times --lr_decay_factor by --decay_steps); "
                           "after --warmup_steps.", choices=LR_SCHEDULES)
  warmup_steps: int = field(0, "Steps of linear warm-up from 0 to --learning_rate.",
                            lower=0, upper=MAX_STEPS)
  decay_steps: Optional[int] = field(None, "Step at which cosine, linear and "
                                     "exponential decay end. Default: "
                                     "--train_steps.", lower=1, upper=MAX_STEPS)
  min_learning_rate: float = field(0.0, "Floor of every schedule.", lower=0.0)
  lr_boundaries: Sequence[int] = field((), "Steps at which --lr_schedule=step "
                                       "multiplies the rate by --lr_decay_factor.")
  lr_decay_factor: float = field(0.1, "Factor of the step and exponential "
                                 "schedules.", lower=0.0, upper=1.0)
  clip_norm: float = field(0.0, "Clip the all-reduced gradients to this global norm "
                           "(0 = off).", lower=0.0)
  grad_accum_steps: int = field(1, "Micro-batches accumulated per update: N steps "
                                "of one per-replica batch each make one optimizer "
                                "step (an N times larger batch in the same memory).",
                                lower=1, upper=1024, layout=True)
  ema_decay: float = field(0.0, "Keep an exponential moving average of the weights "
                           "with this decay, e.g. 0.999 (0 = off).", lower=0.0,
                           layout=True)
  eval_with_ema: bool = field(True, "With --ema_decay: evaluate and export the "
                              "averaged weights.")
  init_checkpoint: Optional[str] = field(
      None, "Warm start: initialise the model's weights (not the optimizer or the "
      "step) from this checkpoint or run directory before step 0.")
  mixed_precision: str = field("none", "none, mixed_bfloat16 or mixed_float16 (with "
                               "loss scaling).", choices=MIXED_PRECISION, layout=True)
  jit_compile: bool = field(False, "Compile the replica step with XLA.")
  fused_optimizer: bool = field(
      True, "Update with --optimizer=adam and adamw as TensorFlow's fused Adam "
      "kernel, one op per variable (faster; it rounds the constants 1 - beta as "
      "float32, so weights differ from Keras's Adam in the last digits); false: "
      "Keras's element-wise ops. A task's own optimizer is used as it is.")
  class_weight: Optional[str] = field(
      None, "CLASS:WEIGHT,...: weigh each example's training loss by its class, "
      "as Keras fit(class_weight=...) does, e.g. 0:1,1:50 (classes not named "
      "weigh 1; evaluation is not weighed). Default: the task's class_weight.")

  @property
  def class_weights(self) -> Optional[dict]:
    """--class_weight as {class id: weight} (None when unset)."""
    return None if self.class_weight is None else parse_class_weight(
        self.class_weight)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """When the loop's actions run: evaluations, checkpoints, summaries, limits."""
  steps_per_loop: int = field(0, "Steps per tf.function call (0 = automatic: about "
                              "one second per call).", lower=0, upper=MAX_STEPS)
  summary_every: int = field(0, "A point of every train scalar every N steps, "
                             "recorded inside loop calls without ending them (0 = "
                             "about 100 points per run: --train_steps / 100).",
                             lower=0, upper=MAX_STEPS)
  histogram_every: int = field(0, "Every N steps, write histograms of each weight "
                               "and of its gradient at that step (TensorBoard's "
                               "Histograms and Distributions tabs; 0 = off). Keeps "
                               "a copy of the gradients in memory.", lower=0,
                               upper=MAX_STEPS)
  eval_every: int = field(0, "With --mode=train_and_eval: evaluate every N steps "
                          "(0 = only at the end).", lower=0, upper=MAX_STEPS)
  best_metric: Optional[str] = field(
      None, "The metric that picks the best evaluation, eval/NAME (default: the "
      "task's, e.g. eval/accuracy).")
  best_goal: Optional[str] = field(
      None, "max or min: which way --best_metric is better (default: the task's).",
      choices=("max", "min"))
  early_stopping_patience: int = field(0, "Stop after this many evaluations without "
                                       "an improvement of --best_metric (0 = off).",
                                       lower=0)
  early_stopping_min_delta: float = field(0.0, "The least change of --best_metric "
                                          "that counts as an improvement.",
                                          lower=0.0)
  reduce_lr_patience: int = field(0, "Multiply the learning rate by "
                                  "--reduce_lr_factor at every this many "
                                  "evaluations without an improvement of "
                                  "--best_metric by --early_stopping_min_delta, as "
                                  "Keras' ReduceLROnPlateau (0 = off).", lower=0)
  reduce_lr_factor: float = field(0.1, "The factor of --reduce_lr_patience (the "
                                  "peak rate stays >= --min_learning_rate).",
                                  lower=0.0, upper=1.0)
  checkpoint_every: int = field(100, "Save a checkpoint every N steps (and at the "
                                "end).", lower=1, upper=MAX_STEPS)
  keep_checkpoints: int = field(3, "Checkpoints to keep.", lower=1, upper=10**6)
  on_nan: str = field("stop", "On a non-finite loss or gradient: stop, or rollback "
                      "(restore the last checkpoint, halve the learning rate, at "
                      "most 3 times).", choices=ON_NAN)
  max_time: Optional[str] = field(None, "Time budget of this invocation, e.g. 90m, "
                                  "2h, 3600s: stop (with a checkpoint) after the "
                                  "first loop call past it.")
  eval_timeout: str = field("1h", "--mode=continuous_eval: stop after this long "
                            "without a new checkpoint, e.g. 30m.")
  profile_steps: Sequence[int] = field((), "A,B: record a TensorFlow profile of "
                                       "steps A to B under MODEL_DIR/train (the "
                                       "Profile tab).")

  @property
  def eval_timeout_seconds(self) -> float:
    """--eval_timeout in seconds."""
    return parse_duration(self.eval_timeout, flag="--eval_timeout")

  @property
  def max_time_seconds(self) -> Optional[float]:
    """--max_time in seconds (None when unset)."""
    return None if self.max_time is None else parse_duration(self.max_time,
                                                             flag="--max_time")


def default_model_dir() -> str:
  """A new timestamped folder under runs/."""
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", stamp)


SECTIONS = (RunConfig, DistributeConfig, InputConfig, OptimizationConfig, LoopConfig)


def flag_fields() -> list:
  """The fields of every section that are flags, in the flags' order."""
  return [f for section in SECTIONS for f in dataclasses.fields(section)
          if f.metadata["flag"]]


def flag_names() -> list:
  """The names of the framework's flags (every section's fields but task_params)."""
  return [f.name for f in flag_fields()]
