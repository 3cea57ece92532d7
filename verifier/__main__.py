"""``python -m verifier FILE.duckdb --trust TRUST.json``: same as ``gridledger verify``."""

import sys

from verifier.cli import main

sys.exit(main())
