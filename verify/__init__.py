"""kvpocket's verifiers: presets, the CLI, Z3 proofs and bounded model checking,
lockstep conformance testing, fuzz and seeded-bug campaigns, benchmarks."""
