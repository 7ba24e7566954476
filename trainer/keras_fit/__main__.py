"""`python -m trainer.keras_fit my_program.py [ARGS]`: see program.py."""

import sys

from trainer.keras_fit import program

sys.exit(program.main(sys.argv[1:]))
