#!/bin/bash
# A wrong solution: the verifier must give it reward 0.
echo "Goodbye, world!" > hello.txt
