"""Config: one definition per flag, validation with one-line errors, flagfiles."""

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
])
def test_invalid_values_name_the_flag(changes, message):
  with pytest.raises(ConfigError) as e:
    Config(**changes)
  assert message in str(e.value)
  assert "\n" not in str(e.value)


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


def test_layout_flags_cover_model_and_batch():
  layout = Config().layout_flags()
  for name in ("dataset", "model", "per_replica_batch_size", "cpu_devices", "optimizer"):
    assert name in layout
  assert "train_steps" not in layout and "learning_rate" not in layout
