"""A test worker that plays one failure class: it prints the class's sample line and exits with its code.

The class for each rank comes from SIGNATURE_PLAN (JSON: rank -> [line, exit code]).
"""

import json
import os
import sys

plan = json.loads(os.environ["SIGNATURE_PLAN"])
line, code = plan[os.environ["RANK"]]
print("starting up", flush=True)
print(line, file=sys.stderr, flush=True)
sys.exit(code)
