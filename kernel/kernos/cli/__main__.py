"""``python -m kernos.cli``: the same as the ``kernos`` script."""

import sys

from kernos.cli import main

sys.exit(main())
