"""What a sweep's Optuna study searches with: its storage, sampler, pruner and the
distributions of the swept flags (trainer/sweeps/study.py holds the study).

Example:

  storage = open_storage("journal:runs/s1/study.journal", "runs/s1")
  sampler = make_sampler("tpe", slot_seed(seed=0, slot=3))
  pruner = make_pruner("asha", eval_every=100, train_steps=1000)
"""

import contextlib
import os
import time

from trainer.errors import ConfigError, one_line
from trainer.sweeps.spec import Param, trial_name

SAMPLERS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "asha", "hyperband")
STUDY_DB = "study.db"
REDUCTION_FACTOR = 3  # ASHA and Hyperband keep the best third at each rung.
_OPEN_ATTEMPTS = 5


def load_optuna():
  """The optuna module, imported on first use (it is slow), its logging quiet."""
  import optuna
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  return optuna


def open_storage(url, root: str):
  """The Optuna storage of `--storage` (default: ROOT/study.db).

  Args:
    url: an SQLAlchemy URL (sqlite:///F, postgresql://..., mysql://...), a
      `journal:PATH` file, or None.
    root: the sweep root (created already).

  Raises:
    ConfigError: naming the storage and why it cannot be opened.
  """
  optuna = load_optuna()
  url = url or f"sqlite:///{os.path.abspath(os.path.join(root, STUDY_DB))}"
  if in_root(url, root):  # Its directory is the sweep's to make.
    with contextlib.suppress(OSError):  # Then the open below says why.
      os.makedirs(os.path.dirname(_storage_file(url)), exist_ok=True)
  for attempt in range(_OPEN_ATTEMPTS):
    try:
      if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend
        return optuna.storages.JournalStorage(
            JournalFileBackend(url[len("journal:"):]))
      if "://" not in url:
        raise ValueError("not a database URL")
      kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
      return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as e:  # noqa: BLE001
      # SQLAlchemy, drivers and the file system each raise their own kinds.
      reason = one_line(e) or type(e).__name__
      if _created_meanwhile(e) and attempt + 1 < _OPEN_ATTEMPTS:
        time.sleep(0.5)  # Another sweep process created the tables meanwhile.
        continue
      shown = _without_password(url)
      missing = _missing_driver(url) if isinstance(e, ImportError) else None
      if missing:  # Optuna's own line names no module.
        raise ConfigError(
            f"--storage={shown}: cannot open it (no module named {missing!r}: the "
            f"driver SQLAlchemy uses for {url.split('://')[0]}://); "
            f"{_DRIVER_INSTALL.get(missing, f'pip install {missing}')}"
        ) from None
      raise ConfigError(f"--storage={shown}: cannot open it ({reason}); use "
                        "sqlite:///FILE, postgresql://..., mysql://... or "
                        "journal:FILE") from None


def _created_meanwhile(error) -> bool:
  """Whether opening a storage failed because another sweep process created its
  tables at the same moment (then opening it again finds them). SQLite says
  IntegrityError; PostgreSQL's concurrent CREATE TABLE says UniqueViolation (on
  its catalog, wrapped in SQLAlchemy's IntegrityError) or DuplicateTable."""
  text = f"{type(error).__name__} {error}"
  return any(word in text for word in ("IntegrityError", "UniqueViolation",
                                       "DuplicateTable", "DuplicateObject"))


# How to install the database driver SQLAlchemy names for a storage URL. Its
# default for postgresql:// is psycopg (3) since SQLAlchemy 2.1: psycopg2 alone
# does not do.
_DRIVER_INSTALL = {
    "psycopg": "pip install -e '.[postgres]' (psycopg, for postgresql://)",
    "psycopg2": "pip install psycopg2-binary, or use postgresql:// with "
                "pip install -e '.[postgres]'",
    "MySQLdb": "pip install mysqlclient, or use mysql+pymysql:// with "
               "pip install PyMySQL",
    "pymysql": "pip install PyMySQL",
}


