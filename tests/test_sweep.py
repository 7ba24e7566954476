"""Sweeps: trials as subprocesses, rerun semantics, HParams through TensorBoard's
API."""

import csv
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import REPO, cli_env, read_results
from trainer import inspect as inspect_lib
from trainer.sweeps import cli, spec

pytestmark = pytest.mark.slow  # Trials are subprocesses: about a minute in all.

TRIAL_FLAGS = ["--", "--dataset=digits", "--model=mlp", "--train_steps=40",
               "--checkpoint_every=20", "--mode=train_and_eval"]
GRID = ["--grid=learning_rate=0.01,0.001", "--grid=per_replica_batch_size=16,32"]
TRIALS = {"learning_rate=0.01,per_replica_batch_size=16",
          "learning_rate=0.01,per_replica_batch_size=32",
          "learning_rate=0.001,per_replica_batch_size=16",
          "learning_rate=0.001,per_replica_batch_size=32"}


def sweep(*args, timeout=300):
  return subprocess.run([sys.executable, os.path.join(REPO, "scripts", "sweep.py"),
                         *args], cwd=REPO, env=cli_env(), capture_output=True,
                        text=True, timeout=timeout, check=False)


def read_csv(root):
  with open(os.path.join(root, "results.csv")) as f:
    return list(csv.DictReader(f))


def sweep_record(root):
  with open(os.path.join(root, "sweep.json")) as f:
    return {t["name"]: t for t in json.load(f)["trials"]}


@pytest.fixture(scope="module")
def grid_root(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("sweep") / "grid")
  result = sweep(f"--root={root}", *GRID, "--parallel=2", *TRIAL_FLAGS)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert result.stderr == ""  # TensorFlow's start-up noise is kept out of it.
  return root, result


def test_grid_runs_every_trial_and_ranks_them(grid_root):
  root, result = grid_root
  rows = read_csv(root)
  assert {r["trial"] for r in rows} == TRIALS
  for row in rows:
    assert row["status"] == "completed" and row["step"] == "40"
    assert row["trial"] == (f"learning_rate={row['learning_rate']},"
                            f"per_replica_batch_size={row['per_replica_batch_size']}")
    with open(os.path.join(root, row["trial"], "results.json")) as f:
      results = json.load(f)
    assert float(row["eval/accuracy"]) == pytest.approx(
        results["eval"]["accuracy"], abs=1e-4)
    assert results["per_replica_batch_size"] == int(row["per_replica_batch_size"])
    with open(os.path.join(root, row["trial"], "flags.txt")) as f:
      assert f"--learning_rate={row['learning_rate']}\n" in f.read()
  accuracies = [float(r["eval/accuracy"]) for r in rows]
  assert accuracies == sorted(accuracies, reverse=True)
  assert f"best: {rows[0]['trial']} (eval/accuracy = " in result.stdout
  assert "python -m trainer.main" in result.stdout
  with open(os.path.join(root, "results.md")) as f:
    assert f.read().count("| completed |") == 4


def test_a_logged_sweep_has_a_line_per_trial_and_one_table(grid_root):
  _, result = grid_root  # Its stdout is a pipe, as a log is.
  for trial in TRIALS:
    [line] = [line for line in result.stdout.splitlines()
              if line.startswith(f"{trial} completed")]
    assert re.fullmatch(rf"{re.escape(trial)} completed: eval/accuracy [\d.]+ at "
                        r"step 40 \(.*\) in [\d.]+ s", line), line
  assert result.stdout.count("(4 completed)") == 1  # The table, once, at the end.


