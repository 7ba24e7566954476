"""`python -m trainer.replay --model_dir=D --step=S [--dump=FILE.npz]`

Replays step S of a run from its newest checkpoint before S, exactly as training
ran it, and prints the step's loss, gradient norms (per variable), its first
non-finite gradient and the examples it read: the numbers of MODEL_DIR/
divergence.json for the step that diverged (bit for bit under --deterministic),
or of any other step. --dump writes the step's batch and gradients to an .npz.
The run directory is only read.
"""

import os
import sys

from trainer import argparsing, tf_loader
from trainer.errors import TrainerError, one_line


def main(argv=None) -> int:
  parser = argparsing.ArgumentParser(
      prog="python -m trainer.replay",
      description="Replay one training step of a run (e.g. the one that diverged).")
  parser.add_argument("--model_dir", required=True, help="the run directory")
  parser.add_argument("--step", type=int, required=True,
                      help="the step to replay (divergence.json's step)")
  parser.add_argument("--dump", help="write the step's batch, example indices and "
                                     "gradients to this .npz file")
  parser.add_argument("--cpu_devices", type=int,
                      help="logical CPU devices to replay on (default: the run's)")
  args = parser.parse_args(argv)
  if args.step < 1:
    parser.error(f"--step={args.step}: must be >= 1")
  if args.dump and not args.dump.endswith(".npz"):
    parser.error(f"--dump={args.dump}: must be a path ending in .npz")
  if args.dump and not os.path.isdir(os.path.dirname(args.dump) or "."):
    parser.error(f"--dump={args.dump}: no directory "
                 f"{os.path.dirname(args.dump)} to write it in")
  tf_loader.load_tensorflow()
  from trainer.training import divergence  # Imports TensorFlow.
  try:
    report = divergence.replay_run(args.model_dir, args.step, dump=args.dump,
                                   cpu_devices=args.cpu_devices)
  except TrainerError as e:
    print(f"error: {one_line(e, limit=None)}", file=sys.stderr, flush=True)
    return int(e.exit_code)
  print(divergence.format_report(report), flush=True)
  if args.dump:
    print(f"wrote {args.dump}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
