"""Which devices a run uses, and the tf.distribute strategy over them."""

import errno
import json
import os
import socket

import tensorflow as tf

from trainer import tf_loader
from trainer.config import DistributeConfig
from trainer.errors import ConfigError

_MAX_TASKS_PER_NODE = 1024


def configure_devices(config: DistributeConfig):
  """Makes the requested GPUs visible and splits the CPU, before TF initialises.

  Touches only physical-device settings, so TensorFlow stays uninitialised:
  MultiWorkerMirroredStrategy must configure collective ops before that. If
  TensorFlow is already initialised (a Python caller that ran TF ops before, or a
  test process whose conftest split the CPU), the existing split is kept and
  `local_devices` checks that it is enough.

  Args:
    config: the DistributeConfig (gpus, memory_growth, cpu_devices, threads).

  Raises:
    ConfigError: --gpus names an absent GPU.
  """
  gpus = tf.config.list_physical_devices("GPU")
  if config.gpus is not None:
    absent = [i for i in config.gpus if i < 0 or i >= len(gpus)]
    if absent:
      raise ConfigError(f"--gpus={','.join(map(str, config.gpus))}: no GPU "
                        f"{absent[0]} (this machine has {len(gpus)} GPU(s))")
    gpus = [gpus[i] for i in config.gpus]
  try:
    tf.config.set_visible_devices(gpus + tf.config.list_physical_devices("CPU"))
    for gpu in gpus:
      tf.config.experimental.set_memory_growth(gpu, config.memory_growth)
    # MultiWorkerMirroredStrategy runs one replica per worker on a CPU, however the
    # CPU is split, so only mirrored runs split it.
    split = not gpus and config.cpu_devices > 1 and config.strategy != "multi_worker"
    if split:
      cpu = tf.config.list_physical_devices("CPU")[0]
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * config.cpu_devices)
    intra = config.intra_op_threads or (
        intra_op_threads(usable_cores(), config.cpu_devices) if split else 0)
    if intra:
      tf.config.threading.set_intra_op_parallelism_threads(intra)
    if config.inter_op_threads:
      tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)
  except RuntimeError:
    pass  # Already initialised: keep the devices it has; local_devices checks them.


def usable_cores() -> int:
  """The CPU cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


def intra_op_threads(cores: int, replicas: int) -> int:
  """--intra_op_threads=0 on a CPU split into `replicas` logical devices: each
  replica's ops get their share of the cores. TensorFlow's default (every core
  for every op) makes the replicas' concurrent ops oversubscribe the cores: on 2
  cores with 2 replicas, 1 thread trains the benchmark CNN 1.4x faster."""
  return max(1, cores // replicas)


def local_devices(config: DistributeConfig) -> list:
  """The names of this process's devices that the replicas will run on.

  Initialises TensorFlow's devices.

  Raises:
    ConfigError: --cpu_devices is more than an already initialised TensorFlow has.
  """
  logical_gpus = tf.config.list_logical_devices("GPU")
  if logical_gpus:
    return [d.name for d in logical_gpus]
  cpus = tf.config.list_logical_devices("CPU")
  if len(cpus) < config.cpu_devices:
    raise ConfigError(f"--cpu_devices={config.cpu_devices}: TensorFlow is already "
                      f"initialised with {len(cpus)} CPU device(s) in this process"
                      + _started_note())
  return [d.name for d in cpus[:config.cpu_devices]]


def _started_note() -> str:
  """Names what started TensorFlow too early, when the task did."""
  who = tf_loader.started_by()
  return (f" ({who} ran TensorFlow before the devices were set up; do that work "
          "in Task.prepare(), which runs after)" if who else "")


# What fixes a strategy: the fields `configure_devices` and `make_strategy` read.
STRATEGY_FIELDS = ("strategy", "cluster_resolver", "cross_device_ops", "cpu_devices",
                   "gpus", "memory_growth", "intra_op_threads", "inter_op_threads")
_started = {}  # {strategy_key: the strategy `start` made at the program's start}


def strategy_key(config: DistributeConfig) -> tuple:
  """The values of config's STRATEGY_FIELDS."""
  return tuple(getattr(config, name) for name in STRATEGY_FIELDS)


def start(config: DistributeConfig) -> tf.distribute.Strategy:
  """Sets up the devices and makes the strategy now, at a program's start, before
  it runs TensorFlow (a Keras program that builds its data before calling
  trainer.fit): `make_strategy` returns it for an equal config.

  Raises:
    ConfigError: as configure_devices and make_strategy.
  """
  configure_devices(config)
  strategy = make_strategy(config)
  _started[strategy_key(config)] = strategy
  return strategy


