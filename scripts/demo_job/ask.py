"""Asks the warm worker one question (a decision threshold) and prints its answer."""
import socket
import sys

conn = socket.create_connection(("127.0.0.1", 7000))
conn.sendall(sys.argv[1].encode())
print(conn.recv(65536).decode())
