"""``python -m helpers.performance [--write | --check]``: see :mod:`helpers.performance`."""

import sys

from . import main

sys.exit(main())
