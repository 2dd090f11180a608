"""AST patterns of CUDA-minded training code that fail or misbehave on CPU nodes under gloo.

`scan_unit(...)` walks one body (a module's top level or one function) and returns the findings in it.
A guard is the test of an `if`, a conditional expression or a short-circuit `and`/`or` (ddplab/cpu_guards.py):
code on the branch that only runs when the device is CUDA (`if torch.cuda.is_available()`,
`device_type == "cuda"`, `"cuda" in device`, a name such as `use_cuda` or one assigned such a test, the rest
of a body after `if device_type != "cuda": return` or `if torch.cuda.device_count() < 2: sys.exit()`) is not
flagged, nor is code on the branch that only runs without DDP (`if not ddp:`), nor a branch that never runs
(`if False:`, `use_fp8 = False` then `if use_fp8:`).
What raises on the CPU wheel was measured on torch 2.13 (tests/control/test_code_check.py runs it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ddplab.cpu_guards import (
    NEG,
    POS,
    Names,
    asks_device,
    cuda_sense,
    cuda_string,
    ddp_sense,
    dotted,
    ends_body,
    exits,
    truth,
)

# torch.cuda functions that raise on the CPU wheel (others, e.g. manual_seed, empty_cache, device_count,
# max_memory_allocated, amp.GradScaler, are no-ops there).
CUDA_ONLY_CALLS = {"set_device", "synchronize", "current_device", "get_device_name", "get_device_properties",
                   "get_device_capability", "mem_get_info", "reset_peak_memory_stats"}
REDUCE_SCATTERS = {"reduce_scatter", "reduce_scatter_tensor"}
# packages the CPU wheel does not bring and whose kernels need a GPU
CUDA_ONLY_PACKAGES = {"triton", "flash_attn", "apex", "xformers"}
# findings about CUDA use: in a function called only from CUDA-only code they are guarded, not findings
CUDA_USE_KINDS = {"cuda-call", "dot-cuda", "cuda-tensor", "cuda-device-string", "ddp-device-ids",
                  "to-ordinal", "map-location", "device-id", "nccl", "cuda-required", "cuda-import"}


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
class ModuleFacts:
    """What the scan of any body of a module needs to know about the program around it."""
    ddp_names: set[str]                      # DistributedDataParallel and its aliases
    config_exec: bool                        # the module exec()s a config file that may rebind its names
    functions: dict[str, ast.AST]            # the module's top-level functions, by name
    flag_defaults: dict[str, tuple[str, object]]  # argparse dest -> (option, default), program-wide


@dataclass
class UnitScan:
    """What one body holds: findings, its init_process_group and DistributedDataParallel calls (line, under a
    CUDA guard, source) for the program, and the dotted names it uses (with: used only on CUDA)."""
    findings: list[Finding] = field(default_factory=list)
    pg_calls: list[tuple[int, bool, str]] = field(default_factory=list)
    ddp_calls: list[tuple[int, bool, str]] = field(default_factory=list)
    refs: list[tuple[list[str], bool]] = field(default_factory=list)


class UnitScanner:
    """Walks one body with the guards in force at each node; nested function bodies are walked too."""

    def __init__(self, path: str, source: str, facts: ModuleFacts, names: Names, skip_defs: bool):
        self.path, self.source, self.facts, self.names, self.skip_defs = path, source, facts, names, skip_defs
        self.out = UnitScan()
        self.works: dict[str, int] = {}  # name -> line of `name = dist.reduce_scatter*(..., async_op=True)`
        self.flag: str | None = None     # the option whose default values() read last

    def src(self, node: ast.AST, limit: int = 70) -> str:
        text = " ".join((ast.get_source_segment(self.source, node) or ast.unparse(node)).split())
        return text if len(text) <= limit else text[: limit - 3] + "..."

    def add(self, node, kind, severity, what, why, patch):
        self.out.findings.append(Finding(self.path, node.lineno, kind, severity, what, why, patch))

    def name(self, node: ast.AST) -> str:
        return self.names.canon(dotted(node))

    @staticmethod
    def free(ctx: Ctx) -> bool:
        """Code where a CUDA failure ends a DDP rank: no CUDA guard, not the no-DDP branch, no try."""
        return not (ctx.cuda or ctx.no_ddp or ctx.caught)

    # statements ------------------------------------------------------------------------------------
    def body(self, stmts: list[ast.stmt], ctx: Ctx) -> None:
        for stmt in stmts:
            self.stmt(stmt, ctx)
            # `if device_type != "cuda": return`, `if torch.cuda.device_count() < 2: sys.exit()`
            # -> the rest only runs on CUDA
            if isinstance(stmt, ast.If) and ends_body(stmt.body) and self.sense(stmt.test) == NEG:
                ctx = Ctx(True, ctx.no_ddp, ctx.caught)

    def sense(self, test: ast.AST) -> int:
        return cuda_sense(test, self.names)

    def branches(self, test: ast.AST, ctx: Ctx) -> tuple[Ctx, Ctx]:
        c, d = self.sense(test), ddp_sense(test)
        yes = Ctx(ctx.cuda or c == POS, ctx.no_ddp or d == NEG, ctx.caught)
        no = Ctx(ctx.cuda or c == NEG, ctx.no_ddp or d == POS, ctx.caught)
        return yes, no

    def stmt(self, node: ast.stmt, ctx: Ctx) -> None:
        if self.skip_defs and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                self.expr(deco, ctx)
            return  # a function is its own unit, scanned (and judged reached or not) apart
        if isinstance(node, (ast.If, ast.While)):
            known = truth(node.test, self.names)
            self.expr(node.test, ctx)
            yes, no = self.branches(node.test, ctx)
            if known is not False:
                self.body(node.body, yes)
            if known is not True:
                self.body(node.orelse, no)
            if isinstance(node, ast.If) and known is None and self.free(ctx):
                self.cuda_required_exit(node)
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
        if isinstance(node, ast.Assert) and self.free(ctx) and self.sense(node.test) == POS \
                and asks_device(node.test, self.names):
            self.add(node, "cuda-required", "error", f"{self.src(node)} requires a GPU",
                     "AssertionError on CPU nodes: every rank stops here",
                     "drop the assert, or assert only when the device is CUDA")
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (ctx.cuda or ctx.caught):
            self.cuda_import(node)
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

    def cuda_required_exit(self, node: ast.If) -> None:
        """`if not torch.cuda.is_available(): sys.exit(...)` / `raise`: every rank stops on CPU nodes."""
        if self.sense(node.test) == NEG and exits(node.body) and asks_device(node.test, self.names):
            self.add(node, "cuda-required", "error", f"{self.src(node.test)} stops the program without a GPU",
                     "on CPU nodes every rank exits here, before any training",
                     "run the CPU path when no GPU is there (device \"cpu\", backend \"gloo\")")

    def cuda_import(self, node: ast.Import | ast.ImportFrom) -> None:
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if not node.level else []
        for mod in mods:
            top = mod.split(".")[0]
            if top in CUDA_ONLY_PACKAGES:
                self.add(node, "cuda-import", "warning", f"import {mod} needs a CUDA-only package",
                         f"the CPU wheel does not bring {top} (ModuleNotFoundError unless "
                         "ddplab_pip_requirements installs it; its kernels need a GPU)",
                         f"try: import {mod} / except ImportError: fall back to the torch code")
                return

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
            known = truth(node.test, self.names)
            self.expr(node.test, ctx)
            yes, no = self.branches(node.test, ctx)
            if known is not False:
                self.expr(node.body, yes)
            if known is not True:
                self.expr(node.orelse, no)
            return
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self.expr(value, ctx)
                yes, no = self.branches(value, ctx)
                # later operands run only when this one lets them
                ctx = yes if isinstance(node.op, ast.And) else no
            return
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = dotted(node)
            if name:
                self.out.refs.append((name.split("."), ctx.cuda))
        if isinstance(node, ast.Call):
            self.call(node, ctx)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.expr, ast.keyword, ast.comprehension)):
                self.expr(child, ctx)
            elif isinstance(child, ast.AST):
                for sub in ast.iter_child_nodes(child):
                    self.expr(sub, ctx)

    def call(self, node: ast.Call, ctx: Ctx) -> None:
        name = self.name(node.func)
        attr = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        last = name.rsplit(".", 1)[-1] if name else attr
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if last == "init_process_group":
            self.process_group(node, kw, ctx)
        if last == "get_future" and isinstance(node.func, ast.Attribute):
            self.get_future(node, node.func.value)
        if last in REDUCE_SCATTERS:
            op = kw.get("op", node.args[2] if len(node.args) > 2 else None)
            if op is not None and dotted(op).endswith("AVG"):
                self.add(node, "reduce-scatter-avg", "warning", f"{self.src(node)} uses ReduceOp.AVG",
                         "gloo's AVG summed instead of averaging in some torch versions (pytorch#162338; "
                         "a 2-rank test with torch 2.13 here averaged): compare with a single-process result",
                         "op=ReduceOp.SUM, then divide by dist.get_world_size()")
        if last in self.facts.ddp_names:
            self.out.ddp_calls.append((node.lineno, ctx.cuda, self.src(node)))
        if not self.free(ctx):
            return
        if name.startswith("torch.cuda.") and last in CUDA_ONLY_CALLS:
            self.add(node, "cuda-call", "error", f"{self.src(node)} runs with no CUDA guard",
                     f"torch.cuda.{last} raises on the CPU wheel (no CUDA in torch)",
                     f"if torch.cuda.is_available(): {self.src(node, 50)}")
        elif name == "torch.accelerator.set_device_index":
            self.add(node, "cuda-call", "error", f"{self.src(node)} runs with no accelerator guard",
                     "RuntimeError: Cannot access accelerator device when none is available",
                     f"if torch.accelerator.is_available(): {self.src(node, 50)}")
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
        elif last == "to" and isinstance(node.func, ast.Attribute) and node.args:
            self.to_ordinal(node, node.args[0])
        if "map_location" in kw and self.cuda_valued(kw["map_location"]):
            self.add(node, "map-location", self.severity(kw["map_location"]),
                     f"{self.src(node)} loads onto a CUDA device",
                     "RuntimeError: Attempting to deserialize object on a CUDA device but "
                     "torch.cuda.is_available() is False",
                     'map_location="cpu" (or the run\'s device)')
        if last in self.facts.ddp_names:
            ids = kw.get("device_ids", node.args[1] if len(node.args) > 1 else None)
            if ids is not None and self.ids_on_cpu(ids):
                self.add(node, "ddp-device-ids", "error", f"{self.src(node)} passes device_ids",
                         "DistributedDataParallel raises ValueError for a model on CPU (device_ids only work "
                         "with GPU modules)",
                         f"device_ids={self.src(ids, 30)} if torch.cuda.is_available() else None")

    def process_group(self, node: ast.Call, kw: dict, ctx: Ctx) -> None:
        self.out.pg_calls.append((node.lineno, ctx.cuda, self.src(node)))
        if ctx.cuda:
            return
        backend = kw.get("backend", node.args[0] if node.args else None)
        if backend is not None:
            self.backend(node, backend)
        if "device_id" in kw and self.cuda_valued(kw["device_id"]):
            self.add(node, "device-id", self.severity(kw["device_id"]),
                     f"{self.src(node)} binds the group to a CUDA device",
                     "ValueError: device_id cuda:N does not match the current compilation's accelerator "
                     "support: None",
                     "device_id=device if device.type == \"cuda\" else None")

    def to_ordinal(self, node: ast.Call, arg: ast.AST) -> None:
        """`.to(0)` or `.to(local_rank)`: an int means a CUDA ordinal (RuntimeError on CPU nodes)."""
        certain = self.int_valued(arg)
        leaf = dotted(arg).rsplit(".", 1)[-1].lower()
        if not certain and not (("rank" in leaf or "gpu" in leaf) and "device" not in leaf):
            return
        self.add(node, "to-ordinal", "error" if certain else "warning",
                 f"{self.src(node)} moves to a " + ("device ordinal" if certain else "name like an ordinal"),
                 "an int is a GPU index: RuntimeError: Cannot access accelerator device when none is "
                 "available",
                 ".to(device) with device = torch.device(\"cpu\") on CPU nodes")

    def int_valued(self, node: ast.AST, depth: int = 0) -> bool:
        if isinstance(node, ast.Constant):
            return type(node.value) is int
        if isinstance(node, ast.Call) and dotted(node.func) == "int":
            return True
        values = self.names.assigns.get(node.id) if isinstance(node, ast.Name) and depth < 3 else None
        return bool(values) and all(self.int_valued(v, depth + 1) for v in values)

    def cuda_valued(self, node: ast.AST, depth: int = 0) -> bool:
        """"cuda:0", f"cuda:{rank}", torch.device("cuda", rank), or a name only ever assigned those."""
        if cuda_string(node):
            return True
        if isinstance(node, ast.Call) and self.name(node.func) == "torch.device":
            return bool(node.args) and cuda_string(node.args[0])
        values = self.names.assigns.get(node.id) if isinstance(node, ast.Name) and depth < 3 else None
        return bool(values) and all(self.cuda_valued(v, depth + 1) for v in values)

    def severity(self, value: ast.AST) -> str:
        """A CUDA value read from a module-level name that a config exec() may rebind is only a warning."""
        return "warning" if isinstance(value, ast.Name) and value.id in self.names.rebindable else "error"

    def ids_on_cpu(self, ids: ast.AST) -> bool:
        """device_ids that are a list on a CPU run: not None, not chosen by a condition, and, for a name,
        every assignment of it a list (a parameter or a conditional assignment is given the benefit)."""
        if isinstance(ids, ast.Constant) and ids.value is None or isinstance(ids, ast.IfExp):
            return False
        if isinstance(ids, ast.Name):
            values = self.names.assigns.get(ids.id)
            return bool(values) and all(isinstance(v, (ast.List, ast.Tuple)) for v in values)
        return True

    def backend(self, node: ast.Call, backend: ast.AST) -> None:
        """A backend that can only name nccl, "cuda:nccl,cpu:gloo" included: the CPU wheel has no NCCL."""
        self.flag = None
        values = self.values(backend)
        if not values or any(not isinstance(v, str) or "nccl" not in v for v in values):
            return
        flag = self.flag
        overridable = (isinstance(backend, ast.Name) and self.facts.config_exec) or flag is not None
        if flag:
            note, patch_tail = f" (the default of {flag})", f" (or pass {flag}=gloo)"
        elif overridable:
            note = " (its default; the script exec()s a config that may override it)"
            patch_tail = " (or pass --backend=gloo)"
        else:
            note = patch_tail = ""
        mixed = any("gloo" in v for v in values)
        mixed = " (a per-device backend string still initialises nccl)" if mixed else ""
        self.add(node, "nccl", "warning" if overridable else "error",
                 f"{self.src(node)} asks for nccl{note}",
                 "the CPU wheel has no NCCL (RuntimeError: Distributed package doesn't have NCCL built in)"
                 + mixed,
                 'backend="nccl" if torch.cuda.is_available() else "gloo"' + patch_tail)

    def values(self, node: ast.AST, depth: int = 0) -> list | None:
        """The strings an expression can hold when every assignment of it is a constant, a flag's default or
        a local function returning constants; None: unknown."""
        if depth > 4:
            return None
        if isinstance(node, ast.Constant):
            return [node.value]
        if isinstance(node, ast.IfExp):
            a, b = self.values(node.body, depth + 1), self.values(node.orelse, depth + 1)
            return None if a is None or b is None else a + b
        if isinstance(node, ast.Attribute) and node.attr in self.facts.flag_defaults:
            self.flag, default = self.facts.flag_defaults[node.attr]  # args.dist_backend
            return [default]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
            fn = self.facts.functions.get(node.func.id)  # backend=get_backend()
            returns = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return)] if fn else []
            return self.union(returns, depth) if returns and all(r is not None for r in returns) else None
        if isinstance(node, ast.Name) and node.id in self.names.assigns:
            return self.union(self.names.assigns[node.id], depth)
        return None

    def union(self, exprs: list[ast.AST], depth: int) -> list | None:
        out: list = []
        for value in exprs:
            got = self.values(value, depth + 1)
            if got is None:
                return None
            out += got
        return out

    def get_future(self, node: ast.Call, work: ast.AST) -> None:
        is_rs = isinstance(work, ast.Call) and dotted(work.func).rsplit(".", 1)[-1] in REDUCE_SCATTERS
        if not (is_rs or (isinstance(work, ast.Name) and work.id in self.works)):
            return
        self.add(node, "get-future", "error", f"{self.src(node)} asks gloo reduce-scatter work for a future",
                 "gloo raises RuntimeError: Work::getFuture not implemented (all_reduce's future works)",
                 "keep the Work and call work.wait() instead of .get_future().wait()")


def scan_unit(path: str, source: str, stmts: list[ast.stmt], facts: ModuleFacts, names: Names,
              skip_defs: bool) -> UnitScan:
    """Findings in one body: a module's top level (skip_defs: without its functions) or one function."""
    scanner = UnitScanner(path, source, facts, names, skip_defs)
    scanner.body(stmts, Ctx())
    return scanner.out
