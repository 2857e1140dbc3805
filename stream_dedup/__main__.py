import sys

from stream_dedup.cli.main import main

sys.exit(main())
