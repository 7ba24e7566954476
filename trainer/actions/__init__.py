"""Actions: what runs after every loop call, each in its own module, each owning
its schedule (`next_stop`), in this order:

  LedgerCheck   every replica got one per-replica batch per step (ledger.py)
  NanPolicy     a non-finite loss: stop and report, or roll back (nan_policy.py)
  Report        results.json, TensorBoard scalars, the progress line (report.py)
  Histograms    --histogram_every: weights and gradients (histograms.py)
  Profiler      --profile_steps' trace (profiler.py)
  Evaluate      --eval_every, the best checkpoint, early stopping (evaluate.py)
  ReduceOnPlateau  --reduce_lr_patience: the rate when evaluations stall (plateau.py)
  user actions  the task's `actions()`, then `train(..., actions=[...])` (user.py)
  Checkpoint    --checkpoint_every and the last step (checkpoint.py)
  SignalStop    SIGTERM or SIGINT (limits.py)
  TimeLimit     --max_time (limits.py)

A user's action is any callable receiving an `ActionContext`; `every(N, action)`
runs it every N steps, and returning `STOP` ends training (user.py).
"""

from trainer.actions.base import Action, LoopCall, Stop
from trainer.actions.user import STOP, ActionContext, Every, action_context, every

__all__ = ["Action", "ActionContext", "Every", "LoopCall", "STOP", "Stop",
           "action_context", "every"]
