"""Conformance: the implementation driven against the executable model, step by step.

`Lockstep` runs one API call on both and compares outcomes, choices, abstract states and
invariants; `adapter` maps model actions to implementation calls; `stateful` holds the
Hypothesis rules; `fuzz` and `matrix` run campaigns; `replay` and `shrink` replay and
minimise a failing trace.
"""

from kvpocket.verify.conformance.adapter import Harness, call_impl
from kvpocket.verify.conformance.fuzz import CampaignReport, CampaignSpec, run_campaign
from kvpocket.verify.conformance.lockstep import RARE_STATES, Divergence, Lockstep
from kvpocket.verify.conformance.matrix import DEFAULT_MATRIX, MatrixReport, run_matrix
from kvpocket.verify.conformance.replay import ReplayResult
from kvpocket.verify.conformance.shrink import minimize
from kvpocket.verify.conformance.stateful import LockstepMachine, machine_for

__all__ = [
    "DEFAULT_MATRIX", "RARE_STATES", "CampaignReport", "CampaignSpec", "Divergence", "Harness",
    "Lockstep", "LockstepMachine", "MatrixReport", "ReplayResult", "call_impl",
    "machine_for", "minimize", "run_campaign", "run_matrix",
]
