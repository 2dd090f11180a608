"""Task timing for ddplab playbooks (ansible-core ships none; profile_tasks lives in ansible.posix).

Enabled in ansible.cfg; silent unless DDPLAB_TIMING=N is set, then the N slowest tasks (summed over
hosts' wall time per task, i.e. from a task's start to the next) are printed at the end of the run.
"""

from __future__ import annotations

import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: ddplab_timing
type: aggregate
short_description: The slowest tasks of a run, when DDPLAB_TIMING=N is set
description: Prints the N slowest tasks (wall time from a task's start to the next task's start).
requirements: [DDPLAB_TIMING in the environment]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddplab_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.top = int(os.environ.get("DDPLAB_TIMING", "0") or 0)
        self.start = time.monotonic()
        self.current: tuple[str, float] | None = None
        self.times: dict[str, float] = {}

    def _close(self):
        if self.current:
            name, t0 = self.current
            self.times[name] = self.times.get(name, 0.0) + time.monotonic() - t0
            self.current = None

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close()
        self.current = (f"{task.get_path() or ''} {task.get_name()}".strip(), time.monotonic())

    v2_playbook_on_handler_task_start = v2_playbook_on_task_start

    def v2_playbook_on_stats(self, stats):
        self._close()
        if not self.top:
            return
        total = time.monotonic() - self.start
        self._display.display(f"ddplab timing: {total:.1f} s in all, {len(self.times)} tasks; slowest:")
        for name, t in sorted(self.times.items(), key=lambda kv: -kv[1])[: self.top]:
            self._display.display(f"  {t:6.2f} s  {name}")