def _missing_driver(url: str):
  """The module name of the database driver a storage URL needs and this Python
  lacks, or None."""
  try:
    from sqlalchemy.engine import make_url
    make_url(url).get_dialect().import_dbapi()
  except ImportError as e:
    return (e.name or str(e)).split(".")[0]
  except Exception:  # noqa: BLE001
    return None  # Not a dialect SQLAlchemy knows: the generic line says so.
  return None


def _without_password(url: str) -> str:
  """A storage URL as an error line may show it: its password masked."""
  try:
    from sqlalchemy.engine import make_url
    parsed = make_url(url)
  except Exception:  # noqa: BLE001
    return url  # journal:FILE, or not a URL at all.
  return parsed.render_as_string(hide_password=True) if parsed.password else url


def _storage_file(url: str):
  """The file of a journal: or sqlite:/// storage URL (None for a server)."""
  if url.startswith("journal:"):
    return url[len("journal:"):]
  if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
    return url[len("sqlite:///"):]
  return None


def in_root(url, root: str) -> bool:
  """Whether a storage is a file under the sweep root (created with the root)."""
  path = _storage_file(url or "sqlite:///" + os.path.join(root, STUDY_DB))
  if not path:
    return False
  root = os.path.abspath(root)
  return os.path.commonpath([os.path.abspath(path), root]) == root


def make_sampler(kind: str, seed: int):
  """The sampler of a claim. TPE gets a fresh one seeded per trial slot (see
  `slot_seed`), so that sweep processes sharing a study do not propose the same
  startup trials; constant liar keeps parallel proposals apart afterwards."""
  optuna = load_optuna()
  if kind == "tpe":
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
  # Grid and random trials are planned (enqueued with their values) up front.
  return optuna.samplers.RandomSampler(seed=seed)


def make_pruner(kind: str, *, eval_every: int, train_steps: int):
  """The pruner; its rungs are the trials' evaluation steps (--eval_every)."""
  pruners = load_optuna().pruners
  if kind == "median":
    return pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0,
                                interval_steps=1)
  if kind == "asha":
    return pruners.SuccessiveHalvingPruner(min_resource=eval_every,
                                           reduction_factor=REDUCTION_FACTOR)
  if kind == "hyperband":
    return pruners.HyperbandPruner(min_resource=eval_every, max_resource=train_steps,
                                   reduction_factor=REDUCTION_FACTOR)
  return pruners.NopPruner()


def distribution(param: Param):
  """The Optuna distribution of a swept flag."""
  distributions = load_optuna().distributions
  if param.distribution in ("grid", "choice"):
    return distributions.CategoricalDistribution(list(param.values))
  if param.distribution == "int":
    return distributions.IntDistribution(int(param.low), int(param.high))
  return distributions.FloatDistribution(param.low, param.high,
                                         log=param.distribution == "loguniform")


def slot_seed(seed: int, slot: int) -> int:
  """The TPE sampler's seed for the proposal of trial `slot` of a sweep."""
  return (seed * 100_003 + slot) % 2**32  # numpy's seeds are 32-bit.


def round_value(value):
  """Sampled floats are rounded (as random search does) so names stay readable."""
  return float(f"{value:.4g}") if isinstance(value, float) else value


def tpe_proposals(params, *, trials: int, seed: int) -> list:
  """TPE's first proposals with no results yet, as [(name, values)]: what a
  fresh sweep starts with (its startup trials are seeded random samples)."""
  probe = load_optuna().create_study()
  distributions = {p.name: distribution(p) for p in params}
  width = len(str(trials - 1))
  proposals = []
  for slot in range(min(trials, 10)):  # TPE's startup trials: the data-free part.
    probe.sampler = make_sampler("tpe", slot_seed(seed, slot))
    values = {name: round_value(value)
              for name, value in probe.ask(distributions).params.items()}
    proposals.append((trial_name(values, prefix=f"{slot:0{width}d}-"), values))
  return proposals
