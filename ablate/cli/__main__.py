"""`python -m ablate.cli`: the same as the `ablate` command."""

import sys

from ablate.cli import main

sys.exit(main())
