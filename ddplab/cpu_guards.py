"""What a test in the user's code says about the device: the guards ddplab/cpu_patterns.py honours.

A test's *CUDA sense* is POS when its true branch only runs on CUDA (`if torch.cuda.is_available()`,
`device_type == "cuda"`, `torch.cuda.device_count() >= 2`, a name such as `use_cuda`, or a name assigned
only such tests: `ok = torch.cuda.is_available()` then `if ok:`), NEG when its false branch only runs on
CUDA (`if torch.cuda.device_count() < 2: sys.exit()`). Its *truth* is known when it is a constant or a
name hard-coded to one (`use_fp8 = False` then `if use_fp8:`): the other branch never runs.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field

POS, NEG = 1, -1  # a test whose true branch (POS) or false branch (NEG) only runs on CUDA / under DDP
EXITS = ("sys.exit", "exit", "quit", "os._exit")
COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}


@dataclass
class Names:
    """What the names of one body are bound to: assignments (module level and the body's own), how the
    module spells torch (`import torch as th`, `from torch import cuda`), and whether a config `exec()` or a
    `global` statement may rebind module-level names."""
    assigns: dict[str, list[ast.AST]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    rebindable: set[str] = field(default_factory=set)

    def canon(self, name: str) -> str:
        """`torch.cuda.synchronize` for `tc.synchronize` after `import torch.cuda as tc`."""
        head, _, rest = name.partition(".")
        full = self.aliases.get(head)
        return name if full is None else (f"{full}.{rest}" if rest else full)


def dotted(node: ast.AST) -> str:
    """`torch.cuda.set_device` for the expression torch.cuda.set_device; '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return ""


def cuda_string(node: ast.AST) -> bool:
    """"cuda", "cuda:0" or f"cuda:{local_rank}"."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith("cuda")
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and str(first.value).startswith("cuda")
    return False


def is_device_query(name: str) -> bool:
    """A call that asks the machine for GPUs: torch.cuda.*, torch.accelerator.*, a helper named *gpu*."""
    low = name.lower()
    return low.startswith(("torch.cuda.", "torch.accelerator.")) or "gpu" in low.rsplit(".", 1)[-1]


def _leaf_name(node: ast.AST) -> str:
    name = dotted(node)
    return name.rsplit(".", 1)[-1].lower() if name else ""


def _combine(node: ast.BoolOp, senses: list[int]) -> int:
    if isinstance(node.op, ast.And):
        return POS if POS in senses else (NEG if senses and all(s == NEG for s in senses) else 0)
    return NEG if NEG in senses else (POS if senses and all(s == POS for s in senses) else 0)


def _count_sense(test: ast.Compare, names: Names) -> int | None:
    """`torch.cuda.device_count() < 2` (NEG), `>= 1` (POS): decided by what the test gives for 0 GPUs."""
    left, right = test.left, test.comparators[0]
    op = COMPARE.get(type(test.ops[0]))
    for count, other, flip in ((left, right, False), (right, left, True)):
        if (op and isinstance(count, ast.Call) and is_device_query(names.canon(dotted(count.func)))
                and isinstance(other, ast.Constant) and isinstance(other.value, int)):
            on_cpu = op(other.value, 0) if flip else op(0, other.value)
            return NEG if on_cpu else POS
    return None


def cuda_sense(test: ast.AST, names: Names | None = None, depth: int = 0) -> int:
    """POS when the test is true only on CUDA, NEG when it is false only on CUDA, else 0."""
    names = names or Names()
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return -cuda_sense(test.operand, names, depth)
    if isinstance(test, ast.BoolOp):
        return _combine(test, [cuda_sense(v, names, depth) for v in test.values])
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        counted = _count_sense(test, names)
        if counted is not None:
            return counted
        op, sides = test.ops[0], [test.left, test.comparators[0]]
        consts = [s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)]
        positive = isinstance(op, (ast.Eq, ast.In, ast.Is))
        negative = isinstance(op, (ast.NotEq, ast.NotIn, ast.IsNot))
        if any(c.startswith("cuda") or c == "nccl" for c in consts):  # backend == "nccl": the CUDA path
            return POS if positive else (NEG if negative else 0)
        if "cpu" in consts or "gloo" in consts:
            return NEG if positive else (POS if negative else 0)
        if any("cuda" in names.canon(dotted(n)) for s in sides for n in ast.walk(s)):
            return POS  # torch.cuda.device_count() > n
        return 0
    if isinstance(test, ast.Call):
        name = names.canon(dotted(test.func))
        if "cuda" in name.lower() or is_device_query(name):
            return POS  # torch.cuda.is_available(), torch.accelerator.is_available(), has_enough_gpus()
        if name.endswith(".startswith") and test.args and cuda_string(test.args[0]):
            return POS
        return 0
    leaf = _leaf_name(test)
    if "cuda" in leaf or "gpu" in leaf:
        return POS
    values = names.assigns.get(test.id) if isinstance(test, ast.Name) and depth < 3 else None
    if values:  # a guard stored in a name: every assignment of it has the same sense
        senses = {cuda_sense(v, names, depth + 1) for v in values}
        return senses.pop() if len(senses) == 1 else 0
    return 0


def ddp_sense(test: ast.AST) -> int:
    """POS when the test is true only under DDP (`if ddp:`), NEG when only without it (`if not ddp:`)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return -ddp_sense(test.operand)
    if isinstance(test, ast.BoolOp):
        return _combine(test, [ddp_sense(v) for v in test.values])
    if isinstance(test, ast.Call):
        return POS if dotted(test.func).endswith("is_initialized") else 0
    leaf = _leaf_name(test)
    return POS if ("ddp" in leaf or "distributed" in leaf) else 0


def asks_device(test: ast.AST, names: Names, depth: int = 0) -> bool:
    """The test calls a device query, directly or through a name assigned one:
    `ok = torch.cuda.is_available()`; its answer on CPU nodes is known, unlike `device_type == "cuda"`,
    which a flag or `x if ... else y` sets."""
    for node in ast.walk(test):
        if isinstance(node, ast.Call) and is_device_query(names.canon(dotted(node.func))):
            return True
        if isinstance(node, ast.Name) and depth < 3 and any(
                not isinstance(v, ast.IfExp) and asks_device(v, names, depth + 1)
                for v in names.assigns.get(node.id, [])):
            return True
    return False


def truth(test: ast.AST, names: Names) -> bool | None:
    """True/False when the test is a constant or a name hard-coded to one; None when it can vary."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = truth(test.operand, names)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        got = [truth(v, names) for v in test.values]
        decisive = isinstance(test.op, ast.Or)  # or: any True decides; and: any False decides
        if decisive in got:
            return decisive
        return None if None in got else not decisive
    if isinstance(test, ast.Name) and test.id not in names.rebindable:
        values = names.assigns.get(test.id)
        if values and all(isinstance(v, ast.Constant) and isinstance(v.value, bool) for v in values):
            got = {v.value for v in values}
            return got.pop() if len(got) == 1 else None
    return None


def exits(stmts: list[ast.stmt]) -> bool:
    """The body ends the process: raise, sys.exit(), exit(), quit(), os._exit()."""
    last = stmts[-1] if stmts else None
    if isinstance(last, ast.Raise):
        return True
    return isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and \
        dotted(last.value.func) in EXITS


def ends_body(stmts: list[ast.stmt]) -> bool:
    """The body leaves the enclosing block: return, raise, continue, break, sys.exit()."""
    return exits(stmts) or bool(stmts) and isinstance(stmts[-1], (ast.Return, ast.Continue, ast.Break))
