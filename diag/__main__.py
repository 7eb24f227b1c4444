import sys

from diag.cli import main

sys.exit(main())
