"""Item 5: writes reasons of its choice on the status pipe (fd 3) and exits with status 1:
it must not be able to pass as anything but a failed program."""

import contextlib
import os

for line in (b"syntax error\n", b"timeout\n", b"reference failed: sandbox error\n"):
    with contextlib.suppress(OSError):
        os.write(3, line)
os._exit(1)
