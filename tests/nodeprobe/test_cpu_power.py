"""nodeprobe/cpu_power.py and preflight's cpu_power check: a CPU held to a low clock or thermally throttled is
warned with the command that fixes it; a node whose sysfs exposes neither gets n/a, never a warning.

The sysfs trees here are folders laid out as Linux lays out /sys/devices/system/cpu (this machine, a VM,
exposes no cpufreq); tests/preflight/test_preflight_simlan.py reads a bind-mounted one on a simulated host.
"""

from __future__ import annotations

from types import SimpleNamespace

from ddplab.preflight import checks_node
from ddplab.preflight.judge import NA, OK
from nodeprobe import cpu_power


def sysfs(tmp_path, cpus: dict[str, dict[str, str]]):
    """{cpu: {relative file: text}} -> a /sys/devices/system/cpu-like folder (plus the files Linux has)."""
    root = tmp_path / "cpu"
    (root / "cpufreq").mkdir(parents=True)  # the policy folder, not a CPU
    (root / "online").write_text("0-1\n")
    for cpu, files in cpus.items():
        (root / cpu / "topology").mkdir(parents=True)
        for rel, text in files.items():
            (root / cpu / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / cpu / rel).write_text(text + "\n")
    return root


class FakeJudge:
    """The two calls the check makes on a Judge: the node's fingerprint, and the cell it sets."""

    def __init__(self, power: dict):
        self.fp, self.cell = {"cpu": {"power": power}}, None

    def need(self, host, check, name):
        return self.fp

    def set(self, host, check, status, detail="", fix="", note=""):
        self.cell = SimpleNamespace(status=status, detail=detail, fix=fix, note=note)


def judged(root) -> SimpleNamespace:
    j = FakeJudge(cpu_power.probe(root))
    checks_node.cpu_power(j, "node1")
    return j.cell


def test_powersave_governor_is_warned_with_the_command_that_fixes_it(tmp_path):
    cell = judged(sysfs(tmp_path, {"cpu0": {"cpufreq/scaling_governor": "powersave",
                                            "cpufreq/scaling_driver": "acpi-cpufreq"},
                                   "cpu1": {"cpufreq/scaling_governor": "performance"}}))
    assert (cell.status, cell.note) == (OK, "warning")
    assert "cpu0 held to a low clock (governor powersave (acpi-cpufreq))" in cell.detail
    assert "sudo cpupower frequency-set -g performance on node1" in cell.detail and "cpu1" not in cell.detail


def test_thermal_throttle_counts_are_warned(tmp_path):
    cell = judged(sysfs(tmp_path, {"cpu0": {"cpufreq/scaling_governor": "performance",
                                            "thermal_throttle/core_throttle_count": "12",
                                            "thermal_throttle/package_throttle_count": "3"}}))
    assert cell.note == "warning" and "cpu0 thermally throttled (15 events since boot)" in cell.detail


def test_healthy_and_unexposed_nodes_say_nothing(tmp_path):
    performance = judged(sysfs(tmp_path / "a", {"cpu0": {"cpufreq/scaling_governor": "performance",
                                                         "thermal_throttle/core_throttle_count": "0"}}))
    assert (performance.status, performance.note) == (OK, "")
    # intel_pstate's powersave is dynamic: only a power-leaning preference keeps the clock low
    pstate = {"cpufreq/scaling_governor": "powersave", "cpufreq/scaling_driver": "intel_pstate",
              "cpufreq/energy_performance_preference": "balance_performance"}
    assert judged(sysfs(tmp_path / "b", {"cpu0": pstate})).note == ""
    power = {**pstate, "cpufreq/energy_performance_preference": "power"}
    slow = judged(sysfs(tmp_path / "c", {"cpu0": power}))
    assert slow.note == "warning" and "energy_performance_preference power" in slow.detail
    vm = judged(sysfs(tmp_path / "d", {"cpu0": {}, "cpu1": {}}))  # a VM: no cpufreq, no thermal_throttle
    assert vm.status == NA and not vm.note
