"""``python -m edgeinfer`` runs the CLI."""

import sys

from edgeinfer.cli import main

sys.exit(main())
