"""`python3 -m kvengine ...` and the //python/kvengine:kv_engine binary."""

import sys

from kvengine.cli import main

if __name__ == "__main__":
    sys.exit(main())
