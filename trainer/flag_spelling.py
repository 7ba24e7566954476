"""How the command line spells a value, and the built-in tasks' short flag
names: what the configuration and the tasks share (tasks import nothing of
trainer.config, which sits above them)."""

# Flags of the built-in tasks' hyperparameters, kept from before tasks owned them:
# --dataset=mnist is --task.dataset=mnist, for a task with that field.
TASK_FLAG_ALIASES = ("dataset", "data_path", "train_files", "eval_files",
                     "num_classes", "synthetic_examples", "synthetic_shape", "model",
                     "dropout", "l2")


def flag_value(value) -> str:
  """A value as its flag would spell it: lists joined by commas, booleans
  true/false."""
  if isinstance(value, (tuple, list)):
    return ",".join(str(v) for v in value)
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)
