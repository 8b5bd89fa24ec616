"""The demo backend (tests/harness/backend.py) with TCP_NODELAY on its sockets.

backend.Handler writes a response's headers and body in two writes; on a
keep-alive connection Nagle's algorithm holds the second until the peer's
delayed ACK (~40 ms), so every short request takes 40+ ms. The scenario rig
measures how many requests are in flight at one instant: it needs the
short requests to be short.

Run: python -m tests.harness.nodelay_backend --port N
"""
import argparse

from tests.harness import backend


class Handler(backend.Handler):
    disable_nagle_algorithm = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    srv = backend.Server(("127.0.0.1", args.port), Handler)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
