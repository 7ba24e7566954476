"""Config: one definition per flag, validation with one-line errors, flagfiles."""

import os

import pytest
from absl import flags

from trainer import config as config_lib
from trainer.config import Config
from trainer.errors import ConfigError
from trainer.tasks.classification import Classification

from presets import config


def test_every_field_is_a_flag_with_help():
  flag_values = flags.FlagValues()
  config_lib.define_flags(flag_values)
  for name in config_lib.flag_names():
    assert flag_values[name].help, name


@pytest.mark.parametrize("changes, message", [
    (dict(per_replica_batch_size=0), "--per_replica_batch_size=0: must be >= 1"),
    (dict(cpu_devices=65), "--cpu_devices=65: must be <= 64"),
    (dict(mode="eval"), "--mode=eval needs --model_dir"),
    (dict(hparams=("learning_rate", "lr")), "--hparams: unknown flag(s) lr"),
    (dict(strategy="multi_worker"), "--strategy=multi_worker needs --model_dir"),
    (dict(hang_timeout="soon"), "--hang_timeout=soon: must be a positive duration "
                                "of at most 100 years, such as 90m, 2h or 3600s"),
    (dict(global_batch_size=0), "--global_batch_size=0: must be >= 1"),
    (dict(learning_rate=0.0), "--learning_rate=0: must be > 0"),
    (dict(model_dir=""), "--model_dir=: must name a directory"),
    (dict(train_steps=2**63), "--train_steps=9223372036854775808: must be <= "),
    (dict(max_time="99999999999999999999h"), "--max_time=99999999999999999999h: "
                                             "must be a positive duration"),
])
def test_invalid_values_name_the_flag(changes, message):
  with pytest.raises(ConfigError) as e:
    Config(**changes)
  assert message in str(e.value)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("changes, message", [
    (dict(dataset="imagenet"), "--dataset=imagenet: must be one of digits, mnist"),
    (dict(dataset="npz"), "--dataset=npz needs --data_path"),
    (dict(data_path="/no/such.npz"), "--data_path=/no/such.npz: no such file"),
    (dict(synthetic_shape=(28, 0)), "--synthetic_shape=28,0"),
    (dict(dropout=0.99), "--dropout=0.99: must be <= 0.95"),
])
def test_invalid_task_values_name_the_flag(changes, message):
  with pytest.raises(ConfigError) as e:
    Classification(**changes)
  assert message in str(e.value)
  assert "\n" not in str(e.value)


def test_help_finds_the_task_however_the_command_line_names_it(tmp_path):
  inner, outer = tmp_path / "inner.flags", tmp_path / "outer.flags"
  inner.write_text("--task=regression\n")
  outer.write_text(f"--train_steps=5\n--flagfile={inner}\n")
  task_of = config_lib.flags.task_of
  assert task_of([]) == Config.task == "classification"
  assert task_of(["--task", "regression", "--help"]) == "regression"
  assert task_of(["-task=regression"]) == "regression"
  assert task_of([f"--flagfile={outer}"]) == "regression"
  # The last one wins, as when the flags are parsed.
  assert task_of([f"--flagfile={outer}", "--task=classification"]) == "classification"
  absent = [f"--flagfile={tmp_path / 'absent.flags'}", "--task=regression"]
  with pytest.raises(ConfigError, match="absent.flags"):
    task_of(absent)
  # --help with an unreadable flagfile still finds the command line's own task.
  from trainer import main
  assert main._task_of(absent) == "regression"  # noqa: SLF001
  assert task_of(["--task", "--help"]) == ""  # No task named: absl says so.


def test_a_flagfile_that_includes_itself_is_refused(tmp_path):
  path = tmp_path / "loop.flags"
  path.write_text(f"--train_steps=5\n--flagfile={path}\n")
  with pytest.raises(ConfigError, match=r"--flagfile=.*loop.flags: includes itself"):
    config_lib.from_argv([f"--flagfile={path}"])


