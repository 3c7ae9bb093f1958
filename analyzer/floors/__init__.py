"""Rerun and prompt-perturbation floors for repeated, matched runs (the tool-calling audit).

Input per endpoint: a 0/1 matrix of instances x runs for the main arm (reruns at fixed settings)
and, for the perturbation arm, one such matrix per named prompt variant, all on the same matched
instances. One module per statistic (rerun, dependence, perturbation, curve, fingerprints,
taxonomy and any that registers beside them): pure functions, arrays in, frozen dataclasses out.
Every number gets an interval: an instance bootstrap centred on its estimate (one set of instance draws for an endpoint's main arm
and variants together), or exact Clopper-Pearson for counts.

Each statistic that belongs in the floors report registers itself (`registry.register`); this
package imports all its modules, so a new statistic module is found without touching this file.
"""

from __future__ import annotations

import importlib
import pkgutil

from noisefloor.analyzer.floors.curve import CURVE_RESAMPLES, CurvePoint, curve_sizes, sd_curve
from noisefloor.analyzer.floors.dependence import PERMUTATIONS, Dependence, dependence
from noisefloor.analyzer.floors.fingerprints import FingerprintSplit, fingerprint_split
from noisefloor.analyzer.floors.perturbation import PairKey, PerturbationFloor, PerturbationPair, perturbation_floor
from noisefloor.analyzer.floors.registry import Arms, FloorSettings, Line, Statistic, register, registered
from noisefloor.analyzer.floors.rerun import RerunFloor, rerun_floor, rerun_paired_sd
from noisefloor.analyzer.floors.taxonomy import TAXONOMY_CLASSES, Taxonomy, taxonomy

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "CURVE_RESAMPLES", "PERMUTATIONS", "TAXONOMY_CLASSES", "Arms", "CurvePoint", "Dependence", "FingerprintSplit",
    "FloorSettings", "Line", "PairKey", "PerturbationFloor", "PerturbationPair", "RerunFloor", "Statistic", "Taxonomy",
    "curve_sizes", "dependence", "fingerprint_split", "perturbation_floor", "register", "registered",
    "rerun_floor", "rerun_paired_sd", "sd_curve", "taxonomy",
]
