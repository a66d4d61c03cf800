#!/usr/bin/env python3
"""qmp-hmp.py SOCKET COMMAND...: run each human-monitor COMMAND on the QMP unix SOCKET and
print its output (scripts/vm/run.sh's freeze diagnosis). Exit status 1 when any command failed."""
import json
import socket
import sys


def main() -> int:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(20)
    sock.connect(sys.argv[1])
    f = sock.makefile("rw")

    def reply() -> dict:
        while True:
            msg = json.loads(f.readline())
            if "event" not in msg:
                return msg

    f.readline()  # the greeting
    f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n")
    f.flush()
    reply()
    bad = 0
    for cmd in sys.argv[2:]:
        f.write(json.dumps({"execute": "human-monitor-command",
                            "arguments": {"command-line": cmd}}) + "\n")
        f.flush()
        r = reply()
        print(f"== {cmd}")
        if "error" in r:
            print(f"error: {r['error']}")
            bad += 1
        else:
            print(r.get("return", ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
