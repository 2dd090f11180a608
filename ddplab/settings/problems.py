"""One problem with a setting or a file, printed as one line:
`ddplab: error: <setting or file> (<host or all>): <found>; <allowed>; <fix>`."""

from __future__ import annotations

from dataclasses import dataclass, field

CONTROL = "control host"


@dataclass
class Problem:
    subject: str  # a setting name, a file, or "inventory"
    found: str
    allowed: str
    fix: str
    hosts: list[str] = field(default_factory=list)  # [] = the whole run (all)
    level: str = "error"  # or "warning"

    def line(self, all_hosts: list[str] | None = None) -> str:
        scope = "all" if not self.hosts or (all_hosts and sorted(self.hosts) == sorted(all_hosts)) \
            else ", ".join(self.hosts)
        return f"ddplab: {self.level}: {self.subject} ({scope}): {self.found}; {self.allowed}; {self.fix}"


def merge(problems: list[Problem]) -> list[Problem]:
    """One problem per distinct message: the same finding on several hosts becomes one line naming them."""
    out: dict[tuple, Problem] = {}
    for p in problems:
        key = (p.level, p.subject, p.found, p.allowed, p.fix)
        if key in out:
            if out[key].hosts and p.hosts:
                out[key].hosts += [h for h in p.hosts if h not in out[key].hosts]
            else:
                out[key].hosts = []
        else:
            out[key] = Problem(p.subject, p.found, p.allowed, p.fix, list(p.hosts), p.level)
    return list(out.values())
