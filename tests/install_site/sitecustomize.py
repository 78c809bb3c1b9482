"""Imported at the start of a child Python by tests/install_simulation.py: the modules named in
METAGEN_TEST_BLOCKED_MODULES cannot be imported, as on an install without the extras that bring them."""

import os
import sys

for _name in filter(None, os.environ.get("METAGEN_TEST_BLOCKED_MODULES", "").split(",")):
    sys.modules[_name] = None
