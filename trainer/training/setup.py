"""Phases 1 to 3 of a run, shared by training, `--mode=eval`, replay and
`trainer.load`: the devices and the strategy, the task and its data, the trainer.

Everything here can fail with a one-line error and leaves no trace on disk:
nothing is written before the run claims its directory.
"""

import contextlib
import dataclasses
import os

import tensorflow as tf

from trainer import data, tasks
from trainer.config import Config
from trainer.distribute import devices
from trainer.distribute.cluster import Cluster, cluster_of
from trainer.errors import ConfigError, DataError, user_code
from trainer.outputs.console import Console
from trainer.tasks import RunContext, Task
from trainer.training import checkpoint_files
from trainer.training.checkpoints import Checkpoints
from trainer.training.trainer import Trainer
from trainer.training.trainer_build import build_trainer


@dataclasses.dataclass
class Built:
  """What a run is made of, before anything is restored.

  Attributes:
    config: the run's configuration.
    task: its task, prepared.
    cluster: this process's place in the run.
    train_data: the task's training data (a TaskData).
    eval_data: its eval data, or None.
    prepared: what Task.prepare returned.
    trainer: the model, optimizer, step and loops.
    checkpoints: the run's checkpoints (nothing restored yet).
    console: the run's output channel.
  """
  config: Config
  task: Task
  cluster: Cluster
  train_data: data.TaskData
  eval_data: object
  prepared: object
  trainer: Trainer
  checkpoints: Checkpoints
  console: Console


# Without --hang_timeout, a multi-worker set-up (the user's Task.prepare, the
# data, the variables' first broadcast) may take this long before it is a hang.
SET_UP_DEFAULT_SECONDS = 1800.0


def resolve_task(config: Config, task: Task = None) -> tuple:
  """(config, task) that agree: the task built from the config, or the config
  recording a given task's name and hyperparameters (so flags.txt holds them).

  Raises:
    ConfigError: the task cannot be built, or is not a trainer.Task.
  """
  if task is None:
    task = tasks.build_task(config.task, config.task_kwargs)
  elif not isinstance(task, Task):
    raise ConfigError(f"task={task!r}: must be an instance of a trainer.Task subclass")
  else:
    config = config.replace(task=tasks.task_spec(type(task)),
                            task_params=tuple(tasks.task_params(task).items()))
  unknown = sorted(name for name in config.hparams if name.startswith("task.") and
                   name[len("task."):] not in config.task_kwargs)
  if unknown:
    raise ConfigError(f"--hparams: task {config.task} has no hyperparameter "
                      f"{unknown[0][len('task.'):]}")
  return config, task


def build(config: Config, task: Task, *, read_only: bool = False,
          loading: bool = False, watchdog=None) -> Built:
  """Sets up devices and the strategy, prepares the task, checks its data and
  builds the trainer.

  Args:
    config: the run's configuration (model_dir set).
    task: the task (resolve_task's).
    read_only: open another process's run (an evaluation, a replay): its
      checkpoints are never written.
    loading: for `trainer.load` (prediction): a task without eval data is fine.
    watchdog: a started HangWatchdog, which bounds the set-up after the
      strategy (Task.prepare, the data, the trainer's variables, which workers
      broadcast) where there are peers to wait for; or None.

  Raises:
    TrainerError: bad devices, cluster, data, task, or a mode the task cannot
      serve.
  """
  # 1. Devices and the strategy (before TensorFlow starts: the CPU's split).
  devices.configure_devices(config.distribute)
  strategy = devices.make_strategy(config.distribute)
  cluster = cluster_of(strategy)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  console = Console(total_steps=config.train_steps, is_chief=cluster.is_chief,
                    progress_lines=config.summaries)
  if watchdog is not None:
    watchdog.identify(cluster.worker)
  with (watchdog.guard("set-up", step=None,
                      default_at_least=SET_UP_DEFAULT_SECONDS)
        if watchdog is not None and cluster.num_workers > 1 else
        contextlib.nullcontext()):
    return _build_on(config, task, strategy=strategy, cluster=cluster,
                     console=console, read_only=read_only, loading=loading)


