import sys

from gridledger.cli import main

sys.exit(main())
