"""argparse for the scripts, with bad arguments reported on one line."""

import argparse


class ArgumentParser(argparse.ArgumentParser):
  """An ArgumentParser whose errors are one line (no usage dump), exit code 2."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
