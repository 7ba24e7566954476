"""Sweeps on a PostgreSQL study: a real server that the test starts itself, in a
temporary directory on 127.0.0.1 (skipped, with the reason, where none can start
or its driver is missing), and the one line a missing driver gives."""

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from conftest import REPO, cli_env
from test_sweep import read_csv, sweep_record
from trainer.sweeps import cli, search

pytestmark = pytest.mark.slow

_START_ATTEMPTS = 3  # Ports: a free one may be taken before the server binds it.


def _server_bin_dir():
  """The directory of initdb and pg_ctl (Debian's, or on PATH), or None."""
  candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
  if shutil.which("initdb"):
    candidates.append(os.path.dirname(shutil.which("initdb")))
  for directory in candidates:
    if all(os.access(os.path.join(directory, tool), os.X_OK)
           for tool in ("initdb", "pg_ctl")):
      return directory
  return None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _last_line(result) -> str:
  lines = (result.stdout + result.stderr).strip().splitlines()
  return lines[-1] if lines else f"exit {result.returncode}"


@pytest.fixture(scope="module")
def postgres_url():
  """A PostgreSQL server of this module's tests: its URL (a superuser "sweep",
  trusted on 127.0.0.1 only, in a temporary directory removed afterwards)."""
  try:
    import psycopg  # noqa: F401
  except ImportError:
    pytest.skip("no psycopg, the PostgreSQL driver: pip install -e '.[postgres]'")
  bin_dir = _server_bin_dir()
  if bin_dir is None:
    pytest.skip("no PostgreSQL server (initdb and pg_ctl) on this machine")
  as_user = {}
  if os.geteuid() == 0:  # PostgreSQL refuses to run as root: as its own user.
    try:
      user = pwd.getpwnam("postgres")
    except KeyError:
      pytest.skip("running as root, and there is no postgres user to run "
                  "PostgreSQL as")
    as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
  directory = tempfile.mkdtemp(prefix="sweep-postgres-")
  if as_user:
    os.chown(directory, as_user["user"], as_user["group"])
  data = os.path.join(directory, "data")

  def run(*command):
    return subprocess.run(command, cwd=directory, capture_output=True, text=True,
                          timeout=120, check=False, **as_user)

  try:
    init = run(os.path.join(bin_dir, "initdb"), "-D", data, "-U", "sweep",
               "--auth=trust", "-E", "UTF8")
    if init.returncode:
      pytest.skip(f"initdb failed: {_last_line(init)}")
    for _ in range(_START_ATTEMPTS):
      port = _free_port()
      # TCP on 127.0.0.1 only; its Unix socket in the temporary directory.
      start = run(os.path.join(bin_dir, "pg_ctl"), "-D", data, "-w", "-t", "60",
                  "-l", os.path.join(directory, "server.log"),
                  "-o", f"-h 127.0.0.1 -p {port} -k {directory}", "start")
      if start.returncode == 0:
        break
    else:
      pytest.skip(f"PostgreSQL did not start: {_last_line(start)}")
    yield f"postgresql://sweep@127.0.0.1:{port}/postgres"
    run(os.path.join(bin_dir, "pg_ctl"), "-D", data, "-m", "immediate", "stop")
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def test_two_sweep_processes_split_a_postgresql_study(postgres_url, tmp_path):
  root = str(tmp_path / "shared")
  names = [f"learning_rate={rate}" for rate in ("0.1", "0.03", "0.01", "0.003")]
  args = [sys.executable, os.path.join(REPO, "scripts", "sweep.py"), f"--root={root}",
          f"--storage={postgres_url}", "--study=pg1",
          "--grid=learning_rate=0.1,0.03,0.01,0.003", "--metric=train/loss",
          "--", "--dataset=digits", "--model=mlp", "--train_steps=20"]
  processes = [subprocess.Popen(args, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(2)]
  outputs = [p.communicate(timeout=300)[0] for p in processes]
  assert [p.returncode for p in processes] == [0, 0], outputs
  for name in names:  # Each trial ran once, in one of the two processes.
    with open(os.path.join(root, "logs", name + ".log")) as f:
      assert f.read().count("# attempt ") == 1
  record = sweep_record(root)
  assert sorted(record) == sorted(names)
  assert {t["status"] for t in record.values()} == {"completed"}
  assert sorted(r["trial"] for r in read_csv(root)) == sorted(names)
  trials = search.load_optuna().load_study(study_name="pg1",
                                           storage=postgres_url).get_trials()
  assert sorted(t.user_attrs["name"] for t in trials) == sorted(names)
  assert {t.state.name for t in trials} == {"COMPLETE"}
  assert not os.path.exists(os.path.join(root, "study.db"))  # All in PostgreSQL.


def test_a_storage_created_by_another_process_at_once_is_opened(monkeypatch):
  """Two sweep processes opening a new PostgreSQL study at once both create its
  tables; the loser's CREATE fails on PostgreSQL's catalog, and it opens again."""
  import sqlalchemy
  optuna = search.load_optuna()
  attempts = []

  def rdb_storage(url, engine_kwargs=None):
    del engine_kwargs
    attempts.append(url)
    if len(attempts) == 1:
      raise sqlalchemy.exc.IntegrityError(
          "CREATE TABLE studies ...", None, Exception(
              "(psycopg.errors.UniqueViolation) duplicate key value violates "
              'unique constraint "pg_type_typname_nsp_index"'))
    return "storage"

  monkeypatch.setattr(optuna.storages, "RDBStorage", rdb_storage)
  url = "postgresql://sweep@127.0.0.1:1/db"
  assert search.open_storage(url, "/nonexistent") == "storage"
  assert attempts == [url, url]


def test_a_missing_postgresql_driver_is_one_line_naming_it(tmp_path, capsys,
                                                           monkeypatch):
  # As where only psycopg2 is installed: SQLAlchemy 2.1 imports psycopg (3) for
  # postgresql://, and Optuna's own line names no module.
  monkeypatch.setitem(sys.modules, "psycopg", None)
  root = tmp_path / "sweep"
  code = cli.main([f"--root={root}", "--grid=learning_rate=0.1", "--metric=train/loss",
                   "--storage=postgresql://sweep:secret@127.0.0.1:1/db"])
  assert code == 2
  err = capsys.readouterr().err
  assert err == (
      "sweep.py: error: --storage=postgresql://sweep:***@127.0.0.1:1/db: cannot "
      "open it (no module named 'psycopg': the driver SQLAlchemy uses for "
      "postgresql://); pip install -e '.[postgres]' (psycopg, for postgresql://)\n")
  assert not root.exists()
