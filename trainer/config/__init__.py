"""Every flag of `trainer`, defined once, and the frozen `Config` they fill.

`Config` (config.py) holds every section of sections.py, flat
(`config.train_steps`); each component receives its own section
(`config.optimization`, `config.loop`, ...). The fields' metadata defines the absl
flags (flags.py), and `Config.__post_init__` validates, so the CLI and Python
callers (`trainer.train(Config(...))`, tests, sweeps) get the same checks and the
same one-line errors. This package and `trainer/main.py` are the only ones that
touch absl FLAGS; neither imports TensorFlow, so scripts can validate flags
cheaply.
"""

from trainer.config.config import Config
from trainer.config.flags import (define_flags, field_choices, flag_kind,
                                  from_argv, from_flags, load_flagfile,
                                  prepare_flags, read_flagfile)
from trainer.config.reference import flag_table
from trainer.config.sections import (DEFAULT_PER_REPLICA_BATCH_SIZE,
                                     HANG_TIMEOUT_FLOOR_SECONDS, DistributeConfig,
                                     InputConfig, LoopConfig, OptimizationConfig,
                                     RunConfig, flag_names)
from trainer.config.values import parse_duration
from trainer.flag_spelling import TASK_FLAG_ALIASES, flag_value

__all__ = ["Config", "DEFAULT_PER_REPLICA_BATCH_SIZE", "DistributeConfig",
           "HANG_TIMEOUT_FLOOR_SECONDS", "InputConfig", "LoopConfig",
           "OptimizationConfig", "RunConfig", "TASK_FLAG_ALIASES", "define_flags",
           "field_choices", "flag_kind", "flag_names", "flag_table", "flag_value",
           "from_argv", "from_flags", "load_flagfile", "parse_duration",
           "prepare_flags", "read_flagfile"]
