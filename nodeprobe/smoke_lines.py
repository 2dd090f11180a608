"""The lines of the user's files that ran in one smoke rank (nodeprobe/smoke_record.py keeps them in the
rank's report): a finding of the static check is settled only where its line ran."""

from __future__ import annotations

import os
import sys
import threading


class Lines:
    """The lines of the user's files that ran (``sys.settrace``; frames of other files are not traced, so
    torch's own code runs at nearly full speed). Threads started after ``start`` are traced too; forked
    data-loader workers are not reported."""

    def __init__(self, code_root: str):
        self.root = code_root + os.sep
        self.ran: set[tuple[str, int]] = set()
        self.user: dict = {}  # code object -> its file relative to the code folder, or None
        # bound here: at interpreter exit, when module globals are gone, frames still call the tracer
        self.realpath, self.relpath, self.isabs = os.path.realpath, os.path.relpath, os.path.isabs

    def line(self, frame, event, _arg):
        if event == "line":
            self.ran.add((self.user.get(frame.f_code), frame.f_lineno))
        return self.line

    def call(self, frame, _event, _arg):
        code = frame.f_code
        rel = self.user.get(code, 0)
        if rel == 0:
            try:  # an exception here would be raised in the user's code
                path = self.realpath(code.co_filename) if self.isabs(code.co_filename) else ""
                rel = self.relpath(path, self.root) if path.startswith(self.root) else None
            except Exception:  # noqa: BLE001
                rel = None
            self.user[code] = rel
        return self.line if rel else None

    def start(self) -> None:
        threading.settrace(self.call)
        sys.settrace(self.call)

    def stop(self) -> None:
        sys.settrace(None)
        threading.settrace(None)

    def report(self) -> dict[str, list[int]]:
        by_file: dict[str, set[int]] = {}
        for rel, line in list(self.ran):
            by_file.setdefault(rel, set()).add(line)
        return {rel: sorted(lines) for rel, lines in sorted(by_file.items())}
