"""Quality: the kit must find bugs. Seeded mutants (`seeded`), the bug zoo of hazards it
was not built around (`zoo`), and the mutation-testing probe (`mutation_probe`)."""

from kvpocket.verify.quality.seeded import MUTANTS, Mutant, MutantResult, run_mutant
from kvpocket.verify.quality.zoo import ZOO, ZooBug, run_zoo_bug

__all__ = ["MUTANTS", "ZOO", "Mutant", "MutantResult", "ZooBug", "run_mutant", "run_zoo_bug"]
