"""The machine families cloudprof prices, their CPU architecture, and their naming.

One table for the refresh fetchers, the SkyPilot import, the shipped offline
estimates and the providers' image choice, so that a family added here is
covered everywhere (and an arm64 family boots an arm64 image everywhere).
"""

from __future__ import annotations

import re

X86 = "x86_64"
ARM = "arm64"
ARCHES = (X86, ARM)

# GCP families -> architecture. t2a (Ampere Altra) and c4a (Axion) are arm64.
GCP_FAMILIES: dict[str, str] = {
    "e2": X86, "n1": X86, "n2": X86, "n2d": X86, "n4": X86, "c2": X86, "c2d": X86,
    "c3": X86, "c3d": X86, "c4": X86, "t2d": X86, "t2a": ARM, "c4a": ARM,
    "m1": X86, "m2": X86, "m3": X86,
}  # fmt: skip

# AWS families: c/m/r of these generations; the "g" ones are Graviton (arm64).
AWS_GENERATIONS = ("6i", "6a", "7i", "7a", "7g", "8g")
AWS_FAMILIES: dict[str, str] = {
    f"{kind}{gen}": (ARM if gen.endswith("g") else X86)
    for kind in ("c", "m", "r") for gen in AWS_GENERATIONS
}  # fmt: skip

FAMILIES: dict[str, dict[str, str]] = {"gcp": GCP_FAMILIES, "aws": AWS_FAMILIES}

_AWS_GRAVITON_RE = re.compile(r"[a-z]+\d+g[a-z]*")
_GCP_ARM = ("t2a", "c4a", "n4a")


def family_of(provider: str, machine: str) -> str:
    """``n2-highcpu-80`` -> ``n2``; ``c7g.2xlarge`` -> ``c7g``."""
    return machine.split(".", 1)[0] if provider == "aws" else machine.split("-", 1)[0]


def arch_of(provider: str, machine: str) -> str:
    """The CPU architecture of a machine type, from its family.

    Known families come from the tables above; unknown ones follow each cloud's
    naming (a Graviton family has a ``g`` after its generation digit; GCP's Arm
    series are t2a, c4a, n4a), so an imported row of a new family still boots
    the right image.
    """
    family = family_of(provider, machine)
    known = FAMILIES.get(provider, {}).get(family)
    if known:
        return known
    if provider == "aws":
        return ARM if _AWS_GRAVITON_RE.fullmatch(family) else X86
    if provider == "gcp":
        return ARM if family in _GCP_ARM else X86
    return X86


def covered(provider: str, machine: str) -> bool:
    """Whether ``machine`` belongs to a family the refresh and the shipped catalog cover."""
    return family_of(provider, machine) in FAMILIES.get(provider, {})
