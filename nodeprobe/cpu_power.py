"""What this node's CPU power management says about sustained work: its cpufreq governors (and, under an
active pstate driver, the energy/performance preference) and its thermal throttle counts, where Linux
exposes them in sysfs.

A laptop on ``powersave`` (acpi-cpufreq: the lowest frequency) or one that throttles when hot computes
slower than its twin, and in DDP every rank waits for the slowest (note 000: "a thermally-throttled rank
becomes a straggler against its identical twin"). Facts only; ddplab/preflight/checks_node.py judges.
A machine whose sysfs has neither (a VM, a container) gives ``{"exposed": false}``: nothing to say.
"""

from __future__ import annotations

from pathlib import Path

CPU_DIR = Path("/sys/devices/system/cpu")
# Governors that keep the clock low under sustained load (acpi-cpufreq's powersave pins the lowest frequency).
SLOW_GOVERNORS = ("powersave", "conservative")
# Drivers whose "powersave" is a dynamic policy (the hardware picks the clock from the energy/performance
# preference): for them the preference, not the governor's name, says whether the clock stays low.
ACTIVE_PSTATE = ("intel_pstate", "amd-pstate-epp")
SLOW_PREFERENCES = ("power", "balance_power")
THROTTLE_COUNTS = ("core_throttle_count", "package_throttle_count")
# The one command that sets every CPU's governor to performance (package linux-cpupower on Debian).
GOVERNOR_FIX = "sudo cpupower frequency-set -g performance"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpus(root: Path) -> list[Path]:
    return sorted((p for p in root.glob("cpu[0-9]*") if p.name[3:].isdigit()), key=lambda p: int(p.name[3:]))


def probe(root: Path = CPU_DIR) -> dict:
    """{"exposed", "governors": {cpu: governor}, "drivers", "preferences", "throttle": {cpu: {count: n}}}."""
    governors, drivers, preferences, throttle = {}, {}, {}, {}
    for cpu in _cpus(root):
        freq = cpu / "cpufreq"
        for table, name in ((governors, "scaling_governor"), (drivers, "scaling_driver"),
                            (preferences, "energy_performance_preference")):
            value = _read(freq / name)
            if value:
                table[cpu.name] = value
        counts = {c: int(v) for c in THROTTLE_COUNTS
                  if (v := _read(cpu / "thermal_throttle" / c)) and v.isdigit()}
        if counts:
            throttle[cpu.name] = counts
    return {"exposed": bool(governors or throttle), "governors": governors, "drivers": drivers,
            "preferences": preferences, "throttle": throttle}


def slow_cpus(facts: dict) -> dict[str, str]:
    """{cpu: why} for every CPU whose governor (or preference) keeps its clock low under sustained load."""
    out = {}
    for cpu, governor in (facts.get("governors") or {}).items():
        driver = (facts.get("drivers") or {}).get(cpu)
        preference = (facts.get("preferences") or {}).get(cpu)
        if driver in ACTIVE_PSTATE and governor == "powersave":
            if preference in SLOW_PREFERENCES:
                out[cpu] = f"{driver} powersave, energy_performance_preference {preference}"
        elif governor in SLOW_GOVERNORS:
            out[cpu] = f"governor {governor}" + (f" ({driver})" if driver else "")
    return out


def throttled_cpus(facts: dict) -> dict[str, int]:
    """{cpu: throttle events since boot} for every CPU that was thermally throttled."""
    return {cpu: sum(counts.values()) for cpu, counts in (facts.get("throttle") or {}).items()
            if sum(counts.values()) > 0}
