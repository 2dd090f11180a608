"""``ddplab_fetch``: bring one file of the node to the control host, check the copy against the SHA-256 the
node gave, then remove the node's file; one task, no module run on the node.

Why not ``ansible.builtin.fetch``: before it copies, fetch runs the stat module on the node for the file's
checksum, a Python program Ansible packs, sends and starts there (AnsiballZ: the 0.4 CPU-seconds of the node
a call ddplab_node's docstring measured), and removing the file afterwards was a task of its own. The node
program that wrote the file already printed its checksum (nodeprobe/pack_run.py), so here: the
connection's ``fetch_file`` (the same sftp or scp transfer fetch makes), the copy's SHA-256 compared with
the node's, then ``rm -f`` of the node's file in the same task.

With ``become`` (the file may be readable by the become user only), or without a ``sha256`` (a node whose
synced code predates it), the file is fetched by ``ansible.builtin.fetch`` itself (stat, then a copy, or
slurp under become), then removed as above.

Arguments: ``src`` (the node's file), ``dest`` (the control host's path, a file; its folder is made),
``sha256`` (what the node printed; empty: fetch's own check), ``remove`` (remove ``src`` once fetched).
Returns ``dest``, ``sha256``, ``changed``. Fails, leaving the node's file there for a look, when the
transfer fails or the copy's checksum differs (the copy is then removed). Skipped in check mode, as fetch.
"""

from __future__ import annotations

import contextlib
import os
import shlex

from ansible.plugins.action import ActionBase

from nodeprobe.hashing import sha256_file  # as nodeprobe/pack_run.py computes the node's checksum

DOCUMENTATION = """
name: ddplab_fetch
short_description: Fetch a file the node gave the checksum of, check it, remove it from the node
options:
  src: {type: str, required: true, description: The file on the node.}
  dest: {type: path, required: true, description: The file on the control host (its folder is made).}
  sha256: {type: str, default: "", description: The SHA-256 the node printed (empty, fetch's own check).}
  remove: {type: bool, default: false, description: Remove src from the node once fetched.}
"""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("src", "dest", "sha256", "remove"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec={
            "src": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "sha256": {"type": "str", "default": ""},
            "remove": {"type": "bool", "default": False},
        })
        if self._play_context.check_mode:
            result.update(skipped=True, msg="skipped in check mode (as ansible.builtin.fetch)")
            return result
        src, dest, expected = args["src"], args["dest"], (args["sha256"] or "").strip().lower()
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        src = self._remote_expand_user(src)
        if expected and not self._connection.become:
            self._connection.fetch_file(src, dest)
            got = sha256_file(dest, use_cache=False)
            if got != expected:
                with contextlib.suppress(OSError):
                    os.unlink(dest)
                result.update(failed=True, msg=f"ddplab_fetch: the copy of {src} has SHA-256 {got}, the "
                              f"node's file {expected}; the node's file is left there; collect again")
                return result
        else:
            fetched = self._builtin_fetch(src, dest, task_vars or {})
            if fetched.get("failed"):
                return {**result, **fetched}
            got = sha256_file(dest, use_cache=False)
        if args["remove"]:
            res = self._low_level_execute_command(shlex.join(["rm", "-f", "--", src]))
            if res["rc"] != 0:
                why = res["stderr"].strip() or res["stdout"].strip()
                result.update(failed=True, msg=f"ddplab_fetch: fetched {src}, but could not remove it from "
                              f"the node: {why}")
        result.update(changed=True, dest=dest, sha256=got)
        return result

    def _builtin_fetch(self, src: str, dest: str, task_vars: dict) -> dict:
        """ansible.builtin.fetch's answer for src -> dest (flat), run as that task would run."""
        task = self._task.copy()
        task.args = {"src": src, "dest": dest, "flat": True}
        action = self._shared_loader_obj.action_loader.get(
            "ansible.builtin.fetch", task=task, connection=self._connection, play_context=self._play_context,
            loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        return action.run(task_vars=task_vars)
