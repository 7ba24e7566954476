"""Prints docs/flags.md, the flag reference, from the flags' own definitions.

    python scripts/flag_reference.py > docs/flags.md

tests/test_config.py checks that the file is current.
"""

from trainer import config, tasks

HEADER = """# Flags

Every flag of `python -m trainer.main`, generated from their definitions
(`python scripts/flag_reference.py > docs/flags.md`); `--help` lists them too, and
`--helpfull` adds absl's own. A flagfile (`--flagfile=F`) holds one `--name=value`
per line; flags after it override it.

## The framework's flags
"""

TASKS = """
## The built-in tasks' flags

A task's hyperparameters are `--task.NAME` flags. The built-in tasks' also have
their short names (`--dataset=mnist` is `--task.dataset=mnist`).
"""


def main():
  print(HEADER)
  print(config.flag_table())
  print(TASKS)
  print("\n\n".join(config.reference.task_flag_table(tasks.load_task_class(name), name)
                    for name in tasks.BUILTIN))


if __name__ == "__main__":
  main()
