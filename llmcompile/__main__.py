import sys

from llmcompile.entry import main

sys.exit(main())
