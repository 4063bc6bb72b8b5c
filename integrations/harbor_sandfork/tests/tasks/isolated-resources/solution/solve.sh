#!/bin/bash
set -e
ls /sys/class/net > /root/interfaces.txt