def test_the_flag_reference_is_current():
  with open(os.path.join(os.path.dirname(__file__), "..", "docs", "flags.md")) as f:
    reference = f.read()
  # Regenerate with: python scripts/flag_reference.py > docs/flags.md
  assert config_lib.flag_table() in reference


def test_communication_is_an_alias_of_cross_device_ops():
  assert config("--communication=ring", "--strategy=multi_worker",
                "--model_dir=/tmp/x").cross_device_ops == "ring"


def test_flags_file_round_trips(tmp_path):
  original = config("--dataset=synthetic", "--synthetic_shape=4,4",
                    "--hparams=learning_rate,dropout", model_dir=str(tmp_path),
                    gpus=(0, 1), learning_rate=0.25, shuffle=False)
  path = tmp_path / "flags.txt"
  path.write_text("\n".join(original.to_flags()) + "\n")
  assert config_lib.load_flagfile(str(path)) == original
  assert original.task_kwargs["synthetic_shape"] == (4, 4)
  assert original.value("dropout") == original.value("task.dropout") == 0.0


def test_the_built_in_tasks_short_flags_are_aliases_of_task_flags():
  short = config("--dataset=synthetic", "--model=mlp", "--dropout=0.5")
  long = config("--task.dataset=synthetic", "--task.model=mlp", "--task.dropout=0.5")
  assert short == long
  assert short.task_kwargs["model"] == "mlp"
  # A task without the field refuses its short flag, naming it.
  with pytest.raises(ConfigError, match="--dataset: task regression has no "
                     "hyperparameter dataset"):
    config("--task=regression", "--dataset=mnist")
  assert config("--task=regression", "--l2=0.5").task_kwargs["l2"] == 0.5


def test_from_flags_parses_lists_and_validates():
  flag_values = flags.FlagValues()
  config_lib.define_flags(flag_values)
  argv = ["prog", "--gpus=0,2", "--synthetic_shape=8,8,1", "--train_steps=7"]
  config_lib.prepare_flags(argv, flag_values)
  flag_values(argv)
  parsed = config_lib.from_flags(flag_values)
  assert parsed.gpus == (0, 2) and parsed.task_kwargs["synthetic_shape"] == (8, 8, 1)
  assert parsed.train_steps == 7
  flag_values(["prog", "--gpus=a"])
  with pytest.raises(ConfigError, match="--gpus: 'a' is not an integer"):
    config_lib.from_flags(flag_values)


def test_layout_flags_cover_the_model_but_not_the_hardware():
  layout = config().layout_flags(Classification.layout_fields)
  for name in ("task.dataset", "task.model", "optimizer", "grad_accum_steps", "seed"):
    assert name in layout
  # An elastic resume may change these (the checkpoint's global batch is checked).
  for name in ("train_steps", "learning_rate", "per_replica_batch_size",
               "global_batch_size", "cpu_devices", "gpus", "strategy"):
    assert name not in layout


def test_batch_sizes_from_either_flag():
  assert Config().input.batch_sizes(4) == (32, 128)
  assert Config(per_replica_batch_size=8).input.batch_sizes(3) == (8, 24)
  assert Config(global_batch_size=64).input.batch_sizes(4) == (16, 64)
  with pytest.raises(ConfigError, match=r"--global_batch_size=64: must be a multiple "
                     r"of the 3 replicas, e.g. 66"):
    Config(global_batch_size=64).input.batch_sizes(3)
  assert Config(global_batch_size=64).input.batch_sizes(3, exact=False) == (22, 66)
  with pytest.raises(ConfigError, match=r"--global_batch_size=64 and "
                     r"--per_replica_batch_size=8: set one of them"):
    Config(global_batch_size=64, per_replica_batch_size=8)


