"""The campaign profiles are registered with Hypothesis before its pytest plugin reads
`--hypothesis-profile`: `pytest --hypothesis-profile kvpocket-ci` runs the suite under
the `ci` campaign profile (verify/conformance/profiles.py)."""

import kvpocket.verify.conformance.profiles  # noqa: F401  (registers the profiles)
