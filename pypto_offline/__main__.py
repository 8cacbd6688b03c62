import sys

from pypto_offline.cli import main

sys.exit(main())
