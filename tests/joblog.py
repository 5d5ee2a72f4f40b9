"""`TOOLKIT_TEST_JOBLOG=FILE make test`: every process the tests start, one JSON line each (the test, the
command, the seconds until it was waited for), to find the jobs two tests both run (tests/README.md)."""
from __future__ import annotations

import json
import os
import subprocess
import time


def install(path: str) -> None:
    init, wait = subprocess.Popen.__init__, subprocess.Popen._wait

    def started(self, args, *a, **kw):
        self._joblog = (time.monotonic(), [str(x) for x in (args if isinstance(args, (list, tuple)) else [args])])
        init(self, args, *a, **kw)

    def waited(self, *a, **kw):
        code = wait(self, *a, **kw)
        if getattr(self, "_joblog", None):
            start, argv = self._joblog
            self._joblog = None
            with open(path, "a") as f:
                f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "argv": argv,
                                    "seconds": round(time.monotonic() - start, 2)}) + "\n")
        return code

    subprocess.Popen.__init__, subprocess.Popen._wait = started, waited