def started(config: DistributeConfig) -> bool:
  """Whether `start` made this config's strategy."""
  return strategy_key(config) in _started


def make_strategy(config: DistributeConfig) -> tf.distribute.Strategy:
  """Builds the strategy named by --strategy, after `configure_devices` (or
  returns the one `start` made for an equal config).

  Args:
    config: the DistributeConfig (strategy, cluster_resolver, cross_device_ops).

  Returns:
    A MirroredStrategy, OneDeviceStrategy or MultiWorkerMirroredStrategy.

  Raises:
    ConfigError: the cross-device ops do not fit the strategy, or the cluster is not
      described.
  """
  if strategy_key(config) in _started:
    return _started[strategy_key(config)]
  if config.strategy == "multi_worker":
    return _multi_worker_strategy(config)
  devices = local_devices(config)
  if config.strategy == "one_device":
    return tf.distribute.OneDeviceStrategy(devices[0])
  if config.strategy == "mirrored":
    cross_device_ops = _mirrored_cross_device_ops(config.cross_device_ops)
    if cross_device_ops is None and all("CPU" in d.upper() for d in devices):
      # TF's default here is a RING collective whose group keys restart at 1 in
      # every MirroredStrategy, so a second strategy over a different number of
      # devices in the same process (a Python caller training twice) deadlocks or
      # fails. Logical CPU devices share memory: reducing on one costs no copies.
      cross_device_ops = tf.distribute.ReductionToOneDevice()
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
  raise ConfigError(f"--strategy={config.strategy}: use one of "
                    "mirrored, one_device, multi_worker")


def _mirrored_cross_device_ops(name):
  ops = {
      "auto": None,
      "nccl": tf.distribute.NcclAllReduce,
      "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
      "reduce_to_one_device": tf.distribute.ReductionToOneDevice,
  }
  if name not in ops:
    raise ConfigError(f"--cross_device_ops={name}: with --strategy=mirrored use auto, "
                      "nccl, hierarchical_copy or reduce_to_one_device")
  return ops[name]() if ops[name] else None


def _multi_worker_strategy(config):
  implementations = {
      "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
      "ring": tf.distribute.experimental.CommunicationImplementation.RING,
      "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
  }
  if config.cross_device_ops not in implementations:
    raise ConfigError(f"--cross_device_ops={config.cross_device_ops}: with "
                      "--strategy=multi_worker use auto, ring or nccl")
  resolver = cluster_resolver(config)
  busy = _busy_port_error(config, resolver)
  if busy:
    raise busy
  # No collective timeout: TensorFlow arms one for every collective op as a new
  # thread that sleeps for the whole timeout (Env::SchedClosureAfter), so a
  # 10-minute timeout kept ~3.5 threads per step alive on 2 workers and ran the
  # machine out of threads after a few thousand steps. A lost peer is caught by the
  # coordination service's heartbeats and a stopped one by the hang watchdog
  # (--hang_timeout), both exit 7 (docs/faults.md).
  options = tf.distribute.experimental.CommunicationOptions(
      implementation=implementations[config.cross_device_ops])
  try:
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options)
  except RuntimeError as e:
    if "program startup" not in str(e):
      raise
    raise ConfigError("--strategy=multi_worker must start in a fresh process: "
                      "TensorFlow was already initialised here" + _started_note()
                      ) from None
  except tf.errors.UnknownError as e:
    # Maybe taken between the check and TensorFlow's bind; else gRPC's own.
    if "Could not start gRPC server" not in str(e):
      raise
    busy = _busy_port_error(config, resolver)
    if busy is None:
      raise
    raise busy from None


def port_in_use(port: int) -> bool:
  """Whether another process listens on `port` of any of this machine's
  addresses, as a gRPC server binding it would find: an earlier run's
  connections in TIME_WAIT are no obstacle (SO_REUSEADDR), and a bind error other
  than EADDRINUSE is not "in use" (TensorFlow reports its own)."""
  try:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      probe.bind(("", port))
  except OSError as e:
    return e.errno == errno.EADDRINUSE
  return False


def _busy_port_error(config, resolver):
  """The ConfigError of this worker's own port when another process listens
  there (gRPC would fail to start its server with a traceback while the other
  workers wait), else None."""
  spec = resolver.cluster_spec()  # Sets a SLURM resolver's task type and id.
  task_type, task_id = resolver.task_type, resolver.task_id
  address = spec.task_address(task_type, task_id)
  port = int(address.rpartition(":")[2])
  if not port_in_use(port):
    return None
  stop = (f"stop what listens there (`ss -ltnp 'sport = :{port}'` names it, e.g. "
          "a worker of an earlier job)")
  if config.cluster_resolver == "slurm":
    return ConfigError(
        f"--cluster_resolver=slurm: {task_type} {task_id}'s port {port} "
        f"({address}) is in use by another process on this node; SLURM's resolver "
        f"gives a node's tasks ports 8888 and up: {stop} or run on another node")
  return ConfigError(
      f"TF_CONFIG: cluster.{task_type}[{task_id}] {address!r}: port {port} is in "
      f"use by another process on this machine; {stop} or give this worker a "
      "free port")


