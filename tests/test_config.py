"""Config: one definition per flag, validation with one-line errors, flagfiles."""

import os

import pytest
from absl import flags

from trainer import config as config_lib
from trainer.config import Config
from trainer.errors import ConfigError


def test_every_field_is_a_flag_with_help():
  flag_values = flags.FlagValues()
  config_lib.define_flags(flag_values)
  for name in config_lib.field_names():
    assert flag_values[name].help, name


@pytest.mark.parametrize("changes, message", [
    (dict(per_replica_batch_size=0), "--per_replica_batch_size=0: must be >= 1"),
    (dict(dataset="imagenet"), "--dataset=imagenet: must be one of digits, mnist"),
    (dict(cpu_devices=65), "--cpu_devices=65: must be <= 64"),
    (dict(dataset="npz"), "--dataset=npz needs --data_path"),
    (dict(data_path="/no/such.npz"), "--data_path=/no/such.npz: no such file"),
    (dict(mode="eval"), "--mode=eval needs --model_dir"),
    (dict(hparams=("learning_rate", "lr")), "--hparams: unknown flag(s) lr"),
    (dict(synthetic_shape=(28, 0)), "--synthetic_shape=28,0"),
    (dict(strategy="multi_worker"), "--strategy=multi_worker needs --model_dir"),
    (dict(hang_timeout="soon"), "--hang_timeout=soon: must be a positive duration "
                                "such as 90m, 2h or 3600s"),
    (dict(global_batch_size=0), "--global_batch_size=0: must be >= 1"),
])
def test_invalid_values_name_the_flag(changes, message):
  with pytest.raises(ConfigError) as e:
    Config(**changes)
  assert message in str(e.value)
  assert "\n" not in str(e.value)


def test_readme_flag_table_is_current():
  with open(os.path.join(os.path.dirname(__file__), "..", "README.md")) as f:
    readme = f.read()
  # Regenerate with: python -c "from trainer import config; print(config.flag_table())"
  assert config_lib.flag_table() in readme


def test_communication_is_an_alias_of_cross_device_ops():
  flag_values = flags.FlagValues()
  config_lib.define_flags(flag_values)
  flag_values(["prog", "--communication=ring", "--strategy=multi_worker",
               "--model_dir=/tmp/x"])
  assert config_lib.from_flags(flag_values).cross_device_ops == "ring"


def test_flags_file_round_trips(tmp_path):
  config = Config(model_dir=str(tmp_path), dataset="synthetic", synthetic_shape=(4, 4),
                  gpus=(0, 1), learning_rate=0.25, shuffle=False,
                  hparams=("learning_rate",))
  path = tmp_path / "flags.txt"
  path.write_text("\n".join(config.to_flags()) + "\n")
  assert config_lib.load_flagfile(str(path)) == config


def test_from_flags_parses_lists_and_validates():
  flag_values = flags.FlagValues()
  config_lib.define_flags(flag_values)
  flag_values(["prog", "--gpus=0,2", "--synthetic_shape=8,8,1", "--train_steps=7"])
  config = config_lib.from_flags(flag_values)
  assert config.gpus == (0, 2) and config.synthetic_shape == (8, 8, 1)
  assert config.train_steps == 7
  flag_values(["prog", "--gpus=a"])
  with pytest.raises(ConfigError, match="--gpus: 'a' is not an integer"):
    config_lib.from_flags(flag_values)


def test_layout_flags_cover_the_model_but_not_the_hardware():
  layout = Config().layout_flags()
  for name in ("dataset", "model", "optimizer", "grad_accum_steps", "seed"):
    assert name in layout
  # An elastic resume may change these (the checkpoint's global batch is checked).
  for name in ("train_steps", "learning_rate", "per_replica_batch_size",
               "global_batch_size", "cpu_devices", "gpus", "strategy"):
    assert name not in layout


def test_batch_sizes_from_either_flag():
  assert Config().batch_sizes(4) == (32, 128)
  assert Config(per_replica_batch_size=8).batch_sizes(3) == (8, 24)
  assert Config(global_batch_size=64).batch_sizes(4) == (16, 64)
  with pytest.raises(ConfigError, match=r"--global_batch_size=64: must be a multiple "
                     r"of the 3 replicas, e.g. 66"):
    Config(global_batch_size=64).batch_sizes(3)
  assert Config(global_batch_size=64).batch_sizes(3, exact=False) == (22, 66)
  with pytest.raises(ConfigError, match=r"--global_batch_size=64 and "
                     r"--per_replica_batch_size=8: set one of them"):
    Config(global_batch_size=64, per_replica_batch_size=8)


def test_slurm_cluster_comes_from_slurm_environment(monkeypatch):
  from trainer.distribute import devices  # pylint: disable=g-import-not-at-top
  config = Config(strategy="multi_worker", cluster_resolver="slurm", model_dir="/x")
  with pytest.raises(ConfigError, match=r"--cluster_resolver=slurm: SLURM_PROCID not "
                     r"found in environment.*\(run it under srun\)"):
    devices.cluster_resolver(config)
  for name, value in dict(PROCID="1", STEP_NUM_TASKS="2", STEP_NODELIST="node[1-2]",
                          STEP_TASKS_PER_NODE="1(x2)").items():
    monkeypatch.setenv(f"SLURM_{name}", value)
  resolver = devices.cluster_resolver(config)
  assert resolver.cluster_spec().as_dict() == {"worker": ["node1:8888", "node2:8888"]}
  assert (resolver.task_type, resolver.task_id) == ("worker", 1)
  assert resolver.num_accelerators() == {}  # CPU-only: MWMS must not look for GPUs.


def test_split_cpu_replicas_share_the_cores():
  from trainer.distribute import devices  # pylint: disable=g-import-not-at-top
  assert devices.intra_op_threads(cores=2, replicas=2) == 1
  assert devices.intra_op_threads(cores=16, replicas=4) == 4
  assert devices.intra_op_threads(cores=2, replicas=4) == 1  # Never 0 (TF's all).