def _build_on(config: Config, task: Task, *, strategy, cluster: Cluster, console,
              read_only: bool, loading: bool) -> Built:
  """`build`'s phases 2 and 3, on the devices and strategy of phase 1."""
  training = config.mode != "eval"
  per_replica, global_batch = config.input.batch_sizes(cluster.num_replicas,
                                                       exact=training)
  # 2. The task and its data.
  with user_code("Task.prepare"):
    prepared = task.prepare(RunContext(
        seed=config.seed, model_dir=config.model_dir, is_chief=cluster.is_chief,
        num_workers=cluster.num_workers, num_replicas=cluster.num_replicas,
        per_replica_batch_size=per_replica, global_batch_size=global_batch))
  train_data, eval_data = _task_data(task)
  if config.preprocess_once and type(task).preprocess is not Task.preprocess:
    # Tracing a random preprocess needs a seed under --deterministic (the model's
    # own seed is set again before it is built).
    tf.random.set_seed(config.seed)
    train_data, eval_data = _preprocessed_once(task, train_data, eval_data, console)
  if config.mode is None:  # The default: evaluate where the task can.
    if eval_data is None and not loading:
      _refuse_evaluation_flags(config)
    config = config.replace(mode="train" if eval_data is None else "train_and_eval")
  if eval_data is None and config.mode != "train" and not loading:
    raise ConfigError(f"--mode={config.mode}: task {config.task} has no eval data "
                      "(Task.eval_data() returned None); use --mode=train")
  for split in (train_data, eval_data):
    if split is not None and split.note:
      console.say(split.note)
  if training:
    train_data.check_training(cluster, global_batch)

  # 3. The trainer: model, optimizer, step, ledgers and loops, under the strategy.
  order = data.Order(seed=config.seed, shuffle=config.shuffle,
                     buffer=config.shuffle_buffer, global_batch_size=global_batch,
                     input_shards=_input_shards(config.model_dir, cluster, train_data,
                                                global_batch_size=global_batch,
                                                training=training))
  trainer = build_trainer(
      task=task, strategy=strategy, cluster=cluster, train_data=train_data,
      optimization=config.optimization, order=order,
      per_replica_batch_size=per_replica, seed=config.seed,
      train_steps=config.train_steps,
      gather=training and config.array_input == "gather",
      gather_eval=config.array_input == "gather",
      keep_gradients=training and config.histogram_every > 0,
      record_every=config.summary_steps if config.summaries else 0,
      sync_batchnorm=config.sync_batchnorm if training and not loading else None)
  checkpoints = Checkpoints(model_dir=config.model_dir, trainer=trainer,
                            keep=config.keep_checkpoints, read_only=read_only,
                            say=console.say)
  return Built(config=config, task=task, cluster=cluster, train_data=train_data,
               eval_data=eval_data, prepared=prepared, trainer=trainer,
               checkpoints=checkpoints, console=console)


def _preprocessed_once(task: Task, train_data, eval_data, console) -> tuple:
  """The splits held in memory with Task.preprocess applied once (--preprocess_once;
  data.preprocessed says where it cannot be)."""
  splits = []
  for split, what in ((train_data, "Task.train_data()"),
                      (eval_data, "Task.eval_data()")):
    if split is not None:
      with user_code("Task.preprocess"):
        split, note = data.preprocessed.once(split, task.preprocess, what=what)
      if note:
        console.say(note)
    splits.append(split)
  return tuple(splits)


def _input_shards(model_dir: str, cluster: Cluster, train_data, *,
                  global_batch_size: int, training: bool) -> int:
  """The input shards per-pipeline data is ordered over (data.Order.input_shards):
  those the run's newest checkpoint records where this invocation's workers read
  them exactly, else (a new run, or one resumed on a worker count that cannot)
  those the data picks for this layout; 0 for other data, and for an evaluation
  (which reads no training data)."""
  if not train_data.per_pipeline or not training:
    return 0
  recorded = None
  newest = checkpoint_files.latest(os.path.join(model_dir or "",
                                                checkpoint_files.CHECKPOINT_SUBDIR))
  if newest:
    try:
      recorded = checkpoint_files.read_record(newest).ordered_shards()
    except (tf.errors.OpError, ValueError):
      pass  # Unreadable: the restore says so and takes another.
  return train_data.input_shards(recorded=recorded, pipelines=cluster.num_pipelines,
                                 global_batch_size=global_batch_size)


def _refuse_evaluation_flags(config: Config):
  """Raises ConfigError if a flag that needs evaluations is set for a task
  without eval data (its default --mode is then train)."""
  for name in Config.PATIENCE_FIELDS:
    if getattr(config, name):
      raise ConfigError(f"--{name}={getattr(config, name)}: needs evaluations, but "
                        f"task {config.task} has no eval data (Task.eval_data() "
                        "returned None)")


def _task_data(task: Task):
  """The task's (train, eval) data as TaskData (eval None where it has none), its
  eval examples checked to look like its training ones."""
  with user_code("Task.train_data"):
    train_value = task.train_data()
  train_data = data.as_task_data(train_value, what="Task.train_data()")
  with user_code("Task.eval_data"):
    eval_value = task.eval_data()
  if eval_value is None:
    return train_data, None
  eval_data = data.as_task_data(eval_value, what="Task.eval_data()", finite=True)
  _check_same_features(train_data, eval_data)
  return train_data, eval_data


def _check_same_features(train_data: data.TaskData, eval_data: data.TaskData):
  """Raises DataError unless the eval examples look like the training ones (the
  model is built on these): the same structure, dtypes and compatible shapes."""
  train_spec, eval_spec = train_data.element_spec[0], eval_data.element_spec[0]
  try:
    tf.nest.assert_same_structure(train_spec, eval_spec)
    fits = all(t.dtype == e.dtype and t.shape.is_compatible_with(e.shape)
               for t, e in zip(tf.nest.flatten(train_spec),
                               tf.nest.flatten(eval_spec)))
  except (ValueError, TypeError):
    fits = False
  if not fits:
    raise DataError(f"Task.eval_data(): its features are {eval_spec}, but "
                    f"Task.train_data()'s are {train_spec}: the model takes the "
                    "training features; return eval features of the same shapes")
