"""Before MODEL_DIR is touched: devices, the strategy, the task bound to the run's
config, and its data checked. Everything here can fail with a one-line error and
leave no trace on disk."""

import dataclasses

import tensorflow as tf

from trainer import data, tasks
from trainer.config import Config
from trainer.distribute import devices
from trainer.errors import ConfigError, DataError
from trainer.tasks import Task


@dataclasses.dataclass(frozen=True)
class Setup:
  """What `setup` found: the strategy, this process's role, the task and data."""
  strategy: tf.distribute.Strategy
  is_chief: bool
  task: Task
  train_data: object  # data.ArrayData, StreamData, TFRecords or PipelineData
  eval_data: object  # the same, or None
  per_replica_batch_size: int  # From the batch flags and the replica count.
  prepared: object = None  # What Task.prepare() returned.

  @property
  def global_batch_size(self) -> int:
    return self.per_replica_batch_size * self.strategy.num_replicas_in_sync


def bind(task: Task, config: Config) -> Task:
  """Gives the task its run's config (`task.config`), also for frozen dataclasses."""
  object.__setattr__(task, "config", config)
  return task


def setup(config: Config, task: Task) -> Setup:
  """Configures devices and the strategy, binds the task, loads and checks its data.

  Raises:
    TrainerError: bad devices, cluster, data, or a mode the task cannot serve.
  """
  devices.configure_devices(config)
  strategy = devices.make_strategy(config)
  per_replica, _ = config.batch_sizes(strategy.num_replicas_in_sync,
                                      exact=config.mode != "eval")
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  bind(task, config)
  prepared = task.prepare()
  train_data = data.as_task_data(task.train_data(), what="Task.train_data()")
  eval_value = task.eval_data()
  eval_data = (None if eval_value is None else
               data.as_task_data(eval_value, what="Task.eval_data()", finite=True))
  if eval_data is None and config.mode != "train":
    raise ConfigError(f"--mode={config.mode}: task {config.task} has no eval data "
                      "(Task.eval_data() returned None); use --mode=train")
  result = Setup(strategy=strategy, is_chief=devices.is_chief(strategy), task=task,
                 train_data=train_data, eval_data=eval_data,
                 per_replica_batch_size=per_replica, prepared=prepared)
  num_pipelines, _ = data.input_pipelines(strategy)
  for what, split in (("train", train_data), ("eval", eval_data)):
    if isinstance(split, data.TFRecords):
      if split.note and (result.is_chief or num_pipelines > 1):
        print(split.note, flush=True)
      # Every worker checks every pipeline: they all stop, with the same line.
      empty = [p for p in range(num_pipelines)
               if not split.shard(num_pipelines, p).num_examples]
      if what == "train" and empty:
        raise DataError(f"{split.flag}: input pipeline {empty[0]} of "
                        f"{num_pipelines} gets no records; write more shards")
  if isinstance(train_data, data.ArrayData):
    n, global_batch = train_data.num_examples, result.global_batch_size
    if n < global_batch:
      raise DataError(f"the training set has {n} examples, fewer than one global "
                      f"batch of {global_batch} ({per_replica} per replica x "
                      f"{strategy.num_replicas_in_sync} replicas); lower "
                      "--per_replica_batch_size or --global_batch_size")
  return result


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
