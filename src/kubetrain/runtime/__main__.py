"""`python -m kubetrain.runtime run -- CMD`: the runtime's commands, without the console script."""

from __future__ import annotations

import sys

from kubetrain.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
