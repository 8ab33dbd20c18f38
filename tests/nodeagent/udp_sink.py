"""A UDP listener for the routing tests, run inside a network namespace: binds 0.0.0.0 (a
free port, printed on stdout) and appends each datagram's payload, one per line, to the
file given as argv[1]."""
import socket
import sys


def main():
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("0.0.0.0", 0))
    print(listener.getsockname()[1], flush=True)
    while True:
        payload, _ = listener.recvfrom(2048)
        with open(sys.argv[1], "a") as log:
            log.write(payload.decode(errors="replace") + "\n")


if __name__ == "__main__":
    main()
