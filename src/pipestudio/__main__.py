"""``python -m pipestudio`` runs the command line."""

import sys

from pipestudio.cli import main

sys.exit(main())
