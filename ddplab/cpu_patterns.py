"""AST patterns of CUDA-minded training code that fail or misbehave on CPU nodes under gloo.

`scan_unit(...)` walks one body (a module's top level or one function) and returns the findings in it.
A guard is the test of an `if`, a conditional expression or a short-circuit `and`/`or`: code on the branch
that only runs when the device is CUDA (`if torch.cuda.is_available()`, `device_type == "cuda"`,
`"cuda" in device`, a name such as `use_cuda`, the rest of a body after `if device_type != "cuda": return`)
is not flagged, nor is code on the branch that only runs without DDP (`if not ddp:`).
What raises on the CPU wheel was measured on torch 2.13 (tests/control/test_code_check.py runs it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

# torch.cuda functions that raise on the CPU wheel (others, e.g. manual_seed, empty_cache, device_count,
# max_memory_allocated, amp.GradScaler, are no-ops there).
CUDA_ONLY_CALLS = {"set_device", "synchronize", "current_device", "get_device_name", "get_device_properties",
                   "get_device_capability", "mem_get_info", "reset_peak_memory_stats"}
REDUCE_SCATTERS = {"reduce_scatter", "reduce_scatter_tensor"}
POS, NEG = 1, -1  # a test whose true branch (POS) or false branch (NEG) only runs on CUDA / under DDP


@dataclass
class Finding:
    """One place in the user's code: file:line, error (certainly fails) or warning, why, and the patch."""
    path: str
    line: int
    kind: str
    severity: str
    what: str
    why: str
    patch: str
    reached: bool = True

    def text(self) -> str:
        where = f"{self.path}:{self.line}"
        return f"ddplab: {self.severity}: {where}: {self.what}; {self.why}; patch: {self.patch}"


@dataclass
class Ctx:
    cuda: bool = False     # only runs on CUDA
    no_ddp: bool = False   # only runs without DDP
    caught: bool = False   # inside a try with handlers: an exception there does not end the rank


@dataclass
class UnitScan:
    """What one body holds: findings, and its init_process_group calls (guarded or not) for the program."""
    findings: list[Finding] = field(default_factory=list)
    pg_calls: list[tuple[int, bool, str]] = field(default_factory=list)


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


def _leaf_name(node: ast.AST) -> str:
    name = dotted(node)
    return name.rsplit(".", 1)[-1].lower() if name else ""


def _combine(node: ast.BoolOp, senses: list[int]) -> int:
    if isinstance(node.op, ast.And):
        return POS if POS in senses else (NEG if senses and all(s == NEG for s in senses) else 0)
    return NEG if NEG in senses else (POS if senses and all(s == POS for s in senses) else 0)


