"""The `python` of warm.interpreter_folder(): `python ...` forked warm by the relay of the pytest worker that made the
folder, for commands that are not started by a test itself (bash's `python3 ...` in the GPU suite) or that a warm
command starts (`sys.executable train.py ...` in the benchmarks, the ranks Lightning's launcher starts).

Run as `<interpreter> -IS warm_client.py RELAY INTERPRETER ARGS...` (standard library only: it starts in
milliseconds). It sends the relay ARGS, its working directory, its environment and its standard output and error;
the relay forks the command from its worker's forkserver, in a session of its own. This process stands in for the
command: the signals it gets go on to the command, a SIGKILL of this process ends the command's process group (the
relay sees this end of the connection close), and it ends as the command ends, with its exit status or by the
signal that ended it. Standard input is /dev/null, as for every warm command. A command that is not
`python [-u] SCRIPT|-m MODULE|-c CODE ...`, or a relay that has gone (its worker ended), runs cold: this process
becomes INTERPRETER."""

import contextlib
import json
import os
import signal
import socket
import struct
import sys

PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def main() -> None:
    address, interpreter, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    relay = socket.socket(socket.AF_UNIX)
    try:
        relay.connect(address)
    except OSError:
        os.execv(interpreter, [interpreter, *args])
    # Held until the command's pid is known and the handlers pass them on: the command may be up (and its caller
    # signalling) before this process reads its pid, and a SIGINT then ended this process alone, leaving the
    # command running with the caller's pipe open (a test's communicate() waited for its timeout).
    signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_ON)
    request = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(relay, [struct.pack("!I", len(request))], [1, 2])
    relay.sendall(request)
    replies = relay.makefile("r")
    reply = json.loads(replies.readline() or '{"cold": "the relay ended"}')
    if "cold" in reply:
        relay.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)  # an exec'd process inherits the mask
        os.execv(interpreter, [interpreter, *args])
    command = reply["pid"]

    def pass_on(number: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):  # it has just ended
            os.kill(command, number)

    for number in PASSED_ON:
        signal.signal(number, pass_on)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)  # any that came meanwhile are passed on now
    line = replies.readline()
    if not line:
        sys.exit(f"warm_client: the relay ended before the command {args[:3]}")
    status = json.loads(line)["status"]
    if status < 0:  # ended by a signal: end by the same one
        if -status in PASSED_ON:
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