def cluster_resolver(config: DistributeConfig):
  """The cluster of a multi-worker run, from TF_CONFIG or SLURM's environment.

  Raises:
    ConfigError: the environment does not describe a cluster.
  """
  if config.cluster_resolver == "tf_config":
    _check_tf_config()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec().as_dict()
    if "evaluator" not in spec:
      return resolver
    # The evaluator (--mode=continuous_eval) takes no part in training's
    # collectives: the workers form their cluster without it.
    del spec["evaluator"]
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type=resolver.task_type,
        task_id=resolver.task_id, rpc_layer=resolver.rpc_layer or "grpc",
        # Its GPUs (the resolver's own count would start TensorFlow too early).
        num_accelerators={"GPU": len(tf.config.get_visible_devices("GPU"))})
  resolvers = tf.distribute.cluster_resolver
  try:
    # Counted here: TF's own count runs nvidia-smi, absent on CPU-only nodes.
    gpus = len(tf.config.list_physical_devices("GPU"))
    if gpus:
      return resolvers.SlurmClusterResolver(gpus_per_node=gpus)
    # TF's resolver places tasks on GPU slots, so with none it finds no tasks:
    # resolve with one notional slot per task, then describe a GPU-less cluster.
    slurm = resolvers.SlurmClusterResolver(gpus_per_node=_MAX_TASKS_PER_NODE,
                                           gpus_per_task=1, auto_set_gpu=False)
    cluster_spec = slurm.cluster_spec()  # Also sets task_type and task_id.
    return resolvers.SimpleClusterResolver(
        cluster_spec, task_type=slurm.task_type, task_id=slurm.task_id,
        num_accelerators={}, rpc_layer=slurm.rpc_layer)
  except RuntimeError as e:  # A SLURM_* variable is missing.
    raise ConfigError(f"--cluster_resolver=slurm: {e} (run it under srun)") from None


def tf_config_task_type():
  """TF_CONFIG's task type ("worker", "chief", "evaluator"), or None."""
  try:
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
    return task.get("type") if isinstance(task, dict) else None
  except (ValueError, AttributeError):
    return None


def _check_tf_config():
  """Checks TF_CONFIG's shape before TensorFlow's resolver reads it.

  Raises:
    ConfigError: naming what is wrong and what would be valid.
  """
  raw = os.environ.get("TF_CONFIG")
  if not raw:
    raise ConfigError("--strategy=multi_worker needs TF_CONFIG (or "
                      "--cluster_resolver=slurm); see docs/scaling.md")
  try:
    tf_config = json.loads(raw)
    cluster, task = tf_config["cluster"], tf_config["task"]
    workers, task_type, index = cluster["worker"], task["type"], task["index"]
  except (ValueError, KeyError, TypeError):
    raise ConfigError("TF_CONFIG: must be JSON with cluster.worker, task.type and "
                      f"task.index, got {raw[:80]!r}") from None
  jobs = {name: hosts for name, hosts in cluster.items()
          if name in ("worker", "chief")}
  for name, hosts in jobs.items():
    if not (isinstance(hosts, list) and hosts and
            all(isinstance(h, str) and h for h in hosts)):
      raise ConfigError(f"TF_CONFIG: cluster.{name} must be a list of host:port "
                        f"strings, got {hosts!r}"[:200])
    for host in hosts:
      _, colon, port = host.rpartition(":")
      if not (colon and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"TF_CONFIG: cluster.{name} has {host!r}, which is not "
                          "host:port with a port in 1-65535, e.g. 'w0.example:2222'"
                          [:200])
  if task_type not in jobs:
    raise ConfigError(f"TF_CONFIG: task.type {task_type!r} must be one of "
                      f"{', '.join(sorted(jobs))} (a job of cluster)")
  if not isinstance(index, int) or isinstance(index, bool):
    raise ConfigError(f"TF_CONFIG: task.index must be an integer, got {index!r}")
  if not 0 <= index < len(jobs[task_type]):
    raise ConfigError(f"TF_CONFIG: task.index {index} is out of range: cluster."
                      f"{task_type} has {len(jobs[task_type])} task(s), indices 0 to "
                      f"{len(jobs[task_type]) - 1}")
  del workers