def cuda_sense(test: ast.AST) -> int:
    """POS when the test is true only on CUDA, NEG when it is false only on CUDA, else 0."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return -cuda_sense(test.operand)
    if isinstance(test, ast.BoolOp):
        return _combine(test, [cuda_sense(v) for v in test.values])
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, sides = test.ops[0], [test.left, test.comparators[0]]
        consts = [s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)]
        positive = isinstance(op, (ast.Eq, ast.In, ast.Is))
        negative = isinstance(op, (ast.NotEq, ast.NotIn, ast.IsNot))
        if any(c.startswith("cuda") or c == "nccl" for c in consts):  # backend == "nccl": the CUDA path
            return POS if positive else (NEG if negative else 0)
        if "cpu" in consts or "gloo" in consts:
            return NEG if positive else (POS if negative else 0)
        if any("cuda" in dotted(n) for s in sides for n in ast.walk(s)):
            return POS  # torch.cuda.device_count() > 0
        return 0
    if isinstance(test, ast.Call):
        name = dotted(test.func)
        if "cuda" in name.lower():
            return POS  # torch.cuda.is_available()
        if name.endswith(".startswith") and test.args and cuda_string(test.args[0]):
            return POS
        return 0
    leaf = _leaf_name(test)
    return POS if ("cuda" in leaf or "gpu" in leaf) else 0


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


def ends_body(stmts: list[ast.stmt]) -> bool:
    """The body leaves the enclosing block: return, raise, continue, break, sys.exit()."""
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    return isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and \
        dotted(last.value.func) in ("sys.exit", "exit", "quit", "os._exit")


class UnitScanner:
    """Walks one body with the guards in force at each node; nested function bodies are walked too."""

    def __init__(self, path: str, source: str, ddp_names: set[str], assigns: dict[str, list[ast.AST]],
                 config_exec: bool, skip_defs: bool):
        self.path, self.source, self.ddp_names, self.skip_defs = path, source, ddp_names, skip_defs
        self.assigns, self.config_exec = assigns, config_exec
        self.out = UnitScan()
        self.works: dict[str, int] = {}  # name -> line of `name = dist.reduce_scatter*(..., async_op=True)`

    def src(self, node: ast.AST, limit: int = 70) -> str:
        text = " ".join((ast.get_source_segment(self.source, node) or ast.unparse(node)).split())
        return text if len(text) <= limit else text[: limit - 3] + "..."

    def add(self, node, kind, severity, what, why, patch):
        self.out.findings.append(Finding(self.path, node.lineno, kind, severity, what, why, patch))

    # statements ------------------------------------------------------------------------------------
    def body(self, stmts: list[ast.stmt], ctx: Ctx) -> None:
        for stmt in stmts:
            self.stmt(stmt, ctx)
            # `if device_type != "cuda": return` -> the rest only runs on CUDA
            if isinstance(stmt, ast.If) and ends_body(stmt.body) and cuda_sense(stmt.test) == NEG:
                ctx = Ctx(True, ctx.no_ddp, ctx.caught)

    def branches(self, test: ast.AST, ctx: Ctx) -> tuple[Ctx, Ctx]:
        c, d = cuda_sense(test), ddp_sense(test)
        yes = Ctx(ctx.cuda or c == POS, ctx.no_ddp or d == NEG, ctx.caught)
        no = Ctx(ctx.cuda or c == NEG, ctx.no_ddp or d == POS, ctx.caught)
        return yes, no

    def stmt(self, node: ast.stmt, ctx: Ctx) -> None:
        if self.skip_defs and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return  # a function is its own unit, scanned (and judged reached or not) apart
        if isinstance(node, (ast.If, ast.While)):
            self.expr(node.test, ctx)
            yes, no = self.branches(node.test, ctx)
            self.body(node.body, yes)
            self.body(node.orelse, no)
            return
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            self.body(node.body, Ctx(ctx.cuda, ctx.no_ddp, bool(node.handlers) or ctx.caught))
            for handler in node.handlers:
                self.body(handler.body, ctx)
            self.body(node.orelse, ctx)
            self.body(node.finalbody, ctx)
            return
        if isinstance(node, ast.Assign):
            self.track_work(node)
            self.cuda_assignment(node, ctx)
        for name, value in ast.iter_fields(node):
            if name == "decorator_list":
                continue
            items = value if isinstance(value, list) else [value]
            stmts = [v for v in items if isinstance(v, ast.stmt)]
            if stmts:
                self.body(stmts, ctx)
            for v in items:
                if isinstance(v, ast.expr):
                    self.expr(v, ctx)
                elif isinstance(v, ast.AST) and not isinstance(v, ast.stmt):
                    for sub in ast.iter_child_nodes(v):  # match_case, withitem, comprehension, arguments
                        if isinstance(sub, ast.stmt):
                            self.stmt(sub, ctx)
                        elif isinstance(sub, ast.expr):
                            self.expr(sub, ctx)

    def track_work(self, node: ast.Assign) -> None:
        call = node.value
        if isinstance(call, ast.Call) and dotted(call.func).rsplit(".", 1)[-1] in REDUCE_SCATTERS and any(
                k.arg == "async_op" and isinstance(k.value, ast.Constant) and k.value.value
                for k in call.keywords):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.works[target.id] = node.lineno

    def cuda_assignment(self, node: ast.Assign, ctx: Ctx) -> None:
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if ctx.cuda or ctx.no_ddp or not cuda_string(node.value) or not any("device" in n for n in names):
            return
        self.add(node, "cuda-device-string", "warning", f"{self.src(node)} names a CUDA device",
                 "moving a model or tensor to it fails on CPU nodes (Torch not compiled with CUDA enabled)",
                 f'{names[0]} = "cuda" if torch.cuda.is_available() else "cpu" (or pass --device=cpu)')

    # expressions -----------------------------------------------------------------------------------
    def expr(self, node: ast.AST, ctx: Ctx) -> None:
        if isinstance(node, ast.IfExp):
            self.expr(node.test, ctx)
            yes, no = self.branches(node.test, ctx)
            self.expr(node.body, yes)
            self.expr(node.orelse, no)
            return
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self.expr(value, ctx)
                yes, no = self.branches(value, ctx)
                # later operands run only when this one lets them
                ctx = yes if isinstance(node.op, ast.And) else no
            return
        if isinstance(node, ast.Call):
            self.call(node, ctx)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.expr, ast.keyword, ast.comprehension)):
                self.expr(child, ctx)
            elif isinstance(child, ast.AST):
                for sub in ast.iter_child_nodes(child):
                    self.expr(sub, ctx)

    def call(self, node: ast.Call, ctx: Ctx) -> None:
        name = dotted(node.func)
        attr = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        last = name.rsplit(".", 1)[-1] if name else attr
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if last == "init_process_group":
            self.out.pg_calls.append((node.lineno, ctx.cuda, self.src(node)))
            backend = kw.get("backend", node.args[0] if node.args else None)
            if backend is not None and not ctx.cuda:
                self.backend(node, backend)
        if last == "get_future" and isinstance(node.func, ast.Attribute):
            self.get_future(node, node.func.value)
        if last in REDUCE_SCATTERS:
            op = kw.get("op", node.args[2] if len(node.args) > 2 else None)
            if op is not None and dotted(op).endswith("AVG"):
                self.add(node, "reduce-scatter-avg", "warning", f"{self.src(node)} uses ReduceOp.AVG",
                         "gloo's AVG summed instead of averaging in some torch versions (pytorch#162338; "
                         "a 2-rank test with torch 2.13 here averaged): compare with a single-process result",
                         "op=ReduceOp.SUM, then divide by dist.get_world_size()")
        if ctx.cuda or ctx.no_ddp or ctx.caught:
            return
        if name.startswith("torch.cuda.") and last in CUDA_ONLY_CALLS:
            self.add(node, "cuda-call", "error", f"{self.src(node)} runs with no CUDA guard",
                     f"torch.cuda.{last} raises on the CPU wheel (no CUDA in torch)",
                     f"if torch.cuda.is_available(): {self.src(node, 50)}")
        elif last == "cuda" and isinstance(node.func, ast.Attribute) and name != "torch.cuda":
            self.add(node, "dot-cuda", "error", f"{self.src(node)} moves to CUDA with no guard",
                     "AssertionError: Torch not compiled with CUDA enabled",
                     f"{self.src(node.func.value, 40)}.to(device) with device \"cpu\" on CPU nodes")
        elif name == "torch.device" and node.args and cuda_string(node.args[0]):
            self.add(node, "cuda-device-string", "warning", f"{self.src(node)} names a CUDA device",
                     "a tensor or model moved to it fails on CPU nodes",
                     'torch.device("cuda" if torch.cuda.is_available() else "cpu")')
        elif cuda_string(kw.get("device", ast.Constant(None))) or (last == "to" and node.args and
                                                                   cuda_string(node.args[0])):
            self.add(node, "cuda-tensor", "error", f"{self.src(node)} puts a tensor on CUDA with no guard",
                     "AssertionError: Torch not compiled with CUDA enabled",
                     'device="cuda" if torch.cuda.is_available() else "cpu"')
        if last in self.ddp_names:
            ids = kw.get("device_ids", node.args[1] if len(node.args) > 1 else None)
            if ids is not None and self.ids_on_cpu(ids):
                self.add(node, "ddp-device-ids", "error", f"{self.src(node)} passes device_ids",
                         "DistributedDataParallel raises ValueError for a model on CPU (device_ids only work "
                         "with GPU modules)",
                         f"device_ids={self.src(ids, 30)} if torch.cuda.is_available() else None")

    def ids_on_cpu(self, ids: ast.AST) -> bool:
        """device_ids that are a list on a CPU run: not None, not chosen by a condition, and, for a name,
        every assignment of it a list (a parameter or a conditional assignment is given the benefit)."""
        if isinstance(ids, ast.Constant) and ids.value is None or isinstance(ids, ast.IfExp):
            return False
        if isinstance(ids, ast.Name):
            values = self.assigns.get(ids.id)
            return bool(values) and all(isinstance(v, (ast.List, ast.Tuple)) for v in values)
        return True

    def backend(self, node: ast.Call, backend: ast.AST) -> None:
        values = self.values(backend)
        if not values or any(not isinstance(v, str) or "gloo" in v or "cpu" in v for v in values):
            return
        if not any("nccl" in v for v in values):
            return
        overridable = isinstance(backend, ast.Name) and self.config_exec
        self.add(node, "nccl", "warning" if overridable else "error",
                 f"{self.src(node)} asks for nccl" + (" (its default; the script exec()s a config that may "
                                                      "override it)" if overridable else ""),
                 "the CPU wheel has no NCCL (RuntimeError: Distributed package doesn't have NCCL built in)",
                 'backend="nccl" if torch.cuda.is_available() else "gloo"' +
                 (" (or pass --backend=gloo)" if overridable else ""))

    def values(self, node: ast.AST, depth: int = 0) -> list | None:
        """The strings an expression can hold when every assignment of it is a constant; None: unknown."""
        if isinstance(node, ast.Constant):
            return [node.value]
        if isinstance(node, ast.IfExp):
            a, b = self.values(node.body, depth), self.values(node.orelse, depth)
            return None if a is None or b is None else a + b
        if isinstance(node, ast.Name) and depth < 3 and node.id in self.assigns:
            out: list = []
            for value in self.assigns[node.id]:
                got = self.values(value, depth + 1)
                if got is None:
                    return None
                out += got
            return out
        return None

    def get_future(self, node: ast.Call, work: ast.AST) -> None:
        is_rs = isinstance(work, ast.Call) and dotted(work.func).rsplit(".", 1)[-1] in REDUCE_SCATTERS
        if not (is_rs or (isinstance(work, ast.Name) and work.id in self.works)):
            return
        self.add(node, "get-future", "error", f"{self.src(node)} asks gloo reduce-scatter work for a future",
                 "gloo raises RuntimeError: Work::getFuture not implemented (all_reduce's future works)",
                 "keep the Work and call work.wait() instead of .get_future().wait()")


def scan_unit(path, source, stmts, ddp_names, assigns, config_exec, skip_defs) -> UnitScan:
    """Findings in one body: a module's top level (skip_defs: without its functions) or one function."""
    scanner = UnitScanner(path, source, ddp_names, assigns, config_exec, skip_defs)
    scanner.body(stmts, Ctx())
    return scanner.out
