import sys

from accrewrite.cli import main

sys.exit(main())
