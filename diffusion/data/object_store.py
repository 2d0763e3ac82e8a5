"""One object-storage operation through obstore, run as a script in a process of its own by `diffusion.data.prepared`.

Why a process of its own: obstore's Rust runtime is global to a process and does not survive a fork. A training
process or a prepare that once listed or read an `s3://` set through it, and then forked (DataLoader workers,
litdata's writers), left those children waiting on it for ever: a prepare to s3:// hung, and a run streamed from
it with loading processes never got its first batch. Done here, the runtime lives and dies in this process, and
litdata's own processes start theirs cleanly.

Imports nothing of the project (a script's start stays a fraction of a second). Request on stdin, answer on stdout,
both pickled: `(operation, url, argument, client_options, retry_config)` -> `("ok", result)`, `("missing", None)`
for a file that is not there, or `("unreachable", "ErrorType: what obstore said")`.
"""

import pickle
import sys
from typing import Any


def run(operation: str, url: str, argument: Any, client_options: dict, retry_config: dict) -> Any:
    import obstore
    from obstore.store import from_url

    # from_url's overloads are one per scheme, and the scheme is the user's.
    store = from_url(url, client_options=client_options, retry_config=retry_config)  # type: ignore[call-overload]
    if operation == "get":
        return bytes(obstore.get(store, argument).bytes())
    if operation == "put":
        name, data = argument
        obstore.put(store, name, data)
        return None
    if operation == "list":
        return {meta["path"]: meta["size"] for batch in obstore.list(store) for meta in batch}
    if operation == "delete":
        obstore.delete(store, argument)
        return None
    raise ValueError(f"unknown operation {operation!r}")


def main() -> None:
    from obstore.exceptions import BaseError, NotFoundError

    request = pickle.loads(sys.stdin.buffer.read())
    try:
        answer: tuple[str, Any] = ("ok", run(*request))
    except NotFoundError:
        answer = ("missing", None)
    except (BaseError, OSError, TimeoutError) as err:  # the store's answer, or none: the user's to fix
        answer = ("unreachable", f"{type(err).__name__}: {err}")
    sys.stdout.buffer.write(pickle.dumps(answer))


if __name__ == "__main__":
    main()
