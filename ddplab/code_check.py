"""`python -m ddplab code-check --code-dir DIR --entrypoint E`: CPU check of the user's code, before launch.

A static scan (Python `ast`; nothing is imported or run) of the entry point (`train.py` or
`-m pkg.mod`) and of the modules it imports from the code folder (`import x.y`, `from x import y`,
`from . import y`, followed transitively). The patterns are in ddplab/cpu_patterns.py. A finding is an
*error* when it certainly fails or makes the run not a DDP run, in code reached from the entry point (module
top levels, and the functions and classes they name, transitively); the same pattern in code not seen
reached is a *warning*, as are the patterns that only may misbehave.
Output: one line per finding (`ddplab: error: train.py:112: ...; why; patch: ...`), errors first, then a
summary line. Exit 0: no error (warnings allowed); 1: errors (playbooks/prepare.yml refuses the launch);
2: bad input. With --smoke-decides (ddplab_smoke_run) errors exit 0 too: the smoke run of the code before
the ranks start (ddplab/smoke_verdict.py) decides, with these findings as its hints.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddplab.cpu_guards import Names, dotted
from ddplab.cpu_patterns import CUDA_USE_KINDS, Finding, ModuleFacts, scan_unit
from ddplab.errors import DdplabError

FuncNode = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass
class Module:
    name: str
    rel: str
    source: str
    tree: ast.Module
    package: str
    # local name -> ("def", node) | ("module", name) | ("from", module, attribute)
    symbols: dict = field(default_factory=dict)


class Program:
    """The entry module and every module of the code folder it imports, parsed."""

    def __init__(self, code_dir: Path, roots: list[Path]):
        self.code_dir, self.roots = code_dir.resolve(), [r.resolve() for r in roots]
        self.entry = ""  # the module Python runs as __main__
        self.modules: dict[str, Module] = {}
        self.broken: list[Finding] = []
        self.queue: list[tuple[str, Path]] = []

    def find(self, name: str) -> Path | None:
        rel = Path(*name.split("."))
        for root in self.roots:
            for cand in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
                if cand.is_file() and cand.resolve().is_relative_to(self.code_dir):
                    return cand
        return None

    def want(self, name: str) -> bool:
        """Queue a module of the code folder (and its parent packages, run on import); True if it is one."""
        parts = name.split(".") if name else []
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            path = self.find(sub)
            if path is not None and sub not in self.modules and all(q != sub for q, _ in self.queue):
                self.queue.append((sub, path))
        return bool(name) and self.find(name) is not None

    def load_all(self, entry_name: str, entry_path: Path) -> None:
        self.entry = entry_name
        self.queue.append((entry_name, entry_path))
        while self.queue:
            name, path = self.queue.pop(0)
            if name not in self.modules:
                self.load(name, path)

    def load(self, name: str, path: Path) -> None:
        rel = str(path.resolve().relative_to(self.code_dir))
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source, filename=rel)
        except SyntaxError as e:
            self.broken.append(Finding(rel, e.lineno or 1, "syntax", "error",
                                       f"Python cannot parse it ({e.msg})", "every rank fails on import",
                                       "fix the syntax"))
            return
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        if name == "__main__":
            package = ""
        if name != self.entry:
            tree.body = without_main_block(tree.body)
        mod = Module(name, rel, source, tree, package)
        self.modules[name] = mod
        for node in tree.body:
            for sub in ([node] if not isinstance(node, (ast.If, ast.Try)) else ast.walk(node)):
                if isinstance(sub, (*FuncNode, ast.ClassDef)):
                    mod.symbols[sub.name] = ("def", sub)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.want(alias.name)
                    local = alias.asname or alias.name.split(".")[0]
                    mod.symbols.setdefault(local, ("module", alias.name if alias.asname else local))
            elif isinstance(node, ast.ImportFrom):
                base = self.absolute(mod, node)
                if base is None:
                    continue
                self.want(base)
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    full = f"{base}.{alias.name}" if base else alias.name
                    is_module = self.want(full)
                    mod.symbols.setdefault(alias.asname or alias.name,
                                           ("module", full) if is_module else ("from", base, alias.name))

    @staticmethod
    def absolute(mod: Module, node: ast.ImportFrom) -> str | None:
        if not node.level:
            return node.module or ""
        parts = mod.package.split(".") if mod.package else []
        if node.level - 1 > len(parts) or (not parts and node.level):
            return None  # a relative import above the code folder: Python refuses it too
        base = parts[: len(parts) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def resolve(self, mod: Module, parts: list[str], depth: int = 0):
        """The function or class a dotted name of `mod` stands for, when it is defined in the code folder."""
        sym = mod.symbols.get(parts[0]) if parts and depth < 8 else None
        if sym is None:
            return None
        if sym[0] == "def":
            return sym[1] if len(parts) == 1 else None
        if sym[0] == "module":
            return self.resolve_in(sym[1], parts[1:], depth + 1)
        return self.resolve_in(sym[1], [sym[2], *parts[1:]], depth + 1)

    def resolve_in(self, modname: str, parts: list[str], depth: int):
        if not parts:
            return None
        sub = f"{modname}.{parts[0]}" if modname else parts[0]
        if sub in self.modules:
            return self.resolve_in(sub, parts[1:], depth + 1)
        mod = self.modules.get(modname)
        return self.resolve(mod, parts, depth + 1) if mod else None


def is_main_test(test: ast.AST) -> bool:
    """`__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    return {dotted(s) or getattr(s, "value", None) for s in (test.left, test.comparators[0])} == \
        {"__name__", "__main__"}


def without_main_block(body: list[ast.stmt]) -> list[ast.stmt]:
    """An imported module's top level: its `if __name__ == "__main__":` block never runs (its else does)."""
    out = []
    for stmt in body:
        if isinstance(stmt, ast.If) and is_main_test(stmt.test):
            out += stmt.orelse
        else:
            out.append(stmt)
    return out


def units_of(mod: Module) -> list[tuple[ast.AST, ast.ClassDef | None]]:
    """Every function not nested in another function, with its class (methods) or None."""
    out = []

    def walk(node, cls):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, FuncNode):
                out.append((child, cls))
            elif isinstance(child, ast.ClassDef):
                walk(child, child)
            elif not isinstance(child, ast.expr):
                walk(child, cls)
    walk(mod.tree, None)
    return out


def assignments(body: ast.AST, skip_defs: bool, params=()) -> dict:
    out: dict = {p: [ast.Name("<parameter>")] for p in params}
    for name, value in _assigns(body, skip_defs):
        out.setdefault(name, []).append(value)
    return out


def _assigns(node, skip_defs):
    for child in ast.iter_child_nodes(node):
        if skip_defs and isinstance(child, FuncNode):
            continue
        if isinstance(child, ast.Assign):
            for t in child.targets:
                if isinstance(t, ast.Name):
                    yield t.id, child.value
        elif isinstance(child, (ast.AugAssign, ast.AnnAssign)) and isinstance(child.target, ast.Name):
            known = isinstance(child, ast.AnnAssign) and child.value
            yield child.target.id, child.value if known else ast.Name("?")
        yield from _assigns(child, skip_defs)


def check(code_dir: str, entrypoint: str) -> dict:
    """Findings of the program started by `entrypoint` in `code_dir` (see the module docstring)."""
    root = Path(code_dir).expanduser()
    if not root.is_dir():
        raise DdplabError(f"ddplab_code_dir {code_dir}: not a folder on the control host; "
                          "set it to the checkout of your training code")
    entry = entrypoint.strip()
    if entry.startswith("-m"):
        name = entry[2:].strip()
        prog = Program(root, [root])
        path = prog.find(name)
        if path is not None and path.name == "__init__.py" and (path.parent / "__main__.py").is_file():
            prog.want(name)  # `-m pkg` imports pkg, then runs pkg/__main__.py
            name, path = f"{name}.__main__", path.parent / "__main__.py"
        if path is None:
            return {"entry": entry, "files": [], "findings": [],
                    "note": f"module {name} is not in the code folder"}
        prog.load_all(name, path)
    else:
        path = root / entry
        if not path.is_file():
            raise DdplabError(f"ddplab_entrypoint {entry}: no such file in ddplab_code_dir {code_dir}; "
                              "give a script path relative to that folder or -m package.module")
        prog = Program(root, [path.parent, root])
        prog.load_all("__main__", path)
    findings = judge(prog)
    return {"entry": entry, "files": sorted(m.rel for m in prog.modules.values()), "findings": findings}


def torch_aliases(tree: ast.Module) -> dict[str, str]:
    """How a module spells torch's names: `import torch as th`, `from torch import cuda`,
    `tc = torch.cuda`."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch" and a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and not node.level and \
                (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    spelled = Names(aliases=dict(out))
    for node in tree.body:
        value = spelled.canon(dotted(node.value)) if isinstance(node, ast.Assign) else ""
        if value.startswith("torch.cuda"):
            out.update({t.id: value for t in node.targets if isinstance(t, ast.Name)})
    return out


def flag_defaults(prog: Program) -> dict[str, tuple[str, object]]:
    """argparse options with a constant default, by dest: {"dist_backend": ("--dist-backend", "nccl")}."""
    out = {}
    for mod in prog.modules.values():
        for node in ast.walk(mod.tree):
            if not (isinstance(node, ast.Call) and dotted(node.func).endswith("add_argument")):
                continue
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            long = next((o for o in opts if o.startswith("--")), opts[0] if opts else "")
            dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else \
                long.lstrip("-").replace("-", "_")
            if dest and isinstance(kw.get("default"), ast.Constant):
                out[dest] = (long, kw["default"].value)
    return out


def module_facts(prog: Program, mod: Module, ddp_names: set[str], flags: dict) -> tuple[ModuleFacts, Names]:
    config_exec = any(isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                      and dotted(n.value.func) == "exec" for n in mod.tree.body)
    functions = {name: fn for name in mod.symbols if isinstance(fn := prog.resolve(mod, [name]), FuncNode)}
    assigns = assignments(mod.tree, skip_defs=True)
    rebound = {name for n in ast.walk(mod.tree) if isinstance(n, ast.Global) for name in n.names}
    names = Names(assigns, torch_aliases(mod.tree), set(assigns) if config_exec else rebound)
    return ModuleFacts(ddp_names, config_exec, functions, flags), names


def reach(units: dict, scans: dict, prog: Program) -> tuple[set, set]:
    """Units reached from the module top levels, and those reached only through CUDA-guarded code."""
    def walk(starts, through_cuda):
        seen, todo = set(), list(starts)
        while todo:
            key = todo.pop()
            if key in seen:
                continue
            seen.add(key)
            mod = units[key][0]
            for parts, on_cuda in scans[key].refs:
                if on_cuda and not through_cuda:
                    continue
                target = prog.resolve(mod, parts)
                if isinstance(target, FuncNode) and id(target) in units:
                    todo.append(id(target))
                elif isinstance(target, ast.ClassDef):
                    todo.extend(id(m) for m in methods.get(id(target), []))
        return seen
    methods: dict[int, list] = {}
    for _mod, node, cls, _top in units.values():
        if cls is not None:
            methods.setdefault(id(cls), []).append(node)
    reached = walk([id(m.tree) for m in prog.modules.values()], through_cuda=False)
    return reached, walk(reached, through_cuda=True) - reached


def judge(prog: Program) -> list[Finding]:
    ddp_names = {"DistributedDataParallel"} | {
        a.asname for m in prog.modules.values() for n in ast.walk(m.tree) if isinstance(n, ast.ImportFrom)
        for a in n.names if a.name == "DistributedDataParallel" and a.asname}
    flags = flag_defaults(prog)
    units = {}  # id(node) -> (module, node, class, is module top level)
    for mod in prog.modules.values():
        units[id(mod.tree)] = (mod, mod.tree, None, True)
        for fn, cls in units_of(mod):
            units[id(fn)] = (mod, fn, cls, False)
    facts = {id(m): module_facts(prog, m, ddp_names, flags) for m in prog.modules.values()}
    scans = {}
    for key, (mod, node, _cls, top) in units.items():
        mod_facts, names = facts[id(mod)]
        if top:
            stmts = mod.tree.body
        else:
            params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            stmts = node.body
            names = Names({**names.assigns, **assignments(node, False, params)}, names.aliases,
                          names.rebindable)
        scans[key] = scan_unit(mod.rel, mod.source, stmts, mod_facts, names, skip_defs=top)
    reached, cuda_only = reach(units, scans, prog)
    findings = list(prog.broken)
    pg_calls, ddp_calls = [], []
    for key, scan in scans.items():
        rel = units[key][0].rel
        for f in scan.findings:
            if key in cuda_only and f.kind in CUDA_USE_KINDS:
                continue  # a function called only where the device is CUDA: guarded
            f.reached = key in reached
            findings.append(f)
        pg_calls += [(rel, line, guarded or key in cuda_only, src, key in reached)
                     for line, guarded, src in scan.pg_calls]
        ddp_calls += [(rel, line, guarded or key in cuda_only, src, key in reached)
                      for line, guarded, src in scan.ddp_calls]
    if not any(f.kind == "cuda-required" and f.reached for f in findings):  # else: that is the cause
        findings += only_on_cuda(pg_calls, ddp_calls)
    for f in findings:
        if f.severity == "error" and not f.reached:
            f.severity, f.why = "warning", f.why + " (in code not seen called from the entry point)"
    unique = {(f.path, f.line, f.kind): f for f in findings}
    return sorted(unique.values(), key=lambda f: (f.severity != "error", f.path, f.line, f.kind))


def only_on_cuda(pg_calls: list, ddp_calls: list) -> list[Finding]:
    """The process group, or the DDP wrap, made only on the CUDA branch: on CPU nodes each rank trains
    alone."""
    if pg_calls and all(guarded for _r, _l, guarded, _s, _x in pg_calls):
        rel, line, _g, src, was_reached = pg_calls[0]
        return [Finding(
            rel, line, "pg-only-on-cuda", "error", f"the only process group ({src}) is created on CUDA alone",
            "on CPU nodes no group is made: each rank trains alone, or fails at its first collective",
            'create it whenever DDP is requested: init_process_group(backend="nccl" if device_type == "cuda" '
            'else "gloo"), with torch.cuda.set_device only on CUDA', was_reached)]
    if pg_calls and ddp_calls and all(guarded for _r, _l, guarded, _s, _x in ddp_calls):
        rel, line, _g, src, was_reached = ddp_calls[0]
        return [Finding(
            rel, line, "ddp-only-on-cuda", "error", f"the model is wrapped ({src}) on CUDA alone",
            "on CPU nodes the group is made but gradients are never averaged: each rank trains alone",
            "wrap it whenever DDP is requested: "
            "DDP(model, device_ids=[local_rank] if device.type == \"cuda\" else None)", was_reached)]
    return []


def report_lines(result: dict, smoke_decides: bool = False) -> list[str]:
    found = result["findings"]
    errors = sum(f.severity == "error" for f in found)
    lines = [f.text() for f in found]
    summary = (f"ddplab: code check of {result['entry']} ({len(result['files'])} files: "
               f"{', '.join(result['files']) or result.get('note', '')}): "
               f"{errors} errors, {len(found) - errors} warnings")
    lines.append(summary)
    if errors and smoke_decides:
        lines.append("ddplab: the smoke run of your code before the ranks start decides whether these errors "
                     "are real (ddplab_smoke_run)")
    elif errors:
        lines.append("ddplab: the launch is refused before any rank starts: patch the lines above, "
                     "or set ddplab_code_check: false to launch anyway")
    return lines


def cmd_code_check(args) -> int:
    result = check(args.code_dir, args.entrypoint)
    if args.json:
        json.dump({**result, "findings": [asdict(f) for f in result["findings"]]}, sys.stdout)
        print()
    else:
        print("\n".join(report_lines(result, args.smoke_decides)))
    return 1 if not args.smoke_decides and any(f.severity == "error" for f in result["findings"]) else 0


def add_parser(sub):
    p = sub.add_parser("code-check", help="static CPU/gloo check of the user's code (no import, no run)")
    p.add_argument("--code-dir", required=True, help="ddplab_code_dir: the checkout of the training code")
    p.add_argument("--entrypoint", required=True,
                   help='ddplab_entrypoint: "train.py" or "-m pkg.mod" (write --entrypoint="-m pkg.mod")')
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--smoke-decides", action="store_true",
                   help="exit 0 with errors too: the smoke run before the launch decides (ddplab_smoke_run)")
    p.set_defaults(func=cmd_code_check)
