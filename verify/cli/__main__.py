import sys

from kvpocket.verify.cli.commands import main

sys.exit(main())
