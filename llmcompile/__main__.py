import sys

from llmcompile.cli import main

sys.exit(main())