def test_trials_are_told_their_share_of_threads(grid_root):
  root, _ = grid_root
  threads = max(1, os.cpu_count() // 2)
  for name in TRIALS:
    with open(os.path.join(root, name, "flags.txt")) as f:
      assert f"--intra_op_threads={threads}\n" in f.read()


def test_tensorboard_serves_every_trials_scalars_and_hparams(grid_root):
  root, _ = grid_root
  server = subprocess.Popen(
      [sys.executable, "-m", "tensorboard.main", f"--logdir={root}", "--host=127.0.0.1",
       "--port=0", "--load_fast=false", "--reload_interval=1"],
      env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    url = None
    for line in server.stdout:
      match = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
      if match:
        url = match[1]
        break
    assert url, "TensorBoard did not print its address"

    def get(path, body=None):
      data = None if body is None else json.dumps(body).encode()
      request = urllib.request.Request(url + path, data=data,
                                       headers={"Content-Type": "application/json"})
      with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)

    deadline = time.monotonic() + 60
    while not TRIALS <= set(get("/data/runs")) and time.monotonic() < deadline:
      time.sleep(0.5)
    runs = set(get("/data/runs"))
    assert {f"{t}/{s}" for t in TRIALS for s in ("train", "eval")} <= runs
    tags = get("/data/plugin/scalars/tags")
    for trial in TRIALS:
      assert {"loss", "accuracy", "learning_rate"} <= set(tags[f"{trial}/train"])
      assert {"loss", "accuracy"} <= set(tags[f"{trial}/eval"])

    experiment = get("/data/plugin/hparams/experiment", {"experimentName": ""})
    domains = {h["name"]: h.get("domainDiscrete") for h in experiment["hparamInfos"]}
    assert domains == {"learning_rate": [0.001, 0.01],
                       "per_replica_batch_size": [16, 32]}
    metrics = {(m["name"]["group"], m["name"]["tag"])
               for m in experiment["metricInfos"]}
    # Every metric the trials reported (the task's), not a fixed list.
    assert metrics == {("eval", "accuracy"), ("eval", "loss"), ("train", "accuracy"),
                       ("train", "loss")}
    groups = get("/data/plugin/hparams/session_groups", {
        "experimentName": "", "startIndex": 0, "sliceSize": 100,
        "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                            "STATUS_RUNNING"],
        "colParams": [{"hparam": "learning_rate"}, {"hparam": "per_replica_batch_size"},
                      {"metric": {"group": "eval", "tag": "accuracy"}}]})
    assert groups["totalSize"] == 4
    for group in groups["sessionGroups"]:
      name = group["name"]
      assert name == (f"learning_rate={group['hparams']['learning_rate']:g},"
                      f"per_replica_batch_size="
                      f"{group['hparams']['per_replica_batch_size']:g}")
      with open(os.path.join(root, name, "results.json")) as f:
        accuracy = json.load(f)["eval"]["accuracy"]
      values = {(m["name"]["group"], m["name"]["tag"]): m["value"]
                for m in group["metricValues"]}
      assert values[("eval", "accuracy")] == pytest.approx(accuracy, abs=1e-6)
  finally:
    server.kill()
    server.wait()


def test_inspect_prints_the_sweep_and_a_run(grid_root, capsys):
  root, _ = grid_root
  assert inspect_lib.main([root]) == 0
  out = capsys.readouterr().out
  assert "4 trials, sorted by eval/accuracy (max)" in out
  assert out.count(" completed ") == 4
  trial = os.path.join(root, "learning_rate=0.01,per_replica_batch_size=16")
  assert inspect_lib.main([trial]) == 0
  out = capsys.readouterr().out
  assert "completed at step 40/40" in out
  assert re.search(r"train/loss +\d+ points, steps 1\.\.40", out)
  assert "ledger (batches per replica): replica_0 40" in out


def test_rerun_skips_finished_trials_and_redoes_a_deleted_one(grid_root):
  root, _ = grid_root  # Runs after the tests that read the first sweep's files.
  before = sweep_record(root)
  result = sweep(f"--root={root}", *GRID, "--parallel=2", *TRIAL_FLAGS)
  assert result.returncode == 0, result.stdout[-3000:]
  assert "4 of 4 trials already completed" in result.stdout
  assert {n: t["attempts"] for n, t in sweep_record(root).items()} == {
      n: t["attempts"] for n, t in before.items()}

  redo = "learning_rate=0.001,per_replica_batch_size=32"
  os.remove(os.path.join(root, redo, "results.json"))
  result = sweep(f"--root={root}", *GRID, "--parallel=2", *TRIAL_FLAGS)
  assert result.returncode == 0, result.stdout[-3000:]
  assert "3 of 4 trials already completed" in result.stdout
  after = sweep_record(root)
  for name in TRIALS:
    assert after[name]["attempts"] == before[name]["attempts"] + (name == redo)
  assert len(read_csv(root)) == 4


def test_failed_trial_is_retried_once_and_does_not_stop_the_sweep(tmp_path):
  root = str(tmp_path / "sweep")
  # 1437 digits train examples: a per-replica batch of 2000 fails at run time.
  # Cold trials (a new Python each), the path without the fork server.
  result = sweep(f"--root={root}", "--grid=per_replica_batch_size=16,2000",
                 "--metric=train/loss", "--no-fork_server", "--", "--dataset=digits",
                 "--model=mlp", "--train_steps=10")
  assert result.returncode == 1
  record = sweep_record(root)
  failed = record["per_replica_batch_size=2000"]
  assert failed["status"] == "failed" and failed["attempts"] == 2
  assert failed["error"].startswith("error: the training set has 1437 examples")
  assert record["per_replica_batch_size=16"]["status"] == "completed"
  rows = {r["trial"]: r for r in read_csv(root)}
  assert list(rows) == ["per_replica_batch_size=16", "per_replica_batch_size=2000"]
  assert rows["per_replica_batch_size=2000"]["error"] == failed["error"]
  assert "retrying once" in result.stdout


def test_warm_trials_train_exactly_as_cold_ones(tmp_path):
  outcomes = {}
  name = "learning_rate=0.01"
  for start in ("--fork_server", "--no-fork_server"):
    root = str(tmp_path / start.strip("-"))
    result = sweep(f"--root={root}", f"--grid={name}", start, "--metric=eval/loss",
                   *TRIAL_FLAGS, "--deterministic")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stderr == ""  # Nor does the fork server's start-up reach it.
    results = read_results(os.path.join(root, name))
    outcomes[start] = (results["eval"], results["train"], results["global_step"])
    with open(os.path.join(root, "logs", name + ".log")) as f:
      log = f.read()
    # The same command in the log; no native start-up lines, no traceback.
    assert "-m trainer.main" in log and "E0000" not in log, log[:2000]
    assert "Traceback" not in log
  assert outcomes["--fork_server"] == outcomes["--no-fork_server"]


def dry_run(*args):
  result = sweep("--root=/nonexistent/sweep", "--dry_run", *args)
  assert result.returncode == 0, result.stderr
  return [line for line in result.stdout.splitlines() if not line.startswith(" ")]


def test_random_search_with_a_seed_proposes_the_same_trials():
  args = ["--base_flagfile=flags/quickstart.flags", "--trials=8",
          "--random=learning_rate=loguniform:1e-4:1e-1",
          "--random=optimizer=choice:adam,sgd"]
  first = dry_run(*args, "--seed=1")
  assert first == dry_run(*args, "--seed=1")
  assert first != dry_run(*args, "--seed=2")
  assert first[-1] == "8 trials (dry run: nothing was started)"
  for index, name in enumerate(first[:-1]):
    match = re.fullmatch(rf"{index}-learning_rate=([0-9.e-]+),optimizer=(adam|sgd)",
                         name)
    assert match and 1e-4 <= float(match[1]) <= 1e-1, name
  assert not os.path.exists("/nonexistent")


def test_spec_file_gives_the_grid():
  names = dry_run("--spec=flags/sweeps/lr_batch.sweep")
  assert names[-1] == "6 trials (dry run: nothing was started)"
  assert "learning_rate=0.003,per_replica_batch_size=32" in names


def test_several_spec_files_and_the_command_line_combine(tmp_path):
  optimizers = tmp_path / "optimizers.sweep"
  optimizers.write_text("# A second file adds its grid to the first's.\n"
                        "--grid=optimizer=adam,sgd\n")
  names = dry_run("--spec=flags/sweeps/lr_batch.sweep", f"--spec={optimizers}",
                  "--grid=seed=1,2")
  assert names[-1] == "24 trials (dry run: nothing was started)"
  assert ("learning_rate=0.01,per_replica_batch_size=16,optimizer=sgd,seed=2"
          in names)


@pytest.mark.parametrize("args, message", [
    (["--grid=lr=0.1,0.2"], "--grid=lr=0.1,0.2: unknown trainer flag --lr"),
    (["--grid=learning_rate="], "--grid=learning_rate=: expected NAME=VALUE(S)"),
    (["--grid=learning_rate=0.1,,0.2"], "empty value in the grid"),
    (["--random=learning_rate=normal:0:1"], "unknown distribution 'normal'"),
    (["--random=learning_rate=loguniform:0:1"], "needs LO < HI and LO > 0"),
    (["--random=per_replica_batch_size=uniform:1:9"], "use int:LO:HI"),
    (["--grid=gpus=0,1"], "--gpus is a list flag and cannot be swept"),
    (["--grid=model_dir=a,b"], "--model_dir is set by the sweep itself"),
    (["--grid=optimizer=adam,rmsprop"], "'rmsprop' is not one of --optimizer's"),
    (["--grid=learning_rate=0.1", "--random=learning_rate=uniform:0:1"],
     "--learning_rate is swept more than once"),
    (["--grid=per_replica_batch_size=0,8", "--metric=train/loss"],
     "trial per_replica_batch_size=0: --per_replica_batch_size=0: must be >= 1"),
    (["--grid=learning_rate=0.1", "--", "--mode=train"],
     "--metric=eval/accuracy: trial learning_rate=0.1 runs --mode=train"),
    ([], "nothing to sweep"),
    (["--grid=learning_rate=0.1", "--parallel=0"], "--parallel=0: must be >= 1"),
    (["--spec=flags/sweeps/none.sweep"],
     "--spec=flags/sweeps/none.sweep: No such file"),
    (["--grid=task.hidden=8,16"], "--grid=task.hidden=8,16: unknown trainer flag "
     "--task.hidden"),
    (["--grid=task.hidden=8,x", "--", "--task=regression"],
     "'x' is not a valid int for --task.hidden"),
    (["--grid=task.hidden=0,8", "--metric=eval/mae", "--", "--task=regression",
      "--mode=train_and_eval"], "trial task.hidden=0: --task.hidden=0: must be >= 1"),
    (["--grid=learning_rate=0.1", "--metric=accuracy"],
     "--metric=accuracy: use eval/NAME, train/NAME or examples_per_second"),
])
def test_invalid_specs_are_rejected_before_anything_starts(tmp_path, capsys, args,
                                                           message):
  root = tmp_path / "sweep"
  assert cli.main([f"--root={root}", *args]) == 2
  err = capsys.readouterr().err
  assert message in err and err.count("\n") == 1, err
  assert not root.exists()


def test_sampled_values_keep_their_flag_types():
  params = [spec.parse_random("learning_rate=uniform:0.1:0.2"),
            spec.parse_random("per_replica_batch_size=int:8:64"),
            spec.parse_grid("shuffle=true,false")]
  trials = spec.expand(params, trials=3, seed=0)
  assert len(trials) == 6
  for trial in trials:
    assert isinstance(trial.values["learning_rate"], float)
    assert isinstance(trial.values["per_replica_batch_size"], int)
    assert isinstance(trial.values["shuffle"], bool)


def test_sweep_over_a_task_hyperparameter_ranks_by_its_metric(tmp_path, capsys):
  root = str(tmp_path / "sweep")
  result = sweep(f"--root={root}", "--grid=task.hidden=4,32", "--metric=eval/mae",
                 "--", "--task=regression", "--mode=train_and_eval",
                 "--train_steps=60", "--learning_rate=0.01", "--steps_per_loop=20")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  rows = read_csv(root)
  assert {r["trial"] for r in rows} == {"task.hidden=4", "task.hidden=32"}
  assert {"eval/mae", "eval/rmse", "train/mae", "eval/loss"} <= rows[0].keys()
  assert "eval/accuracy" not in rows[0]
  maes = [float(r["eval/mae"]) for r in rows]
  assert maes == sorted(maes)  # The regression task's goal for mae: min.
  with open(os.path.join(root, "sweep.json")) as f:
    record = json.load(f)
  assert (record["metric"], record["goal"]) == ("eval/mae", "min")
  with open(os.path.join(root, rows[0]["trial"], "flags.txt")) as f:
    assert f"--task.hidden={rows[0]['task.hidden']}\n" in f.read()
  assert inspect_lib.main([root]) == 0
  assert "2 trials, sorted by eval/mae (min)" in capsys.readouterr().out


def test_a_metric_no_trial_reports_stops_the_sweep(tmp_path):
  root = str(tmp_path / "sweep")
  result = sweep(f"--root={root}", "--grid=task.hidden=4,8", "--metric=eval/maee",
                 "--", "--task=regression", "--mode=train_and_eval", "--train_steps=10")
  assert result.returncode == 2, result.stdout[-2000:]
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith("sweep.py: error: --metric=eval/maee: trial task.hidden=4 "
                         "completed without reporting it (it reports eval/loss, "
                         "eval/mae, eval/mse, eval/rmse")
  assert sweep_record(root)["task.hidden=8"]["status"] in ("pending", "interrupted")
