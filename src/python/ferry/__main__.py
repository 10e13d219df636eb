# SPDX-License-Identifier: Apache-2.0
"""``python -m ferry capture ...``: the ``ferry`` command (ferry.cli)."""

import sys

from .cli import main

sys.exit(main())
