"""`python -m mindfoundry.cli ...` (what the supervisor and the tests start): the same as the `mindfoundry` script."""

import sys

from mindfoundry.cli.entry import main

sys.exit(main())
