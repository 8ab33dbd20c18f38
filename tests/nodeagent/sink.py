"""A TCP listener for the isolation tests, run inside a network namespace: accepts on
0.0.0.0 (a free port, printed on stdout), answers every connection with "pong\\n", reads
it to the end and appends the byte count to the file given as argv[1]."""
import socket
import sys
import threading


def serve(connection, log_path):
    received = 0
    with connection:
        try:
            connection.sendall(b"pong\n")
            while chunk := connection.recv(65536):
                received += len(chunk)
        except OSError:           # a probe that only connects may reset
            pass
    with open(log_path, "a") as log:
        log.write(f"{received}\n")


def main():
    listener = socket.create_server(("0.0.0.0", 0))
    print(listener.getsockname()[1], flush=True)
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=serve, args=(connection, sys.argv[1]), daemon=True).start()


if __name__ == "__main__":
    main()
