#!/bin/bash
echo "hello sandgym" > /app/hello.txt
