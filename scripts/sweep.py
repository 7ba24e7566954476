#!/usr/bin/env python
"""Grid or random search over trainer flags, resumable, compared in TensorBoard.

  python scripts/sweep.py --root=runs/sweep1 --base_flagfile=flags/quickstart.flags \
      --grid=learning_rate=0.01,0.003,0.001 --grid=per_replica_batch_size=16,32 \
      --parallel=2

See docs/sweeps.md and `python scripts/sweep.py --help`.
"""

import sys

from trainer.sweeps import cli

if __name__ == "__main__":
  sys.exit(cli.main())
