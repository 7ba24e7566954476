"""`python -m trainer.inspect PATH`: a run or sweep summary without TensorBoard.

For use over ssh: reads results.json and the event files (every point, none
sampled away) and prints what TensorBoard would show in numbers. PATH is a run
directory (with train/ and maybe results.json) or a sweep root (with sweep.json,
or run directories below it). A command line on top of both: the run's summary
is the trainer's (outputs/run_summary.py), the sweep's is the sweep package's
(sweeps/summary.py).
"""

import os
import sys

from trainer.outputs.run_summary import is_run, run_summary


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 1 or argv[0].startswith("-"):
    print("usage: python -m trainer.inspect RUN_OR_SWEEP_DIR", file=sys.stderr)
    return 2
  path = argv[0]
  if not os.path.isdir(path):
    print(f"inspect: error: {path}: no such directory", file=sys.stderr)
    return 2
  if is_run(path):
    print(run_summary(path))
  else:
    from trainer.sweeps.summary import sweep_summary  # Only for a sweep's root.
    print(sweep_summary(path))
  return 0


if __name__ == "__main__":
  sys.exit(main())
