"""A TCP listener for the isolation tests, run inside a network namespace: accepts on
0.0.0.0 (a free port, printed on stdout), reads every connection to the end and appends
its byte count to the file given as argv[1]. It never sends: a client closing with unread
data would reset the connection and cut what it sent."""
import socket
import sys
import threading


def serve(connection, log_path):
    received = 0
    with connection:
        try:
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
