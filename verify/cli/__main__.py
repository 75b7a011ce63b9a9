import sys

from kvpocket.verify.cli import main  # imports the CLI itself: a Ctrl-C while it loads is one line

sys.exit(main())
