"""``python -m hf_fedflat.cli <command>`` and ``accelerate launch -m hf_fedflat.cli train ...``."""

import sys

from .commands import main

sys.exit(main())
