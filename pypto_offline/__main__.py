import sys

from pypto_offline.entry import main

sys.exit(main())
