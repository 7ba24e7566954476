"""trainer.fit: a Keras program's `model.fit(...)` as the framework's run.

fit.py is the front door; task.py the Task made from the compiled model
(compiled.py reads it), data.py fit()'s data arguments, callbacks.py the Keras
callbacks as the framework's settings, epochs.py the action that gives them
Keras's epoch logs, files.py the files they write, history.py the History,
command_line.py the framework's flags on the program's command line.
"""

from trainer.keras_fit.fit import fit

__all__ = ["fit"]
