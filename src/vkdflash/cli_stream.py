"""Generated text streamed to a terminal that also shows the logs."""
from __future__ import annotations

import logging
import logging.handlers
import sys

import click


class TextStream:
    """Echoes generated text piece by piece. Where the logs go to the same terminal, a log line
    waits for the text's next line break: a warning in mid-line (a strategy switched off) split a
    line of generated code. What still waits when the text ends is printed after it."""

    def __init__(self, hold: bool | None = None, handler: logging.Handler | None = None, out=None):
        root = logging.getLogger()
        if hold is None:
            hold = sys.stdout.isatty() and sys.stderr.isatty()
        self.out, self.shown = out, (handler or (root.handlers[0] if root.handlers else None)) if hold else None
        if self.shown is not None:
            self.held = logging.handlers.MemoryHandler(1 << 20, logging.CRITICAL + 1, self.shown)
            root.removeHandler(self.shown)
            root.addHandler(self.held)

    def write(self, piece: str) -> None:
        cut = piece.rfind("\n") + 1
        if cut:
            click.echo(piece[:cut], nl=False, file=self.out)
            if self.shown is not None:
                self.held.flush()
        click.echo(piece[cut:], nl=False, file=self.out)

    def close(self) -> None:
        """Ends the text's line, then prints the log lines that waited for it."""
        click.echo(file=self.out)
        if self.shown is not None:
            root = logging.getLogger()
            root.removeHandler(self.held)
            root.addHandler(self.shown)
            self.held.flush()
            self.held.close()
            self.shown = None
