"""Running the Keras programs of examples/ in this process, as written: with
`trainer.fit`, or with Keras's own `model.fit` in its place (`keras_fit`: the
program as keras-io wrote it, since the port changed nothing else)."""

import contextlib
import os
import runpy
import sys

import keras

import trainer
from conftest import REPO

EXAMPLES = os.path.join(REPO, "examples")


def keras_fit(build, x=None, y=None, *, model_dir=None, **arguments):
  """What the program did before its port: `model = build(); model.fit(...)`
  (seeded as the framework seeds build())."""
  del model_dir  # trainer.fit's alone.
  keras.utils.set_random_seed(0)
  model = build()
  return model.fit(x, y, **arguments)


@contextlib.contextmanager
def _program_context(directory, argv, fit):
  previous = (os.getcwd(), list(sys.argv), trainer.fit)
  os.chdir(directory)
  sys.argv = list(argv)
  trainer.fit = fit
  try:
    yield
  finally:
    os.chdir(previous[0])
    sys.argv = previous[1]
    trainer.fit = previous[2]


def run(name: str, directory, *flags, fit=None):
  """Runs examples/NAME in `directory` (its working directory) with `flags` on
  its command line; returns the History its fit returned (trainer.fit's, or
  `fit`'s)."""
  histories = []
  real = fit or trainer.fit

  def recorded(*args, **kwargs):
    histories.append(real(*args, **kwargs))
    return histories[-1]

  path = os.path.join(EXAMPLES, name)
  with _program_context(directory, [path, *flags], recorded):
    runpy.run_path(path, run_name="__main__")
  [history] = histories
  return history
