"""`python -m stalwart_operator` runs the operator."""

import sys

from stalwart_operator.main import main

sys.exit(main())
