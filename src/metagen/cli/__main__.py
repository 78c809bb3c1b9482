"""`python -m metagen.cli ...`, the same as the `metagen` command."""

import sys

from metagen.cli import main

sys.exit(main())
