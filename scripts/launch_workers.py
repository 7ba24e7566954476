#!/usr/bin/env python
"""Runs a local multi-worker cluster of trainer processes on 127.0.0.1.

  python scripts/launch_workers.py --num_workers=2 -- \
      --flagfile=flags/quickstart.flags --model_dir=runs/mw

Every flag after `--` goes to every worker, followed by --strategy=multi_worker.
Or a command after `--`, run as it is by every worker, with its TF_CONFIG: a
Keras program's trainer.fit trains on the workers:

  python scripts/launch_workers.py --num_workers=2 -- \
      python examples/fit_mnist_convnet.py --model_dir=runs/mw_fit

Exits with the chief's exit code, or non-zero naming the worker that died.
"""

import sys

from trainer.distribute import launcher

if __name__ == "__main__":
  sys.exit(launcher.main())
