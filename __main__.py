"""`python -m kvpocket` is the `kvpocket` command (installed, or from a clone through
`.devpath`, whose `kvpocket/__main__.py` links here)."""

import sys

from kvpocket.verify.cli.commands import main

sys.exit(main())
