"""What a sweep writes to its output: its messages, and the table of its trials,
redrawn in place on a terminal, else printed on every trial's start and end and
now and then (in a log, a table per second would bury everything else)."""

import time

_LIVE_TABLE_SECONDS = 1.0  # On a terminal the table is redrawn in place.
_PLAIN_TABLE_SECONDS = 30.0  # In a log: on every start and end, and this often.


class Display:
  """The sweep's output: messages and the live table."""

  def __init__(self, *, out, table):
    """Creates the display.

    Args:
      out: where the table and messages go (a text stream).
      table: `table() -> str`, the table's text now (built only when drawn: it
        reads the study).
    """
    self._out = out
    self._table = table
    self.live = out.isatty()  # Redrawn in place.
    self._drawn_lines = 0  # Lines of the table on screen (0: none to redraw).
    self._last_draw = 0.0

  def say(self, message: str):
    """Writes a line; the table is drawn again below it."""
    self._out.write(message + "\n")
    self._out.flush()
    self._drawn_lines = 0

  def draw(self, *, force: bool = False, final: bool = False):
    """Redraws the table in place on a terminal, else prints it now and then.

    Args:
      force: a trial started or ended: draw now.
      final: the last table, left on screen.
    """
    now = time.monotonic()
    interval = _LIVE_TABLE_SECONDS if self.live else _PLAIN_TABLE_SECONDS
    if not (force or final or now - self._last_draw >= interval):
      return
    text = self._table()
    if self.live and self._drawn_lines:
      self._out.write(f"\x1b[{self._drawn_lines}F\x1b[J")  # Up, then clear below.
    self._out.write(text + "\n")
    self._out.flush()
    self._drawn_lines = text.count("\n") + 1 if self.live and not final else 0
    self._last_draw = now
