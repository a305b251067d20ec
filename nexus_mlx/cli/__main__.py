"""``python -m nexus_mlx.cli``: the ``nexus-mlx`` command."""

import sys

from nexus_mlx.cli.main import main

sys.exit(main())
