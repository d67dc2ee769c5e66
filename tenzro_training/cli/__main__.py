"""``python -m tenzro_training.cli``: the ``tenzro`` command, through the same entry point as the
installed script (tenzro_training.console: the installation check, Ctrl-C during imports)."""

import sys

from tenzro_training.console import main

sys.exit(main())