def test_slurm_cluster_comes_from_slurm_environment(monkeypatch):
  from trainer.distribute import devices
  section = Config(strategy="multi_worker", cluster_resolver="slurm",
                   model_dir="/x").distribute
  with pytest.raises(ConfigError, match=r"--cluster_resolver=slurm: SLURM_PROCID not "
                     r"found in environment.*\(run it under srun\)"):
    devices.cluster_resolver(section)
  for name, value in dict(PROCID="1", STEP_NUM_TASKS="2", STEP_NODELIST="node[1-2]",
                          STEP_TASKS_PER_NODE="1(x2)").items():
    monkeypatch.setenv(f"SLURM_{name}", value)
  resolver = devices.cluster_resolver(section)
  assert resolver.cluster_spec().as_dict() == {"worker": ["node1:8888", "node2:8888"]}
  assert (resolver.task_type, resolver.task_id) == ("worker", 1)
  assert resolver.num_accelerators() == {}  # CPU-only: MWMS must not look for GPUs.


def _worker_on(monkeypatch, port):
  """A multi-worker DistributeConfig whose TF_CONFIG makes this worker 1, on
  127.0.0.1:`port`."""
  import json
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["127.0.0.1:1", f"127.0.0.1:{port}"]},
      "task": {"type": "worker", "index": 1}}))
  return Config(strategy="multi_worker", model_dir="/x").distribute


def _busy_message(port):
  return (f"TF_CONFIG: cluster.worker[1] '127.0.0.1:{port}': port {port} is in use "
          "by another process on this machine; stop what listens there (`ss -ltnp "
          f"'sport = :{port}'` names it, e.g. a worker of an earlier job) or give "
          "this worker a free port")


def test_a_workers_own_busy_port_is_named_before_tensorflow_binds_it(monkeypatch):
  import socket

  from trainer.distribute import devices
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # As gRPC's.
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    section = _worker_on(monkeypatch, port)
    resolver = devices.cluster_resolver(section)
    error = devices._busy_port_error(section, resolver)  # noqa: SLF001
    with pytest.raises(ConfigError) as refused:
      devices.make_strategy(section)
    # A connection the listener's side closed first: its port waits in TIME_WAIT.
    with socket.create_connection(("127.0.0.1", port)) as client:
      accepted, _ = taken.accept()
      accepted.close()
      client.recv(1)
  assert str(error) == str(refused.value) == _busy_message(port)
  # The listener gone, the port is free: TIME_WAIT is no obstacle (as for gRPC).
  assert devices._busy_port_error(section, resolver) is None  # noqa: SLF001


def test_a_port_taken_as_tensorflow_binds_it_is_the_same_line(monkeypatch):
  import socket

  import tensorflow as tf

  from trainer.distribute import devices
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", 0))  # Bound, not listening: no obstacle yet.
    port = taken.getsockname()[1]
    section = _worker_on(monkeypatch, port)

    def grpc_fails(**_):
      raise tf.errors.UnknownError(None, None, "Could not start gRPC server")

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", grpc_fails)
    # Free at the check, but the bind failed: another cause is TensorFlow's own.
    with pytest.raises(tf.errors.UnknownError, match="Could not start gRPC"):
      devices.make_strategy(section)

    def taken_meanwhile(**_):
      taken.listen()
      grpc_fails()

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy",
                        taken_meanwhile)
    with pytest.raises(ConfigError) as refused:
      devices.make_strategy(section)
  assert str(refused.value) == _busy_message(port)


def test_split_cpu_replicas_share_the_cores():
  from trainer.distribute import devices
  assert devices.intra_op_threads(cores=2, replicas=2) == 1
  assert devices.intra_op_threads(cores=16, replicas=4) == 4
  assert devices.intra_op_threads(cores=2, replicas=4) == 1  # Never 0 (TF's all).


def test_each_component_gets_its_own_section():
  full = Config(learning_rate=0.5, cpu_devices=2, eval_every=10)
  assert full.optimization.learning_rate == 0.5
  assert full.distribute.cpu_devices == 2 and full.loop.eval_every == 10
  assert not hasattr(full.optimization, "cpu_devices")
  assert not hasattr(full.distribute, "learning_rate")
