#!/bin/sh
# The service in the background, then the container's command.
python3 /opt/service/service.py > /tmp/service.log 2>&1 &
exec "$@"
