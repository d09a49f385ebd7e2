import sys

from wtc.cli import main

sys.exit(main())
