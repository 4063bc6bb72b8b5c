#!/bin/bash
set -e
python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8000/lookup?key=42").read().decode())' > /app/answer.txt
