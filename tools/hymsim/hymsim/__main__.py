"""`python3 -m hymsim ...` (from tools/hymsim): the same as hymsim_main.py."""

import sys

from hymsim import cli

sys.exit(cli.main())
