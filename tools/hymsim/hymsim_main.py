"""hymsim: trace-driven TTFT-per-turn model (see docs/paper.md)."""

import sys

from hymsim import cli

if __name__ == "__main__":
    sys.exit(cli.main())
