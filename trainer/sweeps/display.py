"""What a sweep writes to its output: its messages, and the table of its trials,
redrawn in place on a terminal; in a log, a line per finished trial and the whole
table once, at the end (a table per trial would bury everything else)."""

import time

_LIVE_TABLE_SECONDS = 1.0  # On a terminal the table is redrawn in place.


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
    """Redraws the table in place on a terminal; in a log, only the final one.

    Args:
      force: a trial started or ended: draw now.
      final: the last table, left on screen.
    """
    now = time.monotonic()
    if not final and not (self.live and (force or
                                         now - self._last_draw >= _LIVE_TABLE_SECONDS)):
      return
    text = self._table()
    if self.live and self._drawn_lines:
      self._out.write(f"\x1b[{self._drawn_lines}F\x1b[J")  # Up, then clear below.
    self._out.write(text + "\n")
    self._out.flush()
    self._drawn_lines = text.count("\n") + 1 if self.live and not final else 0
    self._last_draw = now
